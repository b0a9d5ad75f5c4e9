"""A lean start (handler.core.numpy_gate): a Lambda on-demand start of the default embedding model answers without
numpy (ids as `array('q')` into ONNX Runtime's C API, the float32 output's bytes written by handler.core.f32), with
the numpy path's very bytes; a request the lean path does not serve imports numpy; once numpy's background import
has finished, requests take the numpy path, with the same bytes again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from handler.core import numpy_gate
from handler.core.errors import ModelOutputError
from handler.core.f32 import F32Rows
from handler.runtime import prefetch
from handler.runtime.invocation import Runtime
from tests.conftest import ROOT, http_v2_event

HARD = [
    "",
    " ",
    "\n\t",
    "naïve café, Straße",
    "日本語のテキストと中文",
    "emoji 👩‍💻🚀 and e\u0301",
    "[CLS] [SEP] [PAD] [MASK] [UNK]",
]
LONG = "word " * 3000  # far past the 256-token truncation
REQUESTS: list[dict[str, Any]] = [
    {"inputs": "hello world"},
    {"inputs": ["a", "a somewhat longer second text, so the batch is padded", "third"]},
    {"inputs": HARD},  # padded to its longest
    {"inputs": LONG},
    {"inputs": ""},
    {"inputs": [f"t{i} " * (i % 5 + 1) for i in range(32)]},
    {"inputs": ["a query"], "prompt": "query: "},
    {"inputs": ["a"], "encoding_format": "float", "dimensions": None},
]


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Lean from `begin()` until `need()`: numpy's background import (started by each lean answer) held back."""
    numpy_gate.reset()
    monkeypatch.setattr(numpy_gate, "load_later", lambda: False)
    yield
    numpy_gate.reset()


@pytest.fixture(scope="module")
def rt(new_runtime: Callable[..., Runtime]) -> Runtime:
    return new_runtime()


def replies(rt: Runtime, requests: list[dict[str, Any]]) -> list[bytes]:
    return [rt.lambda_reply(r) for r in requests]


def test_lean_answers_are_the_numpy_paths_bytes(rt: Runtime, gate: None) -> None:
    numpy_gate.begin()
    lean = replies(rt, REQUESTS)
    assert numpy_gate.lean()  # every request above served without numpy (none called `need`)
    assert isinstance(rt.handle({"inputs": "x"})["embeddings"], F32Rows)
    numpy_gate.need()
    assert not numpy_gate.lean()
    assert not isinstance(rt.handle({"inputs": "x"})["embeddings"], F32Rows)
    assert replies(rt, REQUESTS) == lean


def test_lean_runs_split_as_the_numpy_paths_runs(new_runtime: Callable[..., Runtime], gate: None) -> None:
    small = new_runtime(batch_tokens=40, batch_tokens_set=True)  # several model runs per request
    texts = {"inputs": [f"run {i} " * (i % 9 + 1) for i in range(12)]}
    numpy_gate.begin()
    lean = small.lambda_reply(texts)
    assert numpy_gate.lean()
    numpy_gate.need()
    assert small.lambda_reply(texts) == lean


