"""The worker pool's streamed jobs (`WorkerPool.submit_stream`, `handler.runtime.pieces.Stream`): pieces as they
are made, a bounded buffer, a consumer that leaves stops its producer and frees the worker, errors in-stream."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from handler.core.errors import Abandoned, ServiceBusyError
from handler.runtime.pieces import EMPTY, END, Stream
from handler.runtime.workers import Sizing, WorkerPool


class Producer:
    """A streaming job that counts what it made and whether it was closed (its `finally` ran)."""

    def __init__(self, n: int | None = None, fail_at: int | None = None, gate: threading.Event | None = None) -> None:
        self.n, self.fail_at, self.gate = n, fail_at, gate
        self.made = 0
        self.closed = threading.Event()
        self.started = threading.Event()

    def __call__(self, prefix: str) -> Iterator[dict[str, Any]]:
        self.started.set()
        try:
            i = 0
            while self.n is None or i < self.n:
                if i == self.fail_at:
                    raise ValueError(f"failed at piece {i}")
                if i == 1 and self.gate is not None:
                    assert self.gate.wait(10)
                self.made += 1
                yield {"index": i, "text": f"{prefix}{i}"}
                i += 1
        finally:
            self.closed.set()


def _pool(**sizing: Any) -> WorkerPool:
    return WorkerPool(Sizing(**{"min_workers": 1, "max_workers": 1, **sizing}), cpus=1)


def _until(check: Any, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def test_pieces_reach_the_consumer_as_they_are_made() -> None:
    gate = threading.Event()
    producer = Producer(n=3, gate=gate)
    pool = _pool()
    stream = pool.submit_stream(producer, "p")
    # The first piece arrives while the producer is still held before its second one.
    assert stream.get(timeout=5) == {"index": 0, "text": "p0"}
    assert producer.made == 1 and not stream.future.done()  # type: ignore[union-attr]
    gate.set()
    assert list(stream) == [{"index": 1, "text": "p1"}, {"index": 2, "text": "p2"}]
    assert stream.poll() is END
    assert stream.future.result(5) == 3  # type: ignore[union-attr]
    pool.shutdown()


def test_a_consumer_that_does_not_read_holds_at_most_bound_pieces() -> None:
    producer = Producer(n=None)  # endless: only the bound stops it
    pool = _pool()
    stream = pool.submit_stream(producer, "p", bound=4)
    _until(lambda: producer.made >= 5)
    time.sleep(0.1)  # had the buffer no bound, the producer would run on
    assert producer.made == 5  # 4 waiting in the buffer, the 5th made and held at `put`
    assert stream.high_water == 4
    assert [stream.get(5)["index"] for _ in range(2)] == [0, 1]  # reading makes room, in order
    _until(lambda: producer.made == 7)
    stream.close()
    assert producer.closed.wait(5)
    pool.shutdown()


def test_a_consumer_that_leaves_stops_the_producer_and_frees_the_worker() -> None:
    producer = Producer(n=None)
    pool = _pool()
    stream = pool.submit_stream(producer, "p", bound=2)
    assert [stream.get(5)["index"] for _ in range(3)] == [0, 1, 2]
    stream.close()
    assert producer.closed.wait(5)  # the generator was closed at its next piece: its `finally` ran
    made = producer.made
    assert isinstance(stream.future.exception(5), type(None))  # type: ignore[union-attr]
    time.sleep(0.05)
    assert producer.made == made  # and made nothing more
    # The pool's only worker is free: another job runs.
    assert pool.submit(lambda: 42).result(5) == 42
    assert pool.stats()["abandoned"] == 1
    pool.shutdown()


def test_an_error_after_the_first_piece_is_delivered_in_stream() -> None:
    pool = _pool()
    stream = pool.submit_stream(Producer(n=5, fail_at=2), "p")
    got: list[Any] = []
    with pytest.raises(ValueError, match="failed at piece 2"):
        for piece in stream:
            got.append(piece["index"])
    assert got == [0, 1]  # every piece made before the error, then the error
    pool.shutdown()


def test_a_queued_stream_whose_consumer_leaves_never_runs() -> None:
    pool = _pool()
    release = threading.Event()
    pool.submit(release.wait, 10)  # the only worker is busy
    _until(lambda: pool.stats()["busy"] == 1)
    producer = Producer(n=3)
    stream = pool.submit_stream(producer, "p")
    assert pool.stats()["queued"] == 1
    stream.close()
    assert pool.stats()["queued"] == 0 and pool.stats()["dropped"] == 1
    with pytest.raises(Abandoned):
        stream.get(5)
    release.set()
    assert pool.submit(lambda: 1).result(5) == 1
    assert not producer.started.is_set()
    pool.shutdown()


def test_a_drained_queued_stream_ends_with_the_drain_error() -> None:
    pool = _pool()
    release = threading.Event()
    pool.submit(release.wait, 10)
    _until(lambda: pool.stats()["busy"] == 1)
    stream = pool.submit_stream(Producer(n=3), "p")
    pool.drain("shutting down")
    with pytest.raises(ServiceBusyError, match="shutting down"):
        stream.get(5)
    release.set()
    pool.shutdown()


def test_a_full_queue_refuses_a_stream_at_once() -> None:
    pool = _pool(max_queue=1)
    release = threading.Event()
    pool.submit(release.wait, 10)
    _until(lambda: pool.stats()["busy"] == 1)
    pool.submit(lambda: None)  # the queue's one place
    with pytest.raises(ServiceBusyError):
        pool.submit_stream(Producer(n=1), "p")
    release.set()
    pool.shutdown()


def test_poll_and_on_ready_for_an_event_loop() -> None:
    stream = Stream(bound=2)
    calls: list[int] = []
    assert stream.poll() is EMPTY
    stream.on_ready(lambda: calls.append(1))
    assert calls == [1]  # once at once, for pieces that came before
    assert stream.put({"a": 1})
    stream.finish(RuntimeError("late"))
    assert len(calls) == 3
    assert stream.poll() == {"a": 1}
    with pytest.raises(RuntimeError, match="late"):
        stream.poll()


def test_bound_is_checked() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Stream(bound=0)
