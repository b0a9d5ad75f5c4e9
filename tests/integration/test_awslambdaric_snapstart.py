"""SnapStart under the real `awslambdaric` (`AWS_LAMBDA_INITIALIZATION_TYPE=snap-start`) against a Runtime API
stub: init → before-snapshot hooks → GET /restore/next → after-restore hooks → invocations, as on Lambda
(the VM snapshot itself is Lambda's; here the same process goes on, which is what a restore looks like
from inside)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import start
from tests.integration.runtime_stub import RuntimeStub

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SNAP = "tests.fixtures.snap_handler.lambda_handler"


def spawn(stub: RuntimeStub, model_dir: Path, **env: str) -> subprocess.Popen[bytes]:
    full = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WARMSTART_"))},
        "AWS_LAMBDA_RUNTIME_API": stub.address,
        "AWS_LAMBDA_FUNCTION_NAME": "warmstart-test",
        "AWS_LAMBDA_INITIALIZATION_TYPE": "snap-start",
        "WARMSTART_MODEL": str(model_dir),
        "PYTHONPATH": str(ROOT),
        **env,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "awslambdaric", SNAP],
        cwd=ROOT,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def reports(output: str) -> dict[str, dict[str, Any]]:
    """The handler's JSON report lines by kind: init, snapshot, restore."""
    found = {}
    for line in output.splitlines():
        if line.startswith('{"warmstart"'):
            record = json.loads(line)
            found[record["warmstart"]] = record
    return found


@pytest.fixture
def stub() -> Any:
    with RuntimeStub() as s:
        yield s


def test_snap_start_runs_the_hooks_around_restore(stub: RuntimeStub, model_dir: Path) -> None:
    proc = spawn(stub, model_dir)
    try:
        draws = stub.invoke({"draws": True})
        assert draws.kind == "response"
        embedded = stub.invoke({"inputs": ["hello world", "snap start"]})
        ping = stub.invoke({"warmer": True})
    finally:
        proc.kill()
        output = proc.communicate(timeout=30)[0].decode(errors="replace")
    assert stub.restored.is_set()  # the runtime asked /restore/next before its first /next
    found = reports(output)
    init, snap, restore = found["init"], found["snapshot"], found["restore"]
    assert init["init_type"] == "snap-start" and init["snapshot"] == "vm"
    assert output.index('"warmstart":"snapshot"') < output.index('"warmstart":"restore"')
    # A restored instance is a new instance: new id everywhere the id shows.
    assert restore["snapshot_instance_id"] == init["instance_id"] == snap["instance_id"]
    body = draws.json()
    assert body["instance_id"] == restore["instance_id"] != init["instance_id"]
    assert ping.json()["instance_id"] == restore["instance_id"]
    # Metrics (issue 18): init once at snapshot time, the restore in its own line, and the first invocation
    # of the restored instance counted as a restore, not a cold start.
    assert init["InitDuration"] == init["total_ms"] and restore["RestoreDuration"] == restore["total_ms"]
    first = next(json.loads(line) for line in output.splitlines() if '"message":"invocation"' in line)
    assert first["RestoreStart"] == 1 and "ColdStart" not in first and first["cold_start"] is True
    assert set(restore["reseeded"]) >= {"random", "numpy"}
    assert body["restore"]["phases_ms"].keys() >= {"reseed", "identity", "device", "threads", "clients"}
    # Same answers as an instance that never went through a snapshot.
    reference = start(model_dir).handle({"inputs": ["hello world", "snap start"]})
    assert np.allclose(np.array(embedded.json()["embeddings"]), np.array(reference["embeddings"]), atol=1e-6)


@pytest.mark.parametrize(
    ("fail", "code", "error_type", "restored"),
    [("before", 64, "Runtime.BeforeSnapshotError", False), ("after", 65, "Runtime.AfterRestoreError", True)],
)
def test_a_failing_hook_is_reported_with_its_type_and_exit_code(
    stub: RuntimeStub, model_dir: Path, fail: str, code: int, error_type: str, restored: bool
) -> None:
    proc = spawn(stub, model_dir, SNAP_FIXTURE_FAIL=fail)
    proc.communicate(timeout=120)
    assert proc.returncode == code
    # Before the snapshot it is an init error (/init/error); after restore, a restore error (/restore/error).
    error = (stub.restore_errors if restored else stub.init_errors).get(timeout=5)
    assert stub.error_types == [error_type]
    assert error["errorType"] == "HookFailedError"
    assert f"{fail}-" in error["errorMessage"] and "hook failed on purpose" in error["errorMessage"]
    assert stub.restored.is_set() is restored
