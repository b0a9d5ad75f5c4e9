"""A streamed answer end to end through the HTTP host, over a real socket (uvicorn with the host's own h11
protocol, in this process): server-sent events as OpenAI streams them, read by httpx and by the `openai`
client's own SSE reader; errors before the first piece as typed JSON, after it as an SSE error event; a client
that leaves mid-stream stops the producer and frees the worker. The toy task: tests/fixtures/streaming_toy.py."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
import uvicorn

from handler.http_host.host import Host
from handler.http_host.protocol import HostProtocol
from handler.http_host.routes import create_app
from handler.http_host.settings import HostSettings
from handler.runtime.invocation import Runtime
from handler.runtime.workers import Sizing, WorkerPool
from tests.fixtures.streaming_toy import CountTask, streaming_runtime


@dataclass
class Served:
    url: str
    task: CountTask
    workers: WorkerPool
    host: Host


@pytest.fixture(scope="module")
def base_runtime(new_runtime: Callable[..., Runtime]) -> Runtime:
    return new_runtime()


@contextmanager
def serving(base: Runtime, settings: HostSettings) -> Iterator[Served]:
    """uvicorn with the host's app and protocol on a free port, in a thread; one worker, a queue of one."""
    task = CountTask()
    runtime = streaming_runtime(base, task)
    workers = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=1), cpus=1)
    host = Host(lambda: runtime, workers, settings)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        create_app(host), http=HostProtocol.bind(host.settings, host.drain), log_config=None, lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.01)
    try:
        yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}", task, workers, host)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture
def served(base_runtime: Runtime) -> Iterator[Served]:
    with serving(base_runtime, HostSettings()) as s:
        yield s


def _events(lines: Iterator[str]) -> Iterator[tuple[str | None, str]]:
    """(event name, data) per server-sent event, as the SSE spec splits them."""
    name: str | None = None
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield name, "\n".join(data)
            name, data = None, []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))


def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_pieces_arrive_as_server_sent_events_as_they_are_made(served: Served) -> None:
    body = {"n": 4, "delay_ms": 150, "stream": True}
    arrived: list[float] = []
    events: list[tuple[str | None, str]] = []
    started = time.monotonic()
    with httpx.stream("POST", f"{served.url}/invocations", json=body, headers={"accept": "text/event-stream"}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache" and "content-length" not in r.headers
        for ev in _events(r.iter_lines()):
            arrived.append(time.monotonic() - started)
            events.append(ev)
    assert events[-1] == (None, "[DONE]")
    assert [json.loads(data) for _, data in events[:-1]] == [{"index": i, "text": f"piece {i}"} for i in range(4)]
    # The first piece came when it was made (~150 ms), not with the last (~600 ms): streamed, not buffered.
    assert arrived[0] < arrived[-1] - 0.3, arrived


def test_a_stream_of_no_pieces_is_done_at_once(served: Served) -> None:
    with httpx.stream("POST", f"{served.url}/invocations", json={"n": 0, "stream": True}) as r:
        assert r.status_code == 200 and list(_events(r.iter_lines())) == [(None, "[DONE]")]


def test_the_openai_clients_stream_reader_reads_it(served: Served) -> None:
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0)
    stream = client.post(
        "/invocations", cast_to=object, body={"n": 3, "stream": True}, stream=True, stream_cls=openai.Stream[object]
    )
    assert list(stream) == [{"index": i, "text": f"piece {i}"} for i in range(3)]  # `[DONE]` ended it
    # An error after the first piece: the client raises it as an APIError with our typed body.
    stream = client.post(
        "/invocations",
        cast_to=object,
        body={"n": 5, "fail_at": 2, "stream": True},
        stream=True,
        stream_cls=openai.Stream[object],
    )
    got = []
    with pytest.raises(openai.APIError, match="the toy task failed at piece 2") as caught:
        for piece in stream:
            got.append(piece)
    assert len(got) == 2 and caught.value.body == {
        "type": "InternalError",
        "message": "ValueError: the toy task failed at piece 2",
    }


