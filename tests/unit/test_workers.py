"""The worker pool: sizing policy (pure), hard bounds, the bounded queue, errors carried to the caller."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError
from typing import Any

import pytest

from handler.core.errors import Abandoned, ServiceBusyError
from handler.runtime.workers import Batch, RunMany, Sizing, WorkerPool, decide, sizing_from_environ


def test_grows_only_after_a_sustained_backlog_with_cpu_to_spare() -> None:
    s = Sizing(min_workers=1, max_workers=3, grow_after=2, cpu_high=0.9)
    assert decide(1, waiting=3, cpu=0.2, streak=0, sizing=s) == (1, 1)  # one check is not a trend
    assert decide(1, waiting=3, cpu=0.2, streak=1, sizing=s) == (2, 0)
    assert decide(1, waiting=3, cpu=0.95, streak=5, sizing=s) == (1, 6)  # CPUs saturated: more threads won't help
    assert decide(3, waiting=9, cpu=0.1, streak=5, sizing=s) == (3, 6)  # hard bound
    assert decide(2, waiting=0, cpu=0.1, streak=5, sizing=s) == (2, 0)  # backlog gone: the streak resets


def _blocker(pool: WorkerPool, n: int) -> threading.Event:
    release = threading.Event()
    started = threading.Barrier(n + 1)

    def job() -> None:
        started.wait()
        release.wait(10)

    for _ in range(n):
        pool.submit(job)
    started.wait(10)
    return release


def test_queue_is_bounded_and_overflow_is_refused_at_once() -> None:
    pool = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=2))
    release = _blocker(pool, 1)
    queued = [pool.submit(lambda: "ok") for _ in range(2)]
    with pytest.raises(ServiceBusyError):
        pool.submit(lambda: "too many")
    release.set()
    assert [f.result(10) for f in queued] == ["ok", "ok"]
    s = pool.stats()
    assert (s["rejected"], s["completed"]) == (1, 3)
    pool.shutdown()


def test_grows_under_backlog_and_never_past_the_bound() -> None:
    sizing = Sizing(min_workers=1, max_workers=3, max_queue=100, grow_after=1, cpu_high=1e9, check_s=0.0)
    pool = WorkerPool(sizing, cpus=1)
    release = threading.Event()
    futures = [pool.submit(release.wait, 10) for _ in range(20)]
    deadline = time.monotonic() + 10
    while pool.stats()["workers"] < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.stats()["workers"] == 3
    release.set()
    assert all(f.result(10) for f in futures)
    assert pool.stats()["workers"] <= 3
    pool.shutdown()


def test_idle_workers_retire_down_to_the_minimum() -> None:
    sizing = Sizing(min_workers=1, max_workers=2, grow_after=1, cpu_high=1e9, idle_s=0.05, check_s=0.0)
    pool = WorkerPool(sizing)
    release = threading.Event()
    futures = [pool.submit(release.wait, 10) for _ in range(4)]
    release.set()
    for f in futures:
        f.result(10)
    deadline = time.monotonic() + 10
    while pool.stats()["workers"] > 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pool.stats()["workers"] == 1
    assert pool.call(lambda: 7) == 7  # the one left still serves
    pool.shutdown()


def test_exceptions_reach_the_caller_and_the_worker_survives() -> None:
    pool = WorkerPool(Sizing(min_workers=1, max_workers=1))
    with pytest.raises(ZeroDivisionError):
        pool.call(lambda: 1 / 0)
    assert pool.call(lambda: "alive") == "alive"
    pool.shutdown()


def test_sizing_from_environ() -> None:
    # One worker per CPU (each run's threads get CPUs to themselves), one full batch queued per worker.
    assert (sizing_from_environ({}, cpus=1).max_workers, sizing_from_environ({}, cpus=1).max_queue) == (1, 32)
    assert (sizing_from_environ({}, cpus=4).max_workers, sizing_from_environ({}, cpus=4).max_queue) == (4, 128)
    s = sizing_from_environ({"WARMSTART_BATCH_MAX": "8", "WARMSTART_BATCH_WAIT_MS": "0"}, cpus=2)
    assert (s.max_batch, s.max_queue, s.batch_wait_s) == (8, 16, 0.0)
    s = sizing_from_environ({"WARMSTART_WORKERS_MAX": "6", "WARMSTART_QUEUE_MAX": "9"}, cpus=2)
    assert (s.max_workers, s.max_queue) == (6, 9)


def _each(fn: Callable[[Any], Any]) -> RunMany:
    """A batch call that settles each item with `fn(item)`."""

    def run_many(items: Sequence[Any], batch: Batch) -> None:
        for k, item in enumerate(items):
            batch.settle(k, fn(item))

    return run_many


def _gate(pool: WorkerPool) -> threading.Event:
    """Hold the pool's one worker on a plain job, so what is submitted next queues up behind it."""
    return _blocker(pool, 1)


