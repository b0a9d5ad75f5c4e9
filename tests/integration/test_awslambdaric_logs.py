"""Logs and metrics under the real runtime client with Lambda's advanced logging controls: JSON log format and
application log level WARN. Lambda's filter is applied here as documented: a stdout line's `level` decides, a
line without a valid level (or without a valid timestamp) counts as INFO."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.runtime_stub import RuntimeStub
from tests.integration.test_awslambdaric import spawn, stop

pytestmark = pytest.mark.integration
LEVELS = {"TRACE": 0, "DEBUG": 1, "INFO": 2, "WARN": 3, "WARNING": 3, "ERROR": 4, "FATAL": 5}
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


@pytest.fixture
def stub() -> Iterator[RuntimeStub]:
    with RuntimeStub() as s:
        yield s


def kept_by_lambda(line: str, threshold: str) -> bool:
    try:
        record = json.loads(line)
    except ValueError:
        return LEVELS["INFO"] >= LEVELS[threshold]
    level = str(record.get("level", "")).upper() if isinstance(record, dict) else ""
    if level not in LEVELS or not RFC3339.match(str(record.get("timestamp", ""))):
        level = "INFO"
    return LEVELS[level] >= LEVELS[threshold]


def test_json_logs_at_warn(stub: RuntimeStub, model_dir: Path) -> None:
    proc = spawn(
        stub,
        WARMSTART_MODEL=str(model_dir),
        AWS_LAMBDA_LOG_FORMAT="JSON",
        AWS_LAMBDA_LOG_LEVEL="WARN",
        AWS_LAMBDA_FUNCTION_VERSION="3",
    )
    try:
        assert stub.invoke({"inputs": ["hello"]}).kind == "response"
        assert stub.invoke({"inputs": []}).json()["errorType"] == "InvalidInputError"
        assert stub.invoke({"warmer": True}).json()["warm"] is True
        assert stub.invoke({"inputs": ["again"]}).kind == "response"
    finally:
        out = stop(proc)
    lines = [line for line in out.splitlines() if line.strip()]
    records: list[dict[str, Any]] = [json.loads(line) for line in lines]  # every line is one JSON object
    kept = [json.loads(line) for line in lines if kept_by_lambda(line, "WARN")]

    (init,) = (r for r in kept if r.get("warmstart") == "init")  # the init report survives WARN ...
    assert init["level"] == "WARN" and init["InitDuration"] == init["total_ms"] > 0
    assert "InitSessionDuration" in init and init["_aws"]["CloudWatchMetrics"]
    emf = [r for r in kept if r.get("message") == "invocation"]  # ... and so does every metric line
    assert [("ColdStart" in r, r.get("Pings"), r.get("error_type")) for r in emf] == [
        (True, None, None),
        (False, None, "InvalidInputError"),
        (False, 1, None),
        (False, None, None),
    ]
    assert {r["xray_trace_id"] for r in emf} == {"1-00000000-000000000000000000000000"}
    assert len({r["function_request_id"] for r in emf}) == 4
    assert all(r["function_version"] == "3" and r["function_name"] == "warmstart-test" for r in emf)

    # Bad input: our record is a WARN without a stack trace, in the invocation's context.
    (warn,) = (r for r in records if r.get("logger") == "warmstart")
    assert warn["level"] == "WARN" and "InvalidInputError" in warn["message"] and "exception" not in warn
    assert warn["function_request_id"] == emf[1]["function_request_id"] and warn["cold_start"] is False
    # The runtime client's own function-error record (how errorType reaches the caller) names only the
    # handler's frames, none of the task's.
    (client,) = (r for r in records if r.get("errorType") == "InvalidInputError")
    assert all("tasks.py" not in frame for frame in client["stackTrace"])
