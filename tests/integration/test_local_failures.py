"""Instances that time out, exit, get killed or fail init: Lambda's answers, and a fresh instance after."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # the fixtures live under tests/, which is not an installed package
    sys.path.insert(0, ROOT)

from tests.fixtures.local_support import alive, instance_pids, invoke, report, running, wait_until  # noqa: E402

pytestmark = pytest.mark.integration


def test_timeout_kills_the_instance_and_answers_like_lambda() -> None:
    with running(timeout_s=1.0) as (_local, client):
        _, warm, _ = invoke(client, {})
        result, body, log = invoke(client, {"sleep_ms": 10_000})
        assert result["FunctionError"] == "Unhandled"
        assert body["errorType"] == "Sandbox.Timedout"
        assert "Task timed out after 1.00 seconds" in body["errorMessage"]
        assert "Task timed out after 1.00 seconds" in log
        assert "Status: timeout" in log
        assert wait_until(lambda: not alive(warm["pid"]))
        _, again, log = invoke(client, {})
        assert again["pid"] != warm["pid"]  # replaced: a cold start
        assert "Init Duration" in report(log)


def test_exit_mid_invocation_is_runtime_exit_error() -> None:
    with running() as (_local, client):
        result, body, log = invoke(client, {"exit": 3})
        assert result["FunctionError"] == "Unhandled"
        assert body["errorType"] == "Runtime.ExitError"
        assert body["errorMessage"].endswith("Error: Runtime exited with error: exit status 3")
        assert "Error Type: Runtime.ExitError" in log
        result, body, _ = invoke(client, {"after": "exit"})
        assert "FunctionError" not in result
        assert body["event"] == {"after": "exit"}


def test_instance_killed_mid_invocation() -> None:
    with running() as (local, client):
        _, warm, _ = invoke(client, {})
        outcome: dict[str, Any] = {}

        def slow() -> None:
            outcome["result"] = invoke(client, {"sleep_ms": 30_000})

        caller = threading.Thread(target=slow)
        caller.start()
        assert wait_until(lambda: any(i.current is not None for i in list(local.pool.instances.values())))
        os.kill(warm["pid"], signal.SIGKILL)
        caller.join(60)
        result, body, _ = outcome["result"]
        assert result["FunctionError"] == "Unhandled"
        assert body["errorType"] == "Runtime.ExitError"
        assert body["errorMessage"].endswith("Runtime exited with error: signal: killed")
        assert wait_until(lambda: warm["pid"] not in instance_pids(local))
        _, fresh, _ = invoke(client, {})
        assert fresh["pid"] != warm["pid"]


def test_init_failure_surfaces_its_type() -> None:
    with running(handler="tests.fixtures.init_fails.handler") as (_local, client):
        result, body, log = invoke(client, {})
        assert result["StatusCode"] == 200
        assert result["FunctionError"] == "Unhandled"
        assert body["errorType"] == "ModelLoadError"
        assert "no packed model" in body["errorMessage"]
        assert "init_fails: loading the model" in log
        assert "Init Duration" in report(log)
        result, body, _ = invoke(client, {})  # each invocation retries init in a fresh instance
        assert body["errorType"] == "ModelLoadError"


def test_missing_handler_module_is_import_module_error() -> None:
    with running(handler="tests.fixtures.no_such_module.handler") as (_local, client):
        result, body, _ = invoke(client, {})
        assert result["FunctionError"] == "Unhandled"
        assert body["errorType"] == "Runtime.ImportModuleError"


def test_snap_start_init_type_goes_through_restore() -> None:
    with running(init_type="snap-start") as (_local, client):
        _, body, log = invoke(client, {})
        assert body["env"]["AWS_LAMBDA_INITIALIZATION_TYPE"] == "snap-start"
        fields = report(log)
        assert "Init Duration" in fields
        assert "Restore Duration" in fields
