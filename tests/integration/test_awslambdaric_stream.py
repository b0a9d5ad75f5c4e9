"""A streaming task through the real runtime client (`python -m awslambdaric`), against a Runtime API stub and
through the local Lambda with boto3: awslambdaric cannot stream (4.2.2 posts one buffered body; docs/events.md,
"Streaming tasks"), so a direct invoke gets the pieces collected into one answer, and an error after the first
piece is the invocation's error."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.local_support import invoke, running
from tests.integration.runtime_stub import RuntimeStub
from tests.integration.test_awslambdaric import stop

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
HANDLER = "tests.fixtures.streaming_toy.lambda_handler"  # the toy task's one registration


def spawn(stub: RuntimeStub, **env: str) -> subprocess.Popen[bytes]:
    full = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WARMSTART_"))},
        "AWS_LAMBDA_RUNTIME_API": stub.address,
        "AWS_LAMBDA_FUNCTION_NAME": "warmstart-stream-test",
        "PYTHONPATH": str(ROOT),
        **env,
    }
    cmd = [sys.executable, "-m", "awslambdaric", HANDLER]
    return subprocess.Popen(cmd, cwd=ROOT, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.fixture
def stub() -> Iterator[RuntimeStub]:
    with RuntimeStub() as s:
        yield s


def test_a_direct_invoke_of_a_streaming_task_is_one_collected_answer(stub: RuntimeStub, model_dir: Path) -> None:
    proc = spawn(stub, WARMSTART_MODEL=str(model_dir), WARMSTART_BACKEND="onnx")
    try:
        answer = stub.invoke({"n": 3, "stream": True})
        assert answer.kind == "response", answer
        assert answer.json() == {"pieces": [{"index": i, "text": f"piece {i}"} for i in range(3)]}
        failed = stub.invoke({"n": 3, "fail_at": 1})
        assert failed.kind == "error" and failed.json()["errorType"] == "ValueError"
        bad = stub.invoke({"n": "x"})
        assert bad.kind == "error" and bad.json()["errorType"] == "InvalidInputError"
        assert stub.invoke({"n": 1}).kind == "response"  # the instance goes on
    finally:
        stop(proc)


def test_through_the_local_lambda_with_boto3(model_dir: Path) -> None:
    environment = {"WARMSTART_MODEL": str(model_dir), "WARMSTART_BACKEND": "onnx"}
    with running(handler=HANDLER, environment=environment) as (local, client):
        result, body, _ = invoke(client, {"n": 4, "stream": True})
        assert "FunctionError" not in result, body
        assert body == {"pieces": [{"index": i, "text": f"piece {i}"} for i in range(4)]}
        result, error, _ = invoke(client, {"n": 4, "fail_at": 3})
        assert result["FunctionError"] == "Unhandled" and error["errorType"] == "ValueError", error
        assert invoke(client, {"n": 1})[1] == {"pieces": [{"index": 0, "text": "piece 0"}]}
        assert local.pool.spawned == 1  # one instance served them all
