"""The real runtime client (`python -m awslambdaric handler.app.lambda_handler`) against a Runtime API stub."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from handler.api.encode import dumps
from tests.integration.runtime_stub import RuntimeStub

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def spawn(stub: RuntimeStub, **env: str) -> subprocess.Popen[bytes]:
    full = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WARMSTART_"))},
        "AWS_LAMBDA_RUNTIME_API": stub.address,
        "AWS_LAMBDA_FUNCTION_NAME": "warmstart-test",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "3008",
        "PYTHONPATH": str(ROOT),
        **env,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "awslambdaric", "handler.app.lambda_handler"],
        cwd=ROOT,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@pytest.fixture
def stub() -> Iterator[RuntimeStub]:
    with RuntimeStub() as s:
        yield s


def stop(proc: subprocess.Popen[bytes]) -> str:
    proc.kill()
    out, _ = proc.communicate(timeout=30)
    return out.decode(errors="replace")


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_serves_embeddings_errors_and_pings(stub: RuntimeStub, model_dir: Path, backend: str) -> None:
    proc = spawn(stub, WARMSTART_MODEL=str(model_dir), WARMSTART_BACKEND=backend)
    try:
        first = stub.invoke({"inputs": ["hello world", "ünïcode ✓"]})
        assert first.kind == "response"
        body = first.json()
        assert body["model"] == "all-minilm-l6-v2@0.1.0"
        vectors = np.array(body["embeddings"])
        assert vectors.shape == (2, 384)
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)

        bad = stub.invoke({"inputs": []})
        assert bad.kind == "error"
        assert bad.json()["errorType"] == "InvalidInputError"

        raw = stub.invoke(b"\xff\xfe not utf-8", content_type="application/octet-stream")
        assert raw.kind == "error"
        assert raw.json()["errorType"] == "InvalidEncodingError"

        again = stub.invoke({"inputs": ["hello world"]})
        assert again.kind == "response"
        np.testing.assert_allclose(again.json()["embeddings"][0], vectors[0], atol=1e-6)

        ping = stub.invoke({"warmer": True, "correlation_id": "abc"}).json()
        assert ping["warm"] is True
        assert ping["cold"] is False
        assert ping["invocations"] == 5
        assert ping["correlation_id"] == "abc"
        assert proc.poll() is None, "a bad request must not end the instance"
    finally:
        logs = stop(proc)
    init_lines = [line for line in logs.splitlines() if line.startswith('{"warmstart":"init"')]
    assert len(init_lines) == 1, logs
    assert f'"backend":"{backend}"' in init_lines[0]


def test_answers_are_encoded_once_and_posted_as_they_are(stub: RuntimeStub, model_dir: Path) -> None:
    """The handler hands awslambdaric JSON bytes (`Runtime.lambda_reply`), which it posts untouched: the compact
    text of `handler.api.encode`, float32 at its shortest, byte for byte. Its own encoder (simplejson) would
    write `", "` and `": "`, and cannot write the float32 arrays an answer carries at all."""
    proc = spawn(stub, WARMSTART_MODEL=str(model_dir), WARMSTART_BACKEND="onnx", WARMSTART_WARMUP="0")
    try:
        direct = stub.invoke({"inputs": ["hello world"]})
        assert direct.kind == "response" and direct.content_type == "application/unknown"
        assert direct.body == dumps(json.loads(direct.body))  # the parsed floats print as the float32s did
        (row,) = json.loads(direct.body)["embeddings"]
        words = direct.body.split(b"[[", 1)[1].split(b"]]", 1)[0].split(b",")
        assert len(words) == len(row) == 384 and b" " not in direct.body
        assert all(len(w.lstrip(b"-").replace(b".", b"").split(b"e")[0].lstrip(b"0")) <= 9 for w in words)

        event = json.loads((ROOT / "tests" / "events" / "function_url.json").read_text())
        http = stub.invoke(event)
        assert http.kind == "response" and http.body == dumps(json.loads(http.body))  # the envelope: once too
        envelope = json.loads(http.body)
        assert envelope["statusCode"] == 200 and envelope["headers"] == {"content-type": "application/json"}
        assert envelope["body"].encode() == dumps(json.loads(envelope["body"]))
        assert len(json.loads(envelope["body"])["embeddings"][0]) == 384

        ping = stub.invoke({"warmer": True})  # control answers go the same way
        assert ping.kind == "response" and ping.json()["warm"] is True
    finally:
        stop(proc)


def test_missing_model_fails_init_naming_the_path(stub: RuntimeStub, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    proc = spawn(stub, WARMSTART_MODEL=str(missing))
    try:
        error = stub.init_errors.get(timeout=60)
        assert error["errorType"] == "ModelLoadError"
        assert str(missing) in error["errorMessage"]
        assert proc.wait(timeout=30) != 0
    finally:
        stop(proc)


def test_truncated_file_fails_init_naming_the_file(stub: RuntimeStub, model_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in model_dir.iterdir():
        (broken / f.name).symlink_to(f)
    (broken / "tokenizer.json").unlink()
    shutil.copyfile(model_dir / "tokenizer.json", broken / "tokenizer.json")
    with (broken / "tokenizer.json").open("r+b") as f:
        f.truncate(1000)
    proc = spawn(stub, WARMSTART_MODEL=str(broken))
    try:
        error = stub.init_errors.get(timeout=60)
        assert error["errorType"] == "ModelLoadError"
        assert "tokenizer.json" in error["errorMessage"]
        assert "size 1000" in error["errorMessage"]
    finally:
        stop(proc)
