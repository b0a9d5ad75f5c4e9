"""A streaming task on the Lambda paths: a direct invoke (RequestResponse) and an HTTP event (Function URL in
BUFFERED mode, API Gateway) get the pieces collected into one answer, `{"pieces": [...]}`; errors keep the
direct-invoke and HTTP contracts. The toy task: tests/fixtures/streaming_toy.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from handler.api import prelude, sse
from handler.core import deadline
from handler.core.errors import InvalidInputError
from handler.runtime.invocation import Runtime
from handler.runtime.streamed import Buffered, Streamed
from handler.runtime.workers import Sizing, WorkerPool
from tests.conftest import http_v2_event
from tests.fixtures.streaming_toy import CountTask, streaming_runtime

PIECES = [{"index": i, "text": f"piece {i}"} for i in range(3)]
EVENTS = Path(__file__).resolve().parents[1] / "events"


@pytest.fixture(scope="module")
def runtime(new_runtime: Callable[..., Runtime]) -> Runtime:
    return streaming_runtime(new_runtime())


@pytest.mark.parametrize("stream", [None, False, True])
def test_a_direct_invoke_gets_the_pieces_collected(runtime: Runtime, stream: bool | None) -> None:
    event = {"n": 3} if stream is None else {"n": 3, "stream": stream}  # RequestResponse cannot stream: one answer
    assert runtime.handle(event, None) == {"pieces": PIECES}


def test_a_direct_invoke_raises_typed_errors(runtime: Runtime) -> None:
    with pytest.raises(InvalidInputError, match='"n" must be an integer'):
        runtime.handle({"n": -1}, None)
    with pytest.raises(ValueError, match="failed at piece 1"):  # awslambdaric reports errorType ValueError
        runtime.handle({"n": 3, "fail_at": 1}, None)
    assert runtime.handle({"n": 1}, None) == {"pieces": PIECES[:1]}  # and the instance goes on


def test_an_http_event_gets_the_pieces_collected(runtime: Runtime) -> None:
    answer = runtime.handle(http_v2_event("/", {"n": 3, "stream": True}), None)
    assert answer["statusCode"] == 200 and json.loads(answer["body"]) == {"pieces": PIECES}
    bad = runtime.handle(http_v2_event("/", {"n": "x"}), None)
    assert bad["statusCode"] == 400 and json.loads(bad["body"])["error"]["type"] == "InvalidInputError"
    failed = runtime.handle(http_v2_event("/", {"n": 3, "fail_at": 2}), None)
    assert failed["statusCode"] == 500 and json.loads(failed["body"])["error"]["type"] == "InternalError"


def test_with_a_worker_pool_the_stream_is_collected_on_a_worker(new_runtime: Callable[..., Runtime]) -> None:
    task = CountTask()
    runtime = streaming_runtime(new_runtime(), task)
    runtime.workers = WorkerPool(Sizing(min_workers=1, max_workers=1), cpus=1)  # Lambda Managed Instances
    try:
        assert runtime.handle({"n": 3}, None) == {"pieces": PIECES}
        assert task.made == 3 and task.closed == 1
    finally:
        runtime.workers.shutdown()


def test_a_task_may_gather_its_pieces_itself(new_runtime: Callable[..., Runtime]) -> None:
    class Joined(CountTask):
        def gather(self, pieces: object) -> dict[str, str]:
            return {"text": " ".join(p["text"] for p in pieces)}  # type: ignore[attr-defined]

    assert streaming_runtime(new_runtime(), Joined()).handle({"n": 2}, None) == {"text": "piece 0 piece 1"}


# -- the streaming loop's frames (handler.runtime.streamed): how each event's answer goes out -----------------


class _Context:
    aws_request_id = "req-frames"

    def __init__(self, remaining_ms: int = 30_000) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def _frames(runtime: Runtime, event: Any) -> list[Any]:
    return list(runtime.lambda_frames(event, _Context()))


def _url(body: Any) -> dict[str, Any]:
    event = http_v2_event("/", body)
    event["requestContext"]["domainName"] = "abc.lambda-url.us-east-1.on.aws"
    return event


def test_frames_of_a_direct_stream_are_its_events(runtime: Runtime) -> None:
    got = _frames(runtime, {"n": 2, "stream": True})
    assert got[0] == Streamed("text/event-stream")
    assert got[1:] == [sse.event(p) for p in PIECES[:2]] + [sse.DONE]
    assert _frames(runtime, {"n": 2}) == [Buffered(json.dumps({"pieces": PIECES[:2]}, separators=(",", ":")).encode())]


def test_only_function_url_and_rest_events_stream(runtime: Runtime) -> None:
    url = _frames(runtime, _url({"n": 1, "stream": True}))
    assert url[0] == Streamed(prelude.CONTENT_TYPE) and url[1].endswith(prelude.DELIMITER)
    rest = json.loads((EVENTS / "apigw_v1.json").read_text())
    rest["body"] = json.dumps({"n": 1, "stream": True})
    assert _frames(runtime, rest)[0] == Streamed(prelude.CONTENT_TYPE)
    # An HTTP API always buffers: its usual envelope, "stream" or not.
    (api,) = _frames(runtime, http_v2_event("/", {"n": 1, "stream": True}))
    assert isinstance(api, Buffered) and json.loads(json.loads(api.body)["body"]) == {"pieces": PIECES[:1]}


def test_a_bad_stream_field_is_refused_naming_it(runtime: Runtime) -> None:
    with pytest.raises(InvalidInputError, match='"stream" must be true or false'):
        _frames(runtime, {"n": 1, "stream": "yes"})
    _, head = _frames(runtime, _url({"n": 1, "stream": "yes"}))
    status = json.loads(head.partition(prelude.DELIMITER)[0])["statusCode"]
    assert status == 400


def test_the_task_sees_the_invocations_deadline(new_runtime: Callable[..., Runtime]) -> None:
    seen: list[float | None] = []

    class Timed(CountTask):
        def _pieces(self, n: int, delay_s: float, fail_at: int | None) -> Any:
            seen.append(deadline.remaining_s())
            yield from super()._pieces(n, delay_s, fail_at)

    timed = streaming_runtime(new_runtime(), Timed())
    list(timed.lambda_frames({"n": 1, "stream": True}, _Context(remaining_ms=5_000)))
    timed.handle({"n": 1}, _Context(remaining_ms=9_000))  # the awslambdaric path sets it too
    assert len(seen) == 2 and 4 < seen[0] <= 5 and 8 < seen[1] <= 9  # type: ignore[operator]
    assert deadline.remaining_s() is None


def test_frames_closed_mid_stream_stop_the_task(new_runtime: Callable[..., Runtime]) -> None:
    task = CountTask()
    runtime = streaming_runtime(new_runtime(), task)
    frames = runtime.lambda_frames({"n": 1000, "stream": True}, _Context())
    assert next(frames) == Streamed("text/event-stream") and next(frames) == sse.event(PIECES[0])
    frames.close()  # the loop's write failed: the producer stops at once
    assert task.closed == 1 and task.made < 5