def test_the_background_import_switches_over_with_the_same_bytes(
    rt: Runtime, gate: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    numpy_gate.begin()
    before = replies(rt, REQUESTS[:2])
    monkeypatch.undo()  # the real load_later from here
    assert numpy_gate.load_later() and not numpy_gate.load_later()  # once
    assert numpy_gate.wait(60)
    assert not numpy_gate.lean()
    assert replies(rt, REQUESTS[:2]) == before


@pytest.mark.parametrize("options", [{"dimensions": 8}, {"encoding_format": "base64"}])
def test_a_request_the_lean_path_does_not_serve_imports_numpy(rt: Runtime, gate: None, options: dict[str, Any]) -> None:
    request = {"inputs": ["hello", "world"], **options}
    numpy_gate.begin()
    lean = rt.lambda_reply(request)
    assert not numpy_gate.lean()
    assert rt.lambda_reply(request) == lean


def test_a_native_http_event_is_lean_and_a_compatible_route_imports_numpy(rt: Runtime, gate: None) -> None:
    numpy_gate.begin()
    native = rt.lambda_reply(http_v2_event("/", {"inputs": ["hello", "world"]}))
    assert numpy_gate.lean()
    openai = rt.lambda_reply(http_v2_event("/v1/embeddings", {"input": ["hello", "world"], "model": "m"}))
    assert not numpy_gate.lean()
    assert json.loads(openai)["statusCode"] == 200
    assert rt.lambda_reply(http_v2_event("/", {"inputs": ["hello", "world"]})) == native


def test_a_non_finite_output_is_refused_as_the_numpy_path_refuses_it(
    rt: Runtime, gate: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend: Any = rt.task.backend
    real = backend.run_buffers

    def poisoned(feeds: Any) -> Any:
        out = real(feeds)
        dtype, dims, raw = out["sentence_embedding"] if "sentence_embedding" in out else next(iter(out.values()))
        values = array("f", raw)
        values[1] = float("nan")
        return {name: (dtype, dims, values.tobytes()) for name in out}

    monkeypatch.setattr(backend, "run_buffers", poisoned)
    numpy_gate.begin()
    with pytest.raises(ModelOutputError, match=r"1 of 384 values are NaN or infinite \(the first at \[0, 1\]: nan\)"):
        rt.handle({"inputs": "hello"})


def test_a_backend_that_cannot_run_without_numpy_takes_the_numpy_path(
    rt: Runtime, gate: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = rt.lambda_reply({"inputs": "hello"})
    monkeypatch.setattr(rt.task.backend, "run_buffers", lambda feeds: None)  # as where the binding serves
    numpy_gate.begin()
    assert rt.lambda_reply({"inputs": "hello"}) == want
    assert not numpy_gate.lean()


ENV = {"AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand"}


@pytest.mark.parametrize(
    ("env", "lean"),
    [
        (ENV, True),
        ({}, False),  # no type: init warms up (the numpy path)
        ({**ENV, "WARMSTART_WARMUP": "1"}, False),
        ({"WARMSTART_WARMUP": "0"}, False),  # no Lambda runtime: the HTTP host, numpy's path
        ({"AWS_LAMBDA_RUNTIME_API": "127.0.0.1:9001", "WARMSTART_WARMUP": "0"}, True),
        ({"AWS_LAMBDA_INITIALIZATION_TYPE": "snap-start", "WARMSTART_WARMUP": "0"}, False),
        ({**ENV, "WARMSTART_LEAN_START": "0"}, False),
        ({**ENV, "WARMSTART_BACKEND": "torch"}, False),
        ({**ENV, "WARMSTART_LEAN_START": "maybe"}, False),  # and init refuses it (below)
    ],
)
def test_which_starts_are_lean(
    model_dir: Path, env: dict[str, str], lean: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prefetch, "_started", None)  # planned from `env`, not from this process's own start
    monkeypatch.setattr(numpy_gate, "_refused", False)  # nor from an HTTP host an earlier test built here
    environ = {"WARMSTART_MODEL": str(model_dir), **env}
    assert prefetch.lean_start(environ) is lean
    assert prefetch.numpy_at_start(environ=environ) is (not lean)
    libraries = [p.name for p, _ in prefetch.plan(environ) if p.suffix != ".onnx"]
    assert any("multiarray" in name for name in libraries) is (not lean)


def test_a_lean_start_setting_init_cannot_read_is_refused() -> None:
    from handler.core.config import Config
    from handler.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"WARMSTART_LEAN_START='maybe'; valid values: 1, 0"):
        Config.from_environ({"WARMSTART_LEAN_START": "maybe"})
    assert not Config.from_environ({"WARMSTART_LEAN_START": "off"}).lean_start


CODE = """
import json, sys
from handler.core import numpy_gate
at_answer = []
load_later = numpy_gate.load_later
def spy():
    at_answer.append("numpy" in sys.modules)
    return load_later()
numpy_gate.load_later = spy
import handler.app
first = handler.app.lambda_handler({"inputs": ["hello world", "a second text"]}, None)
assert numpy_gate.wait(60)
second = handler.app.lambda_handler({"inputs": ["hello world", "a second text"]}, None)
print(json.dumps([at_answer, numpy_gate.lean(), "numpy" in sys.modules, first == second]))
"""


def test_a_lambda_start_answers_without_numpy_then_imports_it(model_dir: Path) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("WARMSTART_", "AWS_"))}
    env = {**base, "WARMSTART_MODEL": str(model_dir), "AWS_LAMBDA_FUNCTION_NAME": "test", **ENV}
    proc = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    # numpy not imported when the first answer was made; imported after it; the numpy path's answer is the same
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [[False], False, True, True]


def test_a_refused_process_never_starts_lean(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The HTTP host refuses before init (handler.http_host.server): under a Lambda runtime API too, its compatible
    # routes once got the lean answer's rows (`'F32Rows' object is not iterable`, a 500 on /v1/embeddings).
    monkeypatch.setattr(prefetch, "_started", None)
    environ = {"WARMSTART_MODEL": str(model_dir), **ENV}
    numpy_gate.reset()
    try:
        numpy_gate.refuse()
        assert not prefetch.lean_start(environ)
        assert prefetch.numpy_at_start(environ=environ)  # handler.app imports numpy first, as before
    finally:
        numpy_gate.reset()
    assert prefetch.lean_start(environ)  # reset: a later start may be lean again
