"""`python -m handler` in Lambda mode, for real: the runtime client runs in the entrypoint's own process
against a Runtime API stub and serves the image's CMD handler."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.runtime_stub import RuntimeStub

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_python_m_handler_serves_lambda_invokes(model_dir: Path) -> None:
    with RuntimeStub() as stub:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WARMSTART_"))}
        env.update(
            AWS_LAMBDA_RUNTIME_API=stub.address,
            AWS_LAMBDA_FUNCTION_NAME="warmstart-test",
            PYTHONPATH=str(ROOT),
            WARMSTART_MODEL=str(model_dir),
            WARMSTART_WARMUP="0",
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "handler", "handler.app.lambda_handler"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            answer = stub.invoke({"inputs": ["hello"]})
            assert answer.kind == "response", answer
            assert len(answer.json()["embeddings"][0]) == 384
            bad = stub.invoke({"inputs": []})
            assert bad.kind == "error" and bad.json()["errorType"] == "InvalidInputError"
            assert proc.poll() is None
            # The runtime client runs in the entrypoint's process: nothing exec'd a second interpreter over it.
            cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
            assert cmdline[1:3] == [b"-m", b"handler"], cmdline
        finally:
            proc.kill()
            proc.communicate(timeout=30)
