"""A generate pack laid out for loading (infra.pack.lm_layout): its weights at page offsets with the ranges a start
reads recorded, and the prepacked decoder opened only where it was made (handler.backends.genai_load), kept only
when it answers exactly as the portable one, and never a wrong answer when it is bad.

One tiny pack (tests/fixtures/genai_pack.py's cached qwen3, shared with test_generate and the clients' tests) is
laid out once; each test copies what it changes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import numpy_helper

from handler.backends import genai_load
from handler.backends.genai_spec import SPEC, GenaiSettings
from handler.core.config import Config
from handler.core.errors import ConfigError, ModelLoadError
from handler.core.manifest import load_manifest, verify_sha256
from handler.runtime import prefetch
from handler.runtime.invocation import Runtime
from infra.pack import lm_layout
from tests.fixtures.genai_pack import cached_genai_pack

REQUEST = {"prompt": "hello world the quick brown fox", "max_tokens": 8, "temperature": 0}


def start(model: Path, **environ: str) -> Runtime:
    return Runtime.start(Config(model_dir=model, backend=None, warmup=False), environ=environ, emit=None)


def answer(runtime: Runtime) -> list[int]:
    return [t for piece in runtime.task.stream(dict(REQUEST)) for t in piece["token_ids"]]  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def portable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cached_genai_pack(tmp_path_factory.mktemp("genai"), "qwen3")


@pytest.fixture(scope="module")
def reference(portable: Path) -> list[int]:
    """The builder's own pack's greedy answer: what every layout must give."""
    return answer(start(portable))


@pytest.fixture(scope="module")
def laid(portable: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("laid") / "pack"
    shutil.copytree(portable, out)
    return out, lm_layout.relayout(out, optimize=True)


def copy(laid: tuple[Path, dict[str, Any]], dest: Path) -> Path:
    shutil.copytree(laid[0], dest / "pack")
    return dest / "pack"


def _tensors(model: Path) -> dict[str, Any]:
    return {
        t.name: numpy_helper.to_array(t, base_dir=str(model.parent)) for t in onnx.load(str(model)).graph.initializer
    }


def _spans(model: Path) -> list[tuple[int, int]]:
    graph = onnx.load(str(model), load_external_data=False).graph
    out = []
    for t in graph.initializer:
        info = {e.key: e.value for e in t.external_data}
        packed = [v.split("|", 1)[1].split(";")[:2] for k, v in info.items() if k.startswith("prepacked")]
        out += [(int(o), int(n)) for o, n in packed] or ([(int(info["offset"]), int(info["length"]))] if info else [])
    return out


def test_weights_are_page_aligned_the_same_and_their_ranges_recorded(
    portable: Path, laid: tuple[Path, dict[str, Any]]
) -> None:
    pack, result = laid
    assert lm_layout.aligned(portable / "model.onnx"), "the builder's layout is packed end to end: nothing to prove"
    assert lm_layout.aligned(pack / "model.onnx") == []
    before, after = _tensors(portable / "model.onnx"), _tensors(pack / "model.onnx")
    assert before.keys() == after.keys()
    assert all((before[n] == after[n]).all() and before[n].dtype == after[n].dtype for n in before)
    manifest = load_manifest(pack)
    verify_sha256(manifest)  # the rewritten files' sizes and digests are the manifest's
    entry = manifest.backends["genai"]
    assert entry["layout"] == result["layout"] and entry["layout"]["page"] == 4096
    for data, model in (("model.onnx.data", "model.onnx"), ("model.opt.onnx.data", "model.opt.onnx")):
        ranges = (entry["layout"] if data == "model.onnx.data" else entry["optimized"])["ranges"][data]
        assert all(o % 4096 == 0 for o, _ in ranges), ranges
        size = (pack / data).stat().st_size
        assert all(o + n <= size for o, n in ranges)
        # Every tensor a session reads (the optimized one's: the prepacked copies, not their originals) lies in a
        # recorded range (the tiny model has no embedding table large enough to be left out).
        covered = [s for s in _spans(pack / model) if any(o <= s[0] and s[0] + s[1] <= o + n for o, n in ranges)]
        assert covered, model
    optimized = entry["optimized"]
    assert optimized["prepacked"] > 0 and optimized["unaligned_tensors"] == 0
    assert optimized["onnxruntime"] == genai_load.ort_version()


def test_the_optimized_decoder_is_opened_here_and_answers_as_the_builders(
    laid: tuple[Path, dict[str, Any]], reference: list[int]
) -> None:
    runtime = start(laid[0])
    described = runtime.backend.describe()  # type: ignore[attr-defined]
    assert described["optimized"]["used"] is True, described["optimized"]
    assert runtime.init_report["coldstart"]["genai_optimized"]["used"] is True
    assert answer(runtime) == reference
    off = start(laid[0], WARMSTART_GENAI_OPTIMIZED="off")
    assert off.backend.describe()["optimized"] == {"used": False, "reason": "off (WARMSTART_GENAI_OPTIMIZED=off)"}  # type: ignore[attr-defined]
    assert answer(off) == reference


def test_a_bad_switch_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError, match="WARMSTART_GENAI_OPTIMIZED='always'; valid values: auto, off"):
        GenaiSettings.from_environ({"WARMSTART_GENAI_OPTIMIZED": "always"})


@pytest.mark.parametrize(
    ("key", "value"), [("onnxruntime", "1.0.0"), ("cpu_features", ["avx512f", "sse4_1"]), ("arch", "aarch64")]
)
def test_made_for_another_ort_or_cpu_serves_the_portable_model(
    laid: tuple[Path, dict[str, Any]], reference: list[int], tmp_path: Path, key: str, value: Any
) -> None:
    pack = copy(laid, tmp_path)
    raw = json.loads((pack / "manifest.json").read_text())
    raw["backends"]["genai"]["optimized"][key] = value  # the manifest is not among its own files
    (pack / "manifest.json").write_text(json.dumps(raw))
    runtime = start(pack)
    line = runtime.init_report["coldstart"]["genai_optimized"]
    assert line["used"] is False and line["reason"].startswith(f"made for another target: {key} "), line
    assert runtime.backend.describe()["optimized"] == line  # type: ignore[attr-defined]
    assert answer(runtime) == reference
    # ... and the start's prefetch reads the portable model's files, not the optimized ones.
    names, ranges = SPEC.files(raw["backends"]["genai"], {})
    assert names == ["genai_config.json", "model.onnx", "model.onnx.data"]
    assert ranges == raw["backends"]["genai"]["layout"]["ranges"]


def test_the_prefetch_reads_the_optimized_decoder_where_init_opens_it(laid: tuple[Path, dict[str, Any]]) -> None:
    pack = laid[0]
    entry = load_manifest(pack).backends["genai"]
    items = dict(prefetch.plan({"WARMSTART_MODEL": str(pack)}, libs=False))
    assert list(items) == [pack / n for n in ("genai_config.json", "model.opt.onnx", "model.opt.onnx.data")] + [
        pack / "tokenizer.json"
    ]
    assert items[pack / "model.opt.onnx.data"] == entry["optimized"]["ranges"]["model.opt.onnx.data"]
    off = dict(prefetch.plan({"WARMSTART_MODEL": str(pack), "WARMSTART_GENAI_OPTIMIZED": "off"}, libs=False))
    assert off[pack / "model.onnx.data"] == entry["layout"]["ranges"]["model.onnx.data"]


def test_a_copy_that_does_not_reproduce_the_portable_model_is_dropped(
    laid: tuple[Path, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pack = copy(laid, tmp_path)
    real = lm_layout.greedy

    def one_token_off(model_dir: Path, decoder: str | None, prompts: Any, threads: int) -> Any:
        out = real(model_dir, decoder, prompts, threads)
        if decoder is not None:  # the optimized decoder's last probe picks another token
            tokens, logits = out[-1]
            out[-1] = ([*tokens[:-1], tokens[-1] + 1], logits)
        return out

    monkeypatch.setattr(lm_layout, "greedy", one_token_off)
    result = lm_layout.relayout(pack, optimize=True)
    assert result["optimized"] is None and "probe 2: greedy tokens" in result["optimized_reason"]
    manifest = load_manifest(pack)
    assert "optimized" not in manifest.backends["genai"]
    assert not (pack / "model.opt.onnx").exists() and "model.opt.onnx" not in manifest.files
    assert not [p for p in pack.iterdir() if p.name.startswith(".")]  # no work left behind
    assert start(pack).backend.describe()["optimized"]["used"] is False  # type: ignore[attr-defined]


def test_a_corrupt_optimized_decoder_falls_back_or_is_refused(
    laid: tuple[Path, dict[str, Any]], reference: list[int], tmp_path: Path
) -> None:
    garbled = copy(laid, tmp_path / "garbled")
    graph = garbled / "model.opt.onnx"
    graph.write_bytes(b"\xff" * graph.stat().st_size)  # same size: the manifest's check passes, the load fails
    runtime = start(garbled)
    line = runtime.backend.describe()["optimized"]  # type: ignore[attr-defined]
    assert line["used"] is False and line["reason"].startswith("load failed: "), line
    assert answer(runtime) == reference
    truncated = copy(laid, tmp_path / "truncated")
    with open(truncated / "model.opt.onnx.data", "r+b") as f:
        f.truncate(4096)
    with pytest.raises(ModelLoadError, match=r"model.opt.onnx.data: size 4096 bytes, manifest says"):
        start(truncated)