def test_queued_requests_with_the_same_key_run_as_one_batch_each_with_its_answer() -> None:
    pool = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=100, max_batch=4, batch_wait_s=0))
    calls: list[list[int]] = []

    def double(items: list[int], batch: Batch) -> None:
        calls.append(list(items))
        for k, i in enumerate(items):
            batch.settle(k, ValueError(f"bad {i}") if i == 3 else i * 2)

    def other(items: list[int], batch: Batch) -> None:
        calls.append([-i for i in items])
        for k, i in enumerate(items):
            batch.settle(k, i)

    release = _gate(pool)
    futures = [pool.submit_batch(double, i) for i in range(6)]
    odd = pool.submit_batch(other, 100)  # another key: never in double's batch
    release.set()
    assert [f.exception(10) is None and f.result() for f in futures[:3]] == [0, 2, 4]
    with pytest.raises(ValueError, match="bad 3"):  # its own error; its batch-mates still answered
        futures[3].result(10)
    assert [f.result(10) for f in futures[4:]] == [8, 10]
    assert odd.result(10) == 100
    assert calls == [[0, 1, 2, 3], [4, 5], [-100]]  # bounded by max_batch, in arrival order, keys apart
    s = pool.stats()
    assert (s["batches"], s["batched"], s["largest_batch"]) == (3, 7, 4)
    pool.shutdown()


def test_a_lone_request_runs_at_once_without_the_batch_wait() -> None:
    pool = WorkerPool(Sizing(min_workers=1, max_workers=1, batch_wait_s=5.0))
    t0 = time.monotonic()
    assert pool.submit_batch(_each(lambda i: i + 1), 1).result(10) == 2
    assert time.monotonic() - t0 < 1.0  # nothing was queued: no wait for batch-mates
    pool.shutdown()


def test_a_batch_that_fails_as_a_whole_is_retried_one_request_at_a_time() -> None:
    pool = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=100, batch_wait_s=0))

    def fragile(items: list[int], batch: Batch) -> None:
        if len(items) > 1:
            raise MemoryError("the batch did not fit")
        if items[0] == 2:
            raise KeyError("two")
        batch.settle(0, items[0] * 10)

    release = _gate(pool)
    futures = [pool.submit_batch(fragile, i) for i in range(4)]
    release.set()
    assert [futures[i].result(10) for i in (0, 1, 3)] == [0, 10, 30]
    with pytest.raises(KeyError, match="two"):
        futures[2].result(10)
    assert pool.stats()["batch_fallbacks"] == 1
    pool.shutdown()


def test_drain_fails_queued_batch_requests_too() -> None:
    pool = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=100))
    release = _gate(pool)
    queued = [pool.submit_batch(_each(lambda i: i), i) for i in range(3)]
    assert pool.drain("going away") == 3
    release.set()
    for f in queued:
        with pytest.raises(ServiceBusyError, match="going away"):
            f.result(10)
    pool.shutdown()


def test_each_batch_item_is_answered_as_soon_as_it_is_settled() -> None:
    """Item 0 settled, then the call goes on: its caller has its answer while the rest still runs (before,
    every item waited for the whole batch call to return)."""
    pool = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=100, batch_wait_s=0))
    first_answered, finish = threading.Event(), threading.Event()

    def staged(items: Sequence[int], batch: Batch) -> None:
        batch.settle(0, items[0] * 10)
        assert finish.wait(10)
        for k in range(1, len(items)):
            batch.settle(k, items[k] * 10)

    release = _gate(pool)
    futures = [pool.submit_batch(staged, i) for i in (1, 2, 3)]
    futures[0].add_done_callback(lambda f: first_answered.set())
    release.set()
    assert first_answered.wait(10) and futures[0].result() == 10
    assert not futures[1].done() and not futures[2].done()  # still running
    finish.set()
    assert [f.result(10) for f in futures[1:]] == [20, 30]
    s = pool.stats()
    assert (s["batches"], s["batched"], s["completed"], s["batch_fallbacks"]) == (1, 3, 4, 0)
    pool.shutdown()


