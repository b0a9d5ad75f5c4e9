"""boto3 against the local Lambda: invoke, logs, errors, qualifiers, payload limits (fixture handlers)."""

from __future__ import annotations

import base64
import http.client
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # the fixtures live under tests/, which is not an installed package
    sys.path.insert(0, ROOT)

from infra.local.server import LocalLambda  # noqa: E402
from tests.fixtures.local_support import invoke, report, running, wait_until  # noqa: E402

Lambda = tuple[LocalLambda, Any]  # the server and a boto3 client for it


def instances(local: LocalLambda) -> list[Any]:
    return [i for i in list(local.pool.instances.values()) if i.proc is not None]


pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lam() -> Iterator[Lambda]:
    with running(max_concurrency=4) as pair:
        yield pair


def test_invoke_runs_awslambdaric_with_lambda_environment(lam: Lambda) -> None:
    _local, client = lam
    result, body, _log = invoke(client, {"hello": "world"})
    assert result["StatusCode"] == 200
    assert "FunctionError" not in result
    assert result["ExecutedVersion"] == "$LATEST"
    assert body["event"] == {"hello": "world"}
    assert body["arn"] == "arn:aws:lambda:us-east-1:123456789012:function:warmstart"
    assert 0 < body["remaining_ms"] <= 60_000
    env = body["env"]
    assert env["AWS_LAMBDA_FUNCTION_NAME"] == "warmstart"
    assert env["AWS_LAMBDA_FUNCTION_VERSION"] == "$LATEST"
    assert env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] == "2048"
    assert env["AWS_LAMBDA_LOG_GROUP_NAME"] == "/aws/lambda/warmstart"
    assert "[$LATEST]" in env["AWS_LAMBDA_LOG_STREAM_NAME"]
    assert env["AWS_REGION"] == env["AWS_DEFAULT_REGION"] == "us-east-1"
    assert env["AWS_LAMBDA_INITIALIZATION_TYPE"] == "on-demand"
    assert env["AWS_LAMBDA_RUNTIME_API"].startswith("127.0.0.1:")
    assert env["LAMBDA_TASK_ROOT"] == ROOT
    assert env["_HANDLER"] == "tests.fixtures.handlers.echo"
    assert "AWS_LAMBDA_MAX_CONCURRENCY" not in env


def test_tail_has_start_end_report_and_init_duration_only_when_cold(lam: Lambda) -> None:
    _local, client = lam
    _first, body1, log1 = invoke(client, {"print": "first-line"}, Qualifier="1")  # version 1: its own instances
    _second, body2, log2 = invoke(client, {"print": "second-line"}, Qualifier="1")
    assert body1["pid"] == body2["pid"]  # warm: same instance
    for log, body, marker in ((log1, body1, "first-line"), (log2, body2, "second-line")):
        assert f"START RequestId: {body['request_id']} Version: 1" in log
        assert marker in log
        assert f"END RequestId: {body['request_id']}" in log
        fields = report(log)
        assert fields["REPORT RequestId"] == body["request_id"]
        assert fields["Duration"].endswith(" ms")
        assert fields["Billed Duration"].endswith(" ms")
        assert fields["Memory Size"] == "2048 MB"
        assert int(fields["Max Memory Used"].split()[0]) > 0
    assert float(report(log1)["Init Duration"].split()[0]) > 0
    assert "Init Duration" not in report(log2)
    assert "fixture handlers: init" in log1  # init output belongs to the cold invocation's log


def test_function_error_is_unhandled_and_instance_survives(lam: Lambda) -> None:
    _local, client = lam
    _, before, _ = invoke(client, {})
    result, body, log = invoke(client, {"raise": "bad input"})
    assert result["StatusCode"] == 200
    assert result["FunctionError"] == "Unhandled"
    assert body["errorType"] == "BoomError"
    assert body["errorMessage"] == "bad input"
    assert "[ERROR] BoomError: bad input" in log
    _, after, _ = invoke(client, {})
    assert after["pid"] == before["pid"]


