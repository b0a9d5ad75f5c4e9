"""Which decoder the generate engine opens when a pack carries the Q4MatMul graph (handler.backends.genai_load,
handler.backends.q4lib), and what the start prefetches of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from handler.backends import q4lib
from handler.backends.genai_load import Q4, choose_q4, start_files
from handler.backends.genai_spec import GenaiSettings
from handler.core.errors import ConfigError

RANGES = {"model.onnx.data": [[0, 8192]]}
ENTRY: dict[str, Any] = {
    "files": ["genai_config.json", "model.onnx", "model.onnx.data", "tokenizer.json"],
    "layout": {"page": 4096, "ranges": RANGES},
    "q4": {"model": "model.q4.onnx", "files": ["model.q4.onnx"], "graph_optimization_level": "ORT_DISABLE_ALL"},
}


@pytest.fixture
def library(tmp_path: Path) -> Path:
    path = tmp_path / "libws_q4.so"
    path.write_bytes(b"\x7fELF")  # choose_q4 only checks that it exists; loading is the session's
    return path


def test_the_q4_decoder_is_chosen_where_the_library_is(library: Path) -> None:
    chosen, report = choose_q4(ENTRY, "auto", str(library))
    assert chosen == Q4("model.q4.onnx", str(library), "ORT_DISABLE_ALL")
    assert report["used"] is True and report["graph_passes"] == "ORT_DISABLE_ALL"


@pytest.mark.parametrize(
    ("entry", "mode", "cuda", "reason"),
    [
        ({k: v for k, v in ENTRY.items() if k != "q4"}, "auto", False, "not packed"),
        (ENTRY, "off", False, "WARMSTART_GENAI_Q4=off"),
        (ENTRY, "auto", True, "CUDA"),
    ],
)
def test_the_q4_decoder_is_not_chosen_and_the_report_says_why(
    library: Path, entry: dict[str, Any], mode: str, cuda: bool, reason: str
) -> None:
    chosen, report = choose_q4(entry, mode, str(library), cuda)
    assert chosen is None and report["used"] is False and reason in report["reason"]


def test_without_a_built_library_the_q4_decoder_is_not_chosen(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(q4lib, "LIBRARY", tmp_path / "absent.so")
    chosen, report = choose_q4(ENTRY, "auto")
    assert chosen is None and "not built" in report["reason"]


def test_a_named_library_that_is_not_there_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="WARMSTART_Q4_LIBRARY"):
        GenaiSettings.from_environ({q4lib.ENV_LIBRARY: str(tmp_path / "nope.so")})


def test_the_mode_is_a_closed_set() -> None:
    with pytest.raises(ConfigError, match="valid values: auto, off"):
        GenaiSettings.from_environ({q4lib.ENV: "on"})
    assert GenaiSettings.from_environ({q4lib.ENV: " OFF "}).q4 == "off"


def test_the_start_reads_the_q4_graph_and_the_portable_data_ranges(library: Path) -> None:
    names, ranges = start_files(ENTRY, {q4lib.ENV_LIBRARY: str(library)})
    assert names == ["genai_config.json", "model.q4.onnx", "model.onnx.data", "tokenizer.json"]
    assert ranges == RANGES
    names, _ = start_files(ENTRY, {q4lib.ENV_LIBRARY: str(library), q4lib.ENV: "off"})
    assert "model.onnx" in names and "model.q4.onnx" not in names


def test_the_overlay_loads_the_library_with_the_proved_graph_passes(library: Path) -> None:
    from handler.backends.genai import overlay

    session = json.loads(overlay(1, "model.q4.onnx", Q4("model.q4.onnx", str(library), "ORT_DISABLE_ALL")))
    options = session["model"]["decoder"]["session_options"]
    assert options["custom_ops_library"] == str(library)
    assert options["graph_optimization_level"] == "ORT_DISABLE_ALL"
    session = json.loads(overlay(1, "model.q4.onnx", Q4("model.q4.onnx", str(library), "all")))
    assert "graph_optimization_level" not in session["model"]["decoder"]["session_options"]


def test_the_build_writes_a_library_that_exports_the_registration(tmp_path: Path) -> None:
    import ctypes

    out = q4lib.build(tmp_path / "lib" / "libws_q4.so")
    lib = ctypes.CDLL(str(out))
    assert hasattr(lib, "RegisterCustomOps")
    assert [p.name for p in out.parent.iterdir()] == ["libws_q4.so"]  # nothing half-written left beside it


def test_genai_is_not_handed_a_library_outside_its_allowed_folders(
    library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnxruntime-genai 0.18 loads a custom op library only from under the working directory or the model's
    folder; elsewhere the Q4 decoder is not tried (a load that would fail), and the report says why."""
    pack = tmp_path / "pack"
    pack.mkdir()
    monkeypatch.chdir(pack)
    chosen, report = choose_q4(ENTRY, "auto", str(library), root=pack)
    assert chosen is None and "would refuse the library" in report["reason"]
    inside = pack / "libws_q4.so"
    inside.write_bytes(b"\x7fELF")
    assert choose_q4(ENTRY, "auto", str(inside), root=pack)[0] is not None  # under the pack's folder
    monkeypatch.chdir(tmp_path)
    assert choose_q4(ENTRY, "auto", str(library), root=pack)[0] is not None  # under the working directory
    assert choose_q4(ENTRY, "auto", str(library))[0] is not None  # the batch engine (ONNX Runtime) has no such rule


def test_the_start_path_imports_no_build_machinery() -> None:
    """q4lib is read on every generate start (the prefetch's plan, the engine's choice): its build's imports
    (subprocess, tempfile and the shutil it imports, argparse) wait for a build."""
    import subprocess
    import sys

    code = "import sys, handler.backends.genai_spec; print(sorted(m for m in {}.split() if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code.format(repr("subprocess tempfile shutil argparse"))],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"
