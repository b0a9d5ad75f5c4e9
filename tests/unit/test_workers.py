"""The worker pool: sizing policy (pure), hard bounds, the bounded queue, errors carried to the caller."""

from __future__ import annotations

import threading
import time

import pytest

from handler.core.errors import ServiceBusyError
from handler.runtime.workers import Sizing, WorkerPool, decide, sizing_from_environ


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
    assert (sizing_from_environ({}, cpus=1).max_workers, sizing_from_environ({}, cpus=1).max_queue) == (2, 16)
    assert (sizing_from_environ({}, cpus=4).max_workers, sizing_from_environ({}, cpus=4).max_queue) == (4, 32)
    s = sizing_from_environ({"WARMSTART_WORKERS_MAX": "6", "WARMSTART_QUEUE_MAX": "9"}, cpus=2)
    assert (s.max_workers, s.max_queue) == (6, 9)
