"""The backend registry: a name resolves to one spec (built-ins by their table, plugins by entry point), only
backends the model is packed for, a task and a backend that fit, and each backend's own settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from handler.backends import registry
from handler.backends.contract import IncompatibleBackendError, check_pairing, create_backend
from handler.core.config import Config
from handler.core.errors import ConfigError, ModelLoadError
from handler.core.manifest import load_manifest
from handler.runtime.invocation import Runtime
from infra.pack import pack_onnx
from tests.conftest import ROOT, start, write_tiny_onnx


@pytest.fixture
def onnx_only(tmp_path: Path) -> Path:
    write_tiny_onnx(tmp_path / "src.onnx")
    return pack_onnx(tmp_path / "src.onnx", tmp_path / "packed", "tiny", "1")


@pytest.mark.parametrize("name", ["tensorrt", "ONNX", "", "openvino", "onnx ", "pytorch"])
def test_unknown_backend_lists_valid_names(name: str) -> None:
    with pytest.raises(ConfigError, match="valid backends: onnx, torch") as info:
        registry.spec(name)
    assert repr(name) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_init_refuses_an_unknown_backend_listing_valid_ones(model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="unknown backend 'tensorrt'; valid backends: onnx, torch"):
        start(model_dir, "tensorrt")


def test_backend_the_model_is_not_packed_for(onnx_only: Path) -> None:
    with pytest.raises(ConfigError, match="not packed for backend 'torch'; it is packed for: onnx"):
        create_backend(registry.spec("torch"), load_manifest(onnx_only))


def test_init_refuses_a_backend_the_model_is_not_packed_for(onnx_only: Path) -> None:
    with pytest.raises(ConfigError, match="tiny@1"):
        start(onnx_only, "torch")


@pytest.mark.parametrize("name", ["onnx", "torch"])
def test_registry_returns_the_named_backend(name: str, model_dir: Path) -> None:
    backend = create_backend(registry.spec(name), load_manifest(model_dir))
    assert backend.name == name and registry.spec(name).module == type(backend).__module__


@pytest.mark.parametrize("fixture", ["onnx_runtime", "torch_runtime"])
def test_describe(fixture: str, request: pytest.FixtureRequest) -> None:
    facts = request.getfixturevalue(fixture).backend.describe()
    assert facts["backend"] == fixture.removesuffix("_runtime")
    assert facts["device"] in ("cpu", "cuda")
    assert facts["providers"]
    assert facts["threads"] >= 1
    if facts["device"] == "cpu":
        assert facts["device_reason"]  # why not CUDA, recorded


def hand_written_pack(model_dir: Path, where: Path) -> Path:
    """A pack made for the hand-written torch encoder (removed): its torch entry has weights and a config, no
    program (what `pack --default` wrote as "bert-mean-pooled", `pack --from` as "hf-encoder")."""
    where.mkdir()
    raw = json.loads((model_dir / "manifest.json").read_text())
    (where / "model.safetensors").symlink_to((model_dir / "model.safetensors").resolve())
    raw["backends"] = {
        "torch": {"weights": "model.safetensors", "files": ["model.safetensors"], "architecture": "hf-encoder"}
    }
    raw["default_backend"] = "torch"
    raw["files"] = {"model.safetensors": raw["files"]["model.safetensors"]}
    raw["tokenizer"] = {}
    raw["source"] = {"dir": "my-encoder"}
    (where / "manifest.json").write_text(json.dumps(raw))
    return where


def test_a_pack_for_the_hand_written_encoder_gets_one_line_naming_the_repack(model_dir: Path, tmp_path: Path) -> None:
    old = hand_written_pack(model_dir, tmp_path / "old")
    with pytest.raises(ModelLoadError) as info:
        start(old, "torch")
    message = str(info.value)
    assert "\n" not in message and str(old / "manifest.json") in message
    assert f"warmstart pack --from my-encoder --out {old} --force" in message


def test_a_task_and_a_backend_that_do_not_fit_fail_before_the_backend_is_imported(model_dir: Path) -> None:
    engine = registry.BackendSpec(name="engine", module="no_such_module_imported", needs="request")
    with pytest.raises(
        IncompatibleBackendError, match=r"backend 'engine' needs request .* task 'embedding' gives arrays"
    ):
        check_pairing("embedding", ("arrays",), engine)
    manifest = load_manifest(model_dir)
    manifest.backends["engine"] = {}
    with pytest.raises(IncompatibleBackendError):  # not ModuleNotFoundError: refused before the import
        create_backend(engine, manifest)
    check_pairing("chat", ("request",), engine)  # an engine's task: fits
    with pytest.raises(ConfigError, match="gives 'tokens'; valid: arrays, request"):
        check_pairing("chat", ("tokens",), engine)  # type: ignore[arg-type]


ENGINES = """
class Engine:
    name = "engine"

    def submit(self, request):
        return {"echo": request}


class NotAnEngine:
    name = "engine"

    def run(self, feeds):
        return feeds


def create():
    return Engine()


def create_wrong():
    return NotAnEngine()
