"""A streaming task on the Lambda paths: a direct invoke (RequestResponse) and an HTTP event (Function URL in
BUFFERED mode, API Gateway) get the pieces collected into one answer, `{"pieces": [...]}`; errors keep the
direct-invoke and HTTP contracts. The toy task: tests/fixtures/streaming_toy.py."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from handler.core.errors import InvalidInputError
from handler.runtime.invocation import Runtime
from handler.runtime.workers import Sizing, WorkerPool
from tests.conftest import http_v2_event
from tests.fixtures.streaming_toy import CountTask, streaming_runtime

PIECES = [{"index": i, "text": f"piece {i}"} for i in range(3)]


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
