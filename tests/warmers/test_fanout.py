"""The fan-out without a Lambda: exact request shapes (botocore Stubber), retries and failures (fake clients), a
missing function (moto), and the client the warmer builds for itself."""

from __future__ import annotations

import base64
import io
import json
import threading
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError, ReadTimeoutError
from botocore.response import StreamingBody
from botocore.stub import Stubber
from moto import mock_aws

from warmers.config import Target, WarmerConfig
from warmers.fanout import Warmer
from warmers.report import DUPLICATE


def body(data: dict[str, Any]) -> StreamingBody:
    raw = json.dumps(data).encode()
    return StreamingBody(io.BytesIO(raw), len(raw))


def throttle() -> ClientError:
    return ClientError({"Error": {"Code": "TooManyRequestsException", "Message": "Rate Exceeded."}}, "Invoke")


class FakeLambda:
    """Answers `invoke` from a function of (call number, kwargs); records every call. Thread-safe."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def invoke(self, **kwargs: Any) -> dict[str, Any]:
        with self.lock:
            self.calls.append(kwargs)
            number = len(self.calls)
        result: dict[str, Any] = self.answer(number, kwargs)
        return result


def ping_reply(number: int, kwargs: dict[str, Any]) -> dict[str, Any]:
    event = json.loads(kwargs["Payload"])
    reply = {"warm": True, "instance_id": f"i-{number}", "cold": True, "correlation_id": event["correlation_id"]}
    return {"StatusCode": 200, "ExecutedVersion": "3", "Payload": body(reply)}


@pytest.fixture
def lambda_client() -> Any:
    return boto3.client("lambda", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")


@pytest.mark.parametrize(
    ("style", "event", "custom"),
    [
        ("warmstart", {"warmer": True}, None),
        (
            "lambda-warmer",
            {"warmer": True, "__WARMER_INVOCATION__": 1, "__WARMER_CONCURRENCY__": 1, "__WARMER_CORRELATIONID__": "c1"},
            None,
        ),
        ("serverless-plugin-warmup", {"source": "serverless-plugin-warmup"}, {"source": "serverless-plugin-warmup"}),
    ],
)
def test_exact_request_shape_per_payload_style(
    lambda_client: Any, style: str, event: dict[str, Any], custom: dict[str, Any] | None
) -> None:
    target = Target("embed", 1, qualifier="live", payload_style=style)  # type: ignore[arg-type]
    payload = json.dumps({**event, "hold_ms": 120, "correlation_id": "c1/0"}, separators=(",", ":")).encode()
    expected: dict[str, Any] = {
        "FunctionName": "embed",
        "Qualifier": "live",
        "InvocationType": "RequestResponse",
        "Payload": payload,
    }
    if custom is not None:
        expected["ClientContext"] = base64.b64encode(json.dumps({"custom": custom}).replace(" ", "").encode()).decode()
    reply = {"warm": True, "instance_id": "abc", "cold": False}
    with Stubber(lambda_client) as stub:
        stub.add_response("invoke", {"StatusCode": 200, "ExecutedVersion": "7", "Payload": body(reply)}, expected)
        report = Warmer(WarmerConfig(hold_ms=120), boto3_client=lambda_client).run([target], correlation_id="c1")
        stub.assert_no_pending_responses()
    result = report.targets[0].to_dict()
    assert (result["asked"], result["distinct"], result["cold"], result["errors"]) == (1, 1, 0, [])
    assert result["executed_versions"] == ["7"] and result["target"] == "embed:live"


def test_lambda_warmer_style_numbers_the_copies_and_never_asks_for_its_own_fan_out() -> None:
    fake = FakeLambda(ping_reply)
    target = Target("embed", 4, payload_style="lambda-warmer")
    report = Warmer(WarmerConfig(hold_ms=0), boto3_client=fake).run([target], correlation_id="run")
    events = sorted((json.loads(c["Payload"]) for c in fake.calls), key=lambda e: e["__WARMER_INVOCATION__"])
    assert [e["__WARMER_INVOCATION__"] for e in events] == [1, 2, 3, 4]
    assert all(e["__WARMER_CONCURRENCY__"] == 4 and "concurrency" not in e for e in events)
    assert report.targets[0].distinct == 4 and report.ok


def test_throttles_are_retried_with_bounded_jittered_backoff() -> None:
    def answer(number: int, kwargs: dict[str, Any]) -> dict[str, Any]:
        if number <= 2:
            raise throttle()
        return ping_reply(number, kwargs)

    slept: list[float] = []
    config = WarmerConfig(hold_ms=0, max_attempts=4, backoff_base_s=0.1, backoff_cap_s=0.15)
    report = Warmer(config, boto3_client=FakeLambda(answer), sleep=slept.append).run([Target("embed", 1)])
    result = report.targets[0].to_dict()
    assert (result["distinct"], result["throttled"], result["retries"], result["errors"]) == (1, 2, 2, [])
    assert len(slept) == 2 and all(0 <= s <= 0.15 for s in slept)


def test_persistent_throttling_gives_up_and_reports() -> None:
    def answer(number: int, kwargs: dict[str, Any]) -> dict[str, Any]:
        raise throttle()

    fake = FakeLambda(answer)
    config = WarmerConfig(hold_ms=0, max_attempts=3)
    report = Warmer(config, boto3_client=fake, sleep=lambda _s: None).run([Target("embed", 5)])
    result = report.targets[0].to_dict()
    assert len(fake.calls) == 15  # 5 pings x 3 attempts, not one more
    assert (result["distinct"], result["shortfall"], result["ok"]) == (0, 5, False)
    (error,) = result["errors"]
    assert error["type"] == "TooManyRequestsException" and error["count"] == 5
    assert "throttled on all 3 attempts" in error["message"]


def test_the_run_deadline_stops_retries() -> None:
    def answer(number: int, kwargs: dict[str, Any]) -> dict[str, Any]:
        raise throttle()

    fake = FakeLambda(answer)
    config = WarmerConfig(hold_ms=0, max_attempts=10, backoff_base_s=5.0, backoff_cap_s=5.0, deadline_s=0.5)

    class Rng:
        def uniform(self, low: float, high: float) -> float:
            return high

    warmer = Warmer(config, boto3_client=fake, sleep=lambda _s: pytest.fail("slept past the deadline"), rng=Rng())  # type: ignore[arg-type]
    result = warmer.run([Target("embed", 2)]).targets[0].to_dict()
    assert len(fake.calls) == 2 and "deadline" in result["errors"][0]["message"]


def test_function_errors_timeouts_and_duplicates_are_reported_per_target() -> None:
    def answer(number: int, kwargs: dict[str, Any]) -> dict[str, Any]:
        name = kwargs["FunctionName"]
        if name == "broken":
            error = {"errorType": "ModelLoadError", "errorMessage": "model.onnx: truncated"}
            return {"StatusCode": 200, "FunctionError": "Unhandled", "Payload": body(error)}
        if name == "slow":
            raise ReadTimeoutError(endpoint_url="https://lambda")
        return {"StatusCode": 200, "Payload": body({"warm": True, "instance_id": "same", "cold": False})}

    fake = FakeLambda(answer)
    targets = [Target("broken", 2), Target("slow", 1), Target("one-instance", 3)]
    report = Warmer(WarmerConfig(hold_ms=0), boto3_client=fake).run(targets)
    broken, slow, single = (t.to_dict() for t in report.targets)
    assert broken["errors"] == [{"type": "ModelLoadError", "message": "model.onnx: truncated", "count": 2}]
    assert slow["errors"][0]["type"] == "ReadTimeoutError" and len(fake.calls) == 6  # timeouts are not retried
    assert (single["distinct"], single["duplicates"], single["errors"][0]["type"]) == (1, 2, DUPLICATE)
    assert not report.ok


def test_replies_without_an_instance_id_are_unverified_not_warm() -> None:
    def answer(number: int, kwargs: dict[str, Any]) -> dict[str, Any]:
        raw = b'"WarmUp - Lambda is warm!"'
        return {"StatusCode": 200, "Payload": StreamingBody(io.BytesIO(raw), len(raw))}

    target = Target("legacy", 2, payload_style="serverless-plugin-warmup")
    result = Warmer(WarmerConfig(hold_ms=0), boto3_client=FakeLambda(answer)).run([target]).targets[0].to_dict()
    assert (result["answered"], result["distinct"], result["unverified"], result["errors"]) == (2, 0, 2, [])
    assert result["ok"] is False


@mock_aws
def test_missing_function_does_not_stop_the_run() -> None:
    client = boto3.client("lambda", region_name="us-east-1")
    report = Warmer(WarmerConfig(hold_ms=0), boto3_client=client).run(
        [Target("missing-one", 2, qualifier="live"), Target("missing-two", 1)]
    )
    assert [t.to_dict()["errors"][0]["type"] for t in report.targets] == ["ResourceNotFoundException"] * 2
    assert [t.answered for t in report.targets] == [0, 0]


def test_the_built_client_has_bounded_timeouts_no_botocore_retries_and_enough_connections() -> None:
    config = WarmerConfig(
        targets=(Target("a", 100), Target("b", 30)),
        endpoint_url="http://127.0.0.1:9",
        connect_timeout_s=1.5,
        read_timeout_s=12.0,
    )
    meta = Warmer(config).client.meta
    assert meta.endpoint_url == "http://127.0.0.1:9"
    assert (meta.config.connect_timeout, meta.config.read_timeout) == (1.5, 12.0)
    assert meta.config.retries["total_max_attempts"] == 1
    assert meta.config.max_pool_connections == 130