def test_a_batch_failing_after_some_answers_reruns_only_the_rest_alone() -> None:
    pool = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=100, batch_wait_s=0))
    runs: list[list[int]] = []

    def half(items: Sequence[int], batch: Batch) -> None:
        runs.append(list(items))
        batch.settle(0, items[0])
        if len(items) > 1:
            raise MemoryError("the rest did not fit")

    release = _gate(pool)
    futures = [pool.submit_batch(half, i) for i in (1, 2, 3)]
    release.set()
    assert [f.result(10) for f in futures] == [1, 2, 3]
    assert runs == [[1, 2, 3], [2], [3]]  # the answered one is not run again
    assert pool.stats()["batch_fallbacks"] == 1
    pool.shutdown()


def test_an_item_handed_back_runs_as_its_own_job_next() -> None:
    """A batch item that does not batch goes back to the pool: the others are answered without waiting for
    it, and it runs next, before requests that came after it."""
    pool = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=100, batch_wait_s=0))
    order: list[str] = []

    def batched(items: Sequence[str], batch: Batch) -> None:
        for k, item in enumerate(items):
            if item == "slow":
                batch.alone(k, lambda: order.append("slow") or "alone")
            else:
                order.append(item)
                batch.settle(k, item)

    release = _gate(pool)
    futures = [pool.submit_batch(batched, x) for x in ("a", "slow", "b")]
    release.set()
    assert futures[0].result(10) == "a" and futures[2].result(10) == "b"
    assert futures[1].result(10) == "alone"
    later = pool.submit(lambda: order.append("later"))
    later.result(10)
    assert order == ["a", "b", "slow", "later"]
    s = pool.stats()
    assert (s["submitted"], s["completed"]) == (5, 5)  # the gate, 3 items (one run alone), the later job
    pool.shutdown()


def test_an_abandoned_queued_job_leaves_the_queue_at_once() -> None:
    """Before, a cancelled future stayed queued until a worker reached it, and counted against max_queue."""
    pool = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=2, batch_wait_s=0))
    release = _gate(pool)
    ran: list[int] = []
    dead = [pool.submit_batch(_each(ran.append), i) for i in (1, 2)]
    assert all(pool.abandon(f) for f in dead)
    assert pool.stats()["queued"] == 0
    live = [pool.submit_batch(_each(lambda i: ran.append(i) or i), i) for i in (3, 4)]  # the queue has room
    release.set()
    assert [f.result(10) for f in live] == [3, 4]
    for f in dead:
        with pytest.raises(CancelledError):
            f.result(0)
    assert ran == [3, 4]
    assert not pool.abandon(live[0])  # answered already: nothing to abandon
    s = pool.stats()
    assert (s["abandoned"], s["dropped"], s["rejected"], s["completed"]) == (2, 2, 0, 3)
    pool.shutdown()


def test_a_running_batch_sees_which_callers_left_and_skips_them() -> None:
    pool = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=100, batch_wait_s=0))
    started, go_on = threading.Event(), threading.Event()
    ran: list[int] = []

    def two_runs(items: Sequence[int], batch: Batch) -> None:
        ran.append(items[0])
        batch.settle(0, items[0])
        started.set()
        assert go_on.wait(10)
        for k in range(1, len(items)):  # a second model run: only for callers still there
            if batch.gone(k):
                batch.settle(k, Abandoned())
            else:
                ran.append(items[k])
                batch.settle(k, items[k])

    release = _gate(pool)
    futures = [pool.submit_batch(two_runs, i) for i in (1, 2, 3)]
    release.set()
    assert started.wait(10)
    assert pool.abandon(futures[1])
    go_on.set()
    assert futures[2].result(10) == 3
    with pytest.raises(Abandoned):
        futures[1].result(10)
    assert ran == [1, 3]
    s = pool.stats()
    assert (s["abandoned"], s["dropped"], s["completed"]) == (1, 1, 3)  # the gate, items 1 and 3
    pool.shutdown()