def test_qualifiers_versions_and_aliases(lam: Lambda) -> None:
    _local, client = lam
    result, body, _ = invoke(client, {}, Qualifier="live")
    assert result["ExecutedVersion"] == "1"
    assert body["version"] == "1"
    assert body["arn"].endswith(":function:warmstart:live")
    result, _, _ = invoke(client, {}, FunctionName="warmstart:$LATEST")
    assert result["ExecutedVersion"] == "$LATEST"
    arn = "arn:aws:lambda:us-east-1:123456789012:function:warmstart"
    result, _, _ = invoke(client, {}, FunctionName=arn, Qualifier="1")
    assert result["ExecutedVersion"] == "1"
    with pytest.raises(client.exceptions.ResourceNotFoundException):
        invoke(client, {}, Qualifier="nope")
    with pytest.raises(client.exceptions.ResourceNotFoundException):
        invoke(client, {}, FunctionName="other-function")


def test_dry_run_and_client_context(lam: Lambda) -> None:
    _local, client = lam
    result = client.invoke(FunctionName="warmstart", InvocationType="DryRun", Payload=b"{}")
    assert result["StatusCode"] == 204
    context = base64.b64encode(json.dumps({"custom": {"tenant": "t1"}}).encode()).decode()
    _, body, _ = invoke(client, {}, ClientContext=context)
    assert body["client_context"] == {"tenant": "t1"}


def test_bad_json_and_oversized_request_are_refused(lam: Lambda) -> None:
    _local, client = lam
    with pytest.raises(client.exceptions.InvalidRequestContentException):
        client.invoke(FunctionName="warmstart", Payload=b"{not json")
    with pytest.raises(client.exceptions.RequestTooLargeException):
        client.invoke(FunctionName="warmstart", Payload=json.dumps({"x": "y" * (6 * 1024 * 1024)}))


def test_oversized_response_gets_lambdas_error_and_service_keeps_going(lam: Lambda) -> None:
    _local, client = lam
    result, body, log = invoke(client, {"big_mb": 7})
    assert result["FunctionError"] == "Unhandled"
    assert body["errorType"] == "Function.ResponseSizeTooLarge"
    assert "6291556 bytes" in body["errorMessage"]
    assert "Status: error" in log
    result, body, _ = invoke(client, {"ok": 1})  # a response just under the limit still goes through
    assert "FunctionError" not in result
    result, body, _ = invoke(client, {"big_mb": 5.5})
    assert "FunctionError" not in result
    assert len(body) == int(5.5 * 1024 * 1024)


def test_emulator_path_for_curl_habits(lam: Lambda) -> None:
    local, _client = lam
    host, port = local.endpoint.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/2015-03-31/functions/function/invocations", b'{"via": "curl"}')
    response = conn.getresponse()
    body = json.loads(response.read())
    conn.close()
    assert response.status == 200
    assert body["event"] == {"via": "curl"}


def test_runtime_api_refusals_have_lambdas_codes_and_bodies() -> None:
    # A foreign client plays the runtime here: the guard that refuses strangers is off (test_local_guard.py).
    with running(max_concurrency=2, runtime_api_guard=False) as lam:
        _run_refusals(lam)


def _run_refusals(lam: Lambda) -> None:
    local, client = lam
    _, body, _ = invoke(client, {})
    host, port = body["env"]["AWS_LAMBDA_RUNTIME_API"].split(":")
    # Only once the runtime is parked on its own /next: a foreign /next before that would take its place.
    assert wait_until(lambda: any(i.parked and i.proc.pid == body["pid"] for i in instances(local)))

    def call(method: str, path: str, payload: bytes = b"") -> tuple[int, dict[str, Any]]:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request(method, f"/2018-06-01/runtime/{path}", payload or None)
        response = conn.getresponse()
        data = json.loads(response.read() or b"{}")
        conn.close()
        return response.status, data

    assert call("POST", "invocation/not-a-request-id/response", b"{}") == (
        400,
        {"errorMessage": "Invalid request ID", "errorType": "InvalidRequestID"},
    )
    status, data = call("POST", "init/error", b'{"errorType": "X", "errorMessage": "late"}')
    assert (status, data["errorType"]) == (403, "InvalidStateTransition")  # init is long over
    status, data = call("GET", "restore/next")
    assert (status, data["errorType"]) == (403, "InvalidStateTransition")  # not a snap-start function
    status, data = call("GET", "invocation/next")
    assert (status, data["errorType"]) == (403, "InvalidStateTransition")  # the runtime is already parked there
    _, again, _ = invoke(client, {})  # none of that disturbed the instance
    assert again["pid"] == body["pid"]