"""


def test_a_request_engine_is_created_for_a_task_that_gives_the_request_and_checked_for_submit(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fake_engine.py").write_text(ENGINES)
    monkeypatch.syspath_prepend(str(tmp_path))
    manifest = load_manifest(model_dir)
    manifest.backends["engine"] = {}
    engine = registry.BackendSpec(name="engine", module="fake_engine", needs="request")
    made = create_backend(engine, manifest, ("arrays", "request"))
    assert made.submit({"prompt": "hi"}) == {"echo": {"prompt": "hi"}}  # type: ignore[attr-defined]
    import fake_engine  # type: ignore[import-not-found]

    monkeypatch.setattr(fake_engine, "create", fake_engine.create_wrong)
    with pytest.raises(ConfigError, match=r"backend 'engine' needs request but NotAnEngine has no submit\(\)"):
        create_backend(engine, manifest, ("request",))


def test_a_spec_with_an_unknown_need_is_refused() -> None:
    with pytest.raises(ConfigError, match="needs 'tokens'; valid: arrays, request"):
        registry.BackendSpec(name="x", module="x", needs="tokens")  # type: ignore[arg-type]


def test_onnx_runtime_switches_belong_to_its_spec_and_parse_like_every_setting() -> None:
    # `WARMSTART_ORT_PREPACK=false` once kept prepacking on: only "0" turned it off.
    onnx = registry.spec("onnx")
    off = {"WARMSTART_ORT_PREPACK": "false", "WARMSTART_ORT_OPTIMIZED": "Off", "WARMSTART_ORT_IOBINDING": "yes"}
    s = onnx.own_settings(off)
    assert (s.prepack, s.optimized, s.iobinding) == (False, False, True)
    s = onnx.own_settings({})
    assert (s.prepack, s.optimized, s.iobinding) == (True, True, None)
    for key in off:
        with pytest.raises(ConfigError, match=f"{key}='maybe'; valid values: 1, 0, true"):
            onnx.own_settings({key: "maybe"})
    assert registry.spec("torch").own_settings(off) is None  # not torch's business


def test_init_refuses_a_bad_onnx_runtime_switch(model_dir: Path) -> None:
    config = Config(model_dir=model_dir, backend="onnx")
    with pytest.raises(ConfigError, match="WARMSTART_ORT_PREPACK='maybe'"):
        Runtime.start(config, environ={"WARMSTART_ORT_PREPACK": "maybe"}, emit=None)


SPEC_PROBE = """
import json, sys
from handler.backends import registry
for name in registry.BUILTIN_BACKENDS:
    registry.spec(name)
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & {"numpy", "onnxruntime", "torch", "tokenizers"})
                 + sorted(m for m in sys.modules if m == "importlib.metadata")))
"""


def test_specs_import_nothing_heavy_and_built_ins_read_no_entry_points() -> None:
    # The prefetch reads a spec before numpy is imported; a built-in name never pays importlib.metadata (~28 ms).
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMSTART_")}
    out = subprocess.run([sys.executable, "-c", SPEC_PROBE], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


INIT_PROBE = "import json, sys, handler.app\nprint(json.dumps('importlib.metadata' in sys.modules))"


def test_a_built_in_only_init_never_imports_importlib_metadata(model_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMSTART_")}
    env.update(WARMSTART_MODEL=str(model_dir), WARMSTART_BACKEND="onnx", WARMSTART_WARMUP="0")
    out = subprocess.run([sys.executable, "-c", INIT_PROBE], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "false"


@pytest.mark.parametrize(
    ("quantization", "machine", "flags", "refused"),
    [
        ({"operator": "MatMulIntegerToFloat", "weight_bits": 8}, "x86_64", {"avx2", "fma"}, True),
        ({"operator": "MatMulIntegerToFloat", "weight_bits": 8}, "x86_64", {"avx2", "avx_vnni"}, False),
        ({"operator": "MatMulIntegerToFloat", "weight_bits": 8}, "x86_64", {"avx512f", "avx512_vnni"}, False),
        ({"operator": "MatMulIntegerToFloat", "weight_bits": 8}, "x86_64", {"amx_tile", "amx_int8"}, False),
        ({"operator": "MatMulIntegerToFloat", "weight_bits": 7}, "x86_64", {"avx2"}, False),  # inside int16
        ({"operator": "MatMulIntegerToFloat"}, "x86_64", {"avx2"}, False),  # packs before the field: 7 bits
        ({"operator": "MatMulIntegerToFloat", "weight_bits": 8}, "aarch64", {"asimd"}, False),  # int32 dot
        ({"operator": "MatMulNBits", "block_size": 32}, "x86_64", {"avx2"}, False),  # int8-block
        (None, "x86_64", set(), False),  # float32
    ],
)
def test_which_cpus_an_int8_pack_is_refused_on(quantization: Any, machine: str, flags: set[str], refused: bool) -> None:
    from handler.backends.fingerprint import int8_refusal

    assert (int8_refusal(quantization, machine, flags) is not None) is refused


def test_an_image_text_packs_int8_record_is_read_from_its_gate() -> None:
    """Image-text packs record their towers' int8 scheme once, in precision.quality (infra.pack.image_int8)."""
    from types import SimpleNamespace

    from handler.backends.ort import quantization

    record = {"operator": "MatMulIntegerToFloat", "weight_bits": 8}
    tower = SimpleNamespace(backends={"onnx": {}}, raw={"precision": {"quality": {"quantization": record}}})
    text = SimpleNamespace(backends={"onnx": {"quantization": record}}, raw={})
    plain = SimpleNamespace(backends={"onnx": {}}, raw={"precision": {"dtype": "float32", "quantization": None}})
    assert quantization(tower) == record and quantization(text) == record and quantization(plain) is None  # type: ignore[arg-type]
