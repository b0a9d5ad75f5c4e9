"""Response streaming through the local Lambda with a real instance process: boto3's
InvokeWithResponseStream, plain Invoke, Event, and a RESPONSE_STREAM Function URL read with httpx.

The instance runs `tests/fixtures/stream_runtime.py` as its command (a stdlib Runtime API client that
streams chunked responses with delays, and ends one with error trailers), so the platform side is tested
without the function side."""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # the fixtures live under tests/, which is not an installed package
    sys.path.insert(0, ROOT)

from infra.local.server import LocalLambda  # noqa: E402
from tests.fixtures.local_support import running, wait_until  # noqa: E402

pytestmark = pytest.mark.integration

Lambda = tuple[LocalLambda, Any]
COMMAND = ("python", "-m", "tests.fixtures.stream_runtime")
CHUNKS = ["one ", "two ", "three ", "four"]
DELAY_MS = 250


@pytest.fixture(scope="module")
def lam() -> Iterator[Lambda]:
    # One instance at most: every test below also shows that the instance serves the next invocation.
    with running(command=COMMAND, max_concurrency=1) as pair:
        yield pair


@pytest.fixture(scope="module")
def url_lam() -> Iterator[Lambda]:
    with running(command=COMMAND, max_concurrency=1, invoke_mode="RESPONSE_STREAM") as pair:
        yield pair


def stream_invoke(client: Any, event: Any) -> tuple[dict[str, Any], list[tuple[float, bytes]], dict[str, Any]]:
    """(response, [(arrival time, PayloadChunk payload)], InvokeComplete)."""
    response = client.invoke_with_response_stream(FunctionName="warmstart", Payload=json.dumps(event), LogType="Tail")
    chunks: list[tuple[float, bytes]] = []
    complete: dict[str, Any] = {}
    for item in response["EventStream"]:
        if "PayloadChunk" in item:
            chunks.append((time.monotonic(), item["PayloadChunk"]["Payload"]))
        if "InvokeComplete" in item:
            complete = item["InvokeComplete"]
    return response, chunks, complete


def served_by_one_instance(local: LocalLambda, client: Any) -> int:
    """A buffered invoke after the streamed ones: the same single instance answers it."""
    result = client.invoke(FunctionName="warmstart", Payload=json.dumps({"buffered": {"ok": True}}))
    body = json.loads(result["Payload"].read())
    assert body["ok"] is True
    assert local.pool.spawned == 1
    return int(body["pid"])


def test_invoke_with_response_stream_delivers_chunks_as_they_are_streamed(lam: Lambda) -> None:
    local, client = lam
    response, chunks, complete = stream_invoke(client, {"chunks": CHUNKS, "delay_ms": DELAY_MS})
    assert response["StatusCode"] == 200
    assert response["ExecutedVersion"] == "$LATEST"
    assert response["ResponseStreamContentType"] == "application/octet-stream"
    assert b"".join(data for _, data in chunks) == "".join(CHUNKS).encode()
    assert len(chunks) >= 3
    # Spread over the function's delays (3 x 250 ms), not delivered together at the end.
    assert chunks[-1][0] - chunks[0][0] >= 3 * DELAY_MS / 1000 * 0.8
    assert "ErrorCode" not in complete
    log = base64.b64decode(complete["LogResult"]).decode()
    assert "REPORT RequestId:" in log and "Status: error" not in log
    served_by_one_instance(local, client)


def test_mid_stream_error_reaches_invoke_complete(lam: Lambda) -> None:
    local, client = lam
    _, chunks, complete = stream_invoke(client, {"chunks": CHUNKS, "delay_ms": 50, "fail_after": 2})
    assert b"".join(data for _, data in chunks) == b"one two "
    assert complete["ErrorCode"] == "StreamBoom"
    assert json.loads(complete["ErrorDetails"])["errorMessage"] == "failed mid-stream"
    assert "Error Type: StreamBoom" in base64.b64decode(complete["LogResult"]).decode()
    served_by_one_instance(local, client)


def test_a_buffered_answer_is_one_payload_chunk(lam: Lambda) -> None:
    _local, client = lam
    _, chunks, complete = stream_invoke(client, {"buffered": {"answer": 42}})
    assert len(chunks) == 1
    assert json.loads(chunks[0][1])["answer"] == 42
    assert "ErrorCode" not in complete


def test_plain_invoke_of_a_streaming_function_gets_the_whole_body(lam: Lambda) -> None:
    local, client = lam
    result = client.invoke(FunctionName="warmstart", Payload=json.dumps({"chunks": CHUNKS, "delay_ms": 20}))
    assert "FunctionError" not in result
    assert result["Payload"].read() == "".join(CHUNKS).encode()
    failed = client.invoke(FunctionName="warmstart", Payload=json.dumps({"chunks": CHUNKS, "fail_after": 1}))
    assert failed["FunctionError"] == "Unhandled"
    assert json.loads(failed["Payload"].read())["errorType"] == "StreamBoom"
    served_by_one_instance(local, client)


