"""Shared fixtures: the packed default model, one runtime per backend per session, a tiny tensor model.

Runtimes are session-scoped because init is the expensive part (torch's import alone is seconds); a test
that needs a fresh instance (cold pings, small limits) starts its own with `warmup=False`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from handler.core.config import Config
from handler.core.records import replace
from handler.runtime.invocation import Runtime
from infra.pack import pack_default, pack_onnx

ROOT = Path(__file__).resolve().parent.parent
EVENTS = Path(__file__).resolve().parent / "events"
DEFAULT_MODEL = ROOT / "models" / "default"
MODEL_KEY = "all-minilm-l6-v2@0.1.0"
DIM = 384


@pytest.fixture(scope="session")
def model_dir() -> Path:
    if not (DEFAULT_MODEL / "manifest.json").is_file():
        pack_default(DEFAULT_MODEL, force=True)
    return DEFAULT_MODEL


def portable_copy(model_dir: Path, out: Path) -> Path:
    """`out`: the default pack's portable ONNX model alone (files symlinked; no optimized copy, no tokenizer
    shortcut, onnx the only backend), for a test to optimize as `make setup` does."""
    out.mkdir()
    for name in ("model.onnx", "model.onnx.data", "tokenizer.json"):
        (out / name).symlink_to((model_dir / name).resolve())
    raw = json.loads((model_dir / "manifest.json").read_text())
    raw["backends"] = {"onnx": {k: v for k, v in raw["backends"]["onnx"].items() if k != "optimized"}}
    raw["default_backend"] = "onnx"
    raw["tokenizer"].pop("shortcut", None)
    raw["files"] = {k: v for k, v in raw["files"].items() if k in ("model.onnx", "model.onnx.data", "tokenizer.json")}
    (out / "manifest.json").write_text(json.dumps(raw))
    return out


def start(model: Path, backend: str | None = None, **settings: Any) -> Runtime:
    """A runtime over `model` with no init report printed and an empty environment."""
    return Runtime.start(Config(model_dir=model, backend=backend, **settings), environ={}, emit=None)


@pytest.fixture(scope="session")
def onnx_runtime(model_dir: Path) -> Runtime:
    return start(model_dir, "onnx")


@pytest.fixture(scope="session")
def torch_runtime(model_dir: Path) -> Runtime:
    return start(model_dir, "torch")


@pytest.fixture(scope="session")
def new_runtime(model_dir: Path) -> Callable[..., Runtime]:
    """A fresh onnx instance over the default model (no warm-up: cheap), with Config overrides."""

    def make(**settings: Any) -> Runtime:
        settings.setdefault("warmup", False)
        return start(model_dir, "onnx", **settings)

    return make


@pytest.fixture(scope="session")
def load_event() -> Callable[[str], Any]:
    """A fresh copy of `tests/events/<name>` (tests may mutate what they get)."""
    cache: dict[str, Any] = {}

    def load(name: str) -> Any:
        if name not in cache:
            cache[name] = json.loads((EVENTS / name).read_text())
        return copy.deepcopy(cache[name])

    return load


def event_names() -> list[str]:
    return sorted(p.name for p in EVENTS.glob("*.json"))


class FakeContext:
    """The one method of Lambda's context object the shim uses."""

    def __init__(self, remaining_ms: int) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def write_tiny_onnx(path: Path, out_dim: int = 4, seed: int = 0) -> tuple[npt.NDArray[np.float32], ...]:
    """x float32 [batch, 3], k int64 [batch] → y = x @ W + b (float32 [batch, out_dim]), z = k * 2.

    Returns (W, b) so tests can compute the expected outputs.
    """
    from onnx import TensorProto, helper, numpy_helper, save_model

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((3, out_dim)).astype(np.float32)
    b = rng.standard_normal(out_dim).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["y"]),
            helper.make_node("Mul", ["k", "two"], ["z"]),
        ],
        "tiny",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
            helper.make_tensor_value_info("k", TensorProto.INT64, ["batch"]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", out_dim]),
            helper.make_tensor_value_info("z", TensorProto.INT64, ["batch"]),
        ],
        [
            numpy_helper.from_array(w, "W"),
            numpy_helper.from_array(b, "b"),
            numpy_helper.from_array(np.array(2, np.int64), "two"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    save_model(model, str(path))
    return w, b


@dataclass(frozen=True)
class TinyModel:
    dir: Path
    W: npt.NDArray[np.float32]
    b: npt.NDArray[np.float32]
    runtime: Runtime

    def expected(self, x: npt.ArrayLike, k: npt.ArrayLike) -> dict[str, npt.NDArray[Any]]:
        x32 = np.asarray(x, np.float32)
        return {"y": x32 @ self.W + self.b, "z": np.asarray(k, np.int64) * 2}


@pytest.fixture
def tiny_tensor_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., TinyModel]:
    """Factory: build the tiny ONNX model, pack it with `pack_onnx`, start a runtime over it."""

    def make(out_dim: int = 4, **settings: Any) -> TinyModel:
        tmp = tmp_path_factory.mktemp("tiny")
        w, b = write_tiny_onnx(tmp / "tiny.onnx", out_dim)
        packed = pack_onnx(tmp / "tiny.onnx", tmp / "packed", "tiny", "1.0")
        config = replace(Config(model_dir=packed, backend=None), **settings)
        return TinyModel(packed, w, b, Runtime.start(config, environ={}, emit=None))

    return make


def http_v2_event(path: str, body: Any) -> dict[str, Any]:
    """A minimal HTTP API (payload 2.0) / Function URL POST of a JSON body to `path` on the default stage."""
    return {
        "version": "2.0",
        "rawPath": path,
        "requestContext": {"http": {"method": "POST", "path": path}, "stage": "$default"},
        "body": json.dumps(body),
        "isBase64Encoded": False,
    }


def invoke(runtime: Runtime, event: Any, context: Any = None) -> Any:
    """What the Lambda entry point hands awslambdaric (JSON bytes, which it posts as they are), as a client reads
    it: the direct answer, or the HTTP source's response with its body string."""
    return json.loads(runtime.lambda_reply(event, context))
