"""The backend registry: a closed set of names, and only backends the model is packed for."""

from __future__ import annotations

from pathlib import Path

import pytest

from handler.backends.contract import create_backend
from handler.core.errors import ConfigError
from handler.core.manifest import load_manifest
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