def test_event_invoke_of_a_streaming_function_does_not_hold_the_instance(lam: Lambda) -> None:
    local, client = lam
    result = client.invoke(FunctionName="warmstart", InvocationType="Event", Payload=json.dumps({"chunks": CHUNKS}))
    assert result["StatusCode"] == 202
    assert wait_until(lambda: local.queued_events == 0, timeout=30)
    served_by_one_instance(local, client)


def test_buffered_function_url_returns_a_streamed_body_whole(lam: Lambda) -> None:
    local, _client = lam
    event = {"chunks": CHUNKS, "delay_ms": 20, "content_type": "text/plain"}
    response = httpx.post(f"{local.endpoint}/lambda-url/warmstart/any/path", json=event, timeout=60)
    assert response.status_code == 200
    assert response.content == "".join(CHUNKS).encode()


def test_streaming_function_url_sends_the_prelude_head_then_the_body_as_it_comes(url_lam: Lambda) -> None:
    local, client = url_lam
    prelude = {"statusCode": 201, "headers": {"content-type": "text/event-stream", "x-test": "yes"}, "cookies": ["a=1"]}
    event = {"http": prelude, "chunks": CHUNKS, "delay_ms": DELAY_MS}
    arrivals: list[tuple[float, bytes]] = []
    url = f"{local.endpoint}/lambda-url/warmstart/v1/chat/completions"
    with httpx.Client(timeout=60) as http, http.stream("POST", url, json=event) as r:
        assert r.status_code == 201
        assert r.headers["content-type"] == "text/event-stream"
        assert r.headers["x-test"] == "yes"
        assert r.headers.get_list("set-cookie") == ["a=1"]
        for data in r.iter_raw():
            arrivals.append((time.monotonic(), data))
    assert b"".join(d for _, d in arrivals) == "".join(CHUNKS).encode()
    assert len(arrivals) >= 3
    assert arrivals[-1][0] - arrivals[0][0] >= 3 * DELAY_MS / 1000 * 0.8
    served_by_one_instance(local, client)


def test_streaming_function_url_with_a_buffered_answer_and_a_mid_stream_error(url_lam: Lambda) -> None:
    local, client = url_lam
    answer = {"statusCode": 202, "headers": {"x-b": "1"}, "body": "hi"}
    response = httpx.post(f"{local.endpoint}/lambda-url/warmstart/", json={"buffered": answer}, timeout=60)
    assert (response.status_code, response.headers["x-b"], response.text) == (202, "1", "hi")
    event = {"http": {"statusCode": 200}, "chunks": CHUNKS, "fail_after": 2}
    with pytest.raises(httpx.RemoteProtocolError):  # cut off: never a short body that looks complete
        httpx.post(f"{local.endpoint}/lambda-url/warmstart/", json=event, timeout=60)
    served_by_one_instance(local, client)


def test_a_stream_past_the_timeout_ends_with_the_timeout_and_a_new_instance_serves() -> None:
    with running(command=COMMAND, max_concurrency=1, timeout_s=1.0) as (local, client):
        _, chunks, complete = stream_invoke(client, {"chunks": CHUNKS, "delay_ms": 600})
        assert 1 <= len(chunks) < len(CHUNKS)  # what came before the deadline was delivered
        assert complete["ErrorCode"] == "Sandbox.Timedout"
        assert "Task timed out after 1.00 seconds" in complete["ErrorDetails"]
        assert wait_until(lambda: not local.pool.instances)  # the killed instance's exit is seen
        result = client.invoke(FunctionName="warmstart", Payload=json.dumps({"buffered": {"ok": True}}))
        assert json.loads(result["Payload"].read())["ok"] is True
        assert local.pool.spawned == 2


def test_a_client_that_leaves_mid_stream_does_not_hold_the_function(url_lam: Lambda) -> None:
    """The function streams on to its end (as on Lambda) and its instance takes the next invocation."""
    local, client = url_lam
    event = {"content_type": "text/plain", "chunks": ["x" * 65536] * 64, "delay_ms": 5}  # 4 MB: past the buffer
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", f"{local.endpoint}/lambda-url/warmstart/", json=event) as r,
    ):
        assert r.status_code == 200
        next(r.iter_raw())
    # Nobody reads the other 4 MB: the rest is dropped rather than pausing the function for good.
    assert wait_until(lambda: local.pool.inflight == 0, timeout=30)
    served_by_one_instance(local, client)