def test_an_error_mid_stream_is_an_error_event_then_the_end(served: Served) -> None:
    with httpx.stream("POST", f"{served.url}/invocations", json={"n": 5, "fail_at": 2, "stream": True}) as r:
        assert r.status_code == 200
        events = list(_events(r.iter_lines()))
    assert [name for name, _ in events] == [None, None, "error"]  # two pieces, the error, and no [DONE]
    assert json.loads(events[-1][1])["error"]["type"] == "InternalError"
    _until(lambda: served.workers.stats()["busy"] == 0)
    # The instance goes on serving.
    after = httpx.post(f"{served.url}/invocations", json={"n": 1})
    assert after.json() == {"pieces": [{"index": 0, "text": "piece 0"}]}


@pytest.mark.parametrize(
    ("body", "error_type", "field"),
    [
        ({"n": "three", "stream": True}, "InvalidInputError", '"n"'),
        ({"n": 3, "stream": "yes"}, "InvalidInputError", '"stream"'),
        ({"n": 3, "fail_at": 0, "stream": True}, "InternalError", "piece 0"),
    ],
)
def test_an_error_before_the_first_piece_is_a_typed_json_error(
    served: Served, body: dict[str, Any], error_type: str, field: str
) -> None:
    r = httpx.post(f"{served.url}/invocations", json=body, headers={"accept": "text/event-stream"})
    assert r.status_code == (500 if error_type == "InternalError" else 400)
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error["type"] == error_type and field in error["message"]


def test_without_stream_the_pieces_come_as_one_answer(served: Served) -> None:
    r = httpx.post(f"{served.url}/invocations", json={"n": 2})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == {"pieces": [{"index": 0, "text": "piece 0"}, {"index": 1, "text": "piece 1"}]}


def test_a_client_that_leaves_mid_stream_stops_the_producer_and_frees_the_worker(served: Served) -> None:
    task = served.task
    body = {"n": 100_000, "delay_ms": 10, "stream": True}
    with httpx.stream("POST", f"{served.url}/invocations", json=body) as r:
        lines = r.iter_lines()
        got = [ev for _, ev in zip(range(3), _events(lines), strict=False)]
        assert len(got) == 3
    # The connection is closed: the producer stops at its next piece (its `finally` ran) and the worker is free.
    _until(lambda: task.closed == 1)
    made = task.made
    time.sleep(0.2)
    assert task.made == made < 1000, made  # nothing more made: 100,000 pieces would take 1,000 s
    _until(lambda: served.workers.stats()["busy"] == 0)
    assert served.workers.stats()["abandoned"] == 1
    # The only worker serves the next request.
    assert httpx.post(f"{served.url}/invocations", json={"n": 1}, timeout=10).status_code == 200


def test_a_full_queue_refuses_a_stream_with_503_before_any_piece(served: Served) -> None:
    # One worker, a queue of one: a long stream runs, a second request waits, the third is refused at once.
    body = {"n": 100_000, "delay_ms": 10, "stream": True}
    waited: list[int] = []
    second = threading.Thread(
        target=lambda: waited.append(httpx.post(f"{served.url}/invocations", json={"n": 1}, timeout=30).status_code)
    )
    with httpx.stream("POST", f"{served.url}/invocations", json=body) as first:
        events = _events(first.iter_lines())  # held: a collected iterator closes the response
        next(events)
        second.start()
        _until(lambda: served.workers.stats()["queued"] == 1)
        r = httpx.post(f"{served.url}/invocations", json={"n": 1, "stream": True})
        assert r.status_code == 503 and r.json()["error"]["type"] == "ServiceBusyError"
    second.join(30)  # the first client left: its worker took the waiting request
    assert waited == [200]


def test_a_stream_still_running_when_the_drain_time_runs_out_ends_with_its_503(base_runtime: Runtime) -> None:
    with serving(base_runtime, HostSettings(drain_s=1)) as served:
        body = {"n": 100_000, "delay_ms": 10, "stream": True}
        with httpx.stream("POST", f"{served.url}/invocations", json=body) as r:
            events = _events(r.iter_lines())
            assert next(events)[0] is None
            served.host.drain.begin_threadsafe()
            began = time.monotonic()
            rest = []  # pieces until the drain time is over, then the error event, and the end
            for ev in events:
                rest.append(ev)
                if time.monotonic() - began > 5:
                    break
        assert time.monotonic() - began < 5, "the stream went on past the drain time"
        name, data = rest[-1]
        assert name == "error" and json.loads(data)["error"]["type"] == "ServiceBusyError", rest[-3:]
        _until(lambda: served.task.closed == 1)  # the producer was stopped
        assert served.host.drain.expired == 1
