"""A bounded worker pool with a bounded queue, sized from load with hysteresis and hard bounds.

Inference runs here; warm pings and status requests never do (their callers answer them inline), so they
are never stuck behind a model run. When the queue is full a request is refused at once with 503
(`ServiceBusyError`) instead of waiting without bound.

Sizing: one more worker when requests have been waiting for `grow_after` consecutive checks and the
process is not already using the CPUs it has (more threads on saturated cores only add latency); one less
when a worker has found nothing to do for `idle_s`. Growing is quick and shrinking slow: that gap is the
hysteresis. Never fewer than `min_workers`, never more than `max_workers`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from handler.core.config import env_int
from handler.core.errors import ServiceBusyError

T = TypeVar("T")


@dataclass(frozen=True)
class Sizing:
    min_workers: int = 1
    max_workers: int = 4
    max_queue: int = 64
    grow_after: int = 2  # consecutive checks with requests waiting
    cpu_high: float = 0.9  # of the CPUs this process may use
    idle_s: float = 10.0  # a worker idle this long retires (down to min_workers)
    check_s: float = 0.05  # at most one sizing decision per interval


def decide(workers: int, waiting: int, cpu: float, streak: int, sizing: Sizing) -> tuple[int, int]:
    """(workers wanted, new backlog streak): pure, so the policy is tested without threads or clocks."""
    streak = streak + 1 if waiting > 0 else 0
    if streak >= sizing.grow_after and cpu < sizing.cpu_high and workers < sizing.max_workers:
        return workers + 1, 0
    return workers, streak


class WorkerPool:
    def __init__(self, sizing: Sizing | None = None, cpus: int = 1, name: str = "warmstart-worker") -> None:
        self.sizing = sizing or Sizing()
        self.cpus = max(1, cpus)
        self.name = name
        self._queue: queue.Queue[tuple[Future[Any], Callable[[], Any]] | None] = queue.Queue(self.sizing.max_queue)
        self._lock = threading.Lock()
        self._workers = 0
        self._busy = 0
        self._serial = 0
        self._streak = 0
        self._closed = False
        self._draining: str | None = None  # why new requests are refused (graceful shutdown)
        self._last_check = time.monotonic()
        self._last_cpu = time.process_time()
        self.cpu = 0.0
        self.submitted = 0
        self.rejected = 0
        self.completed = 0
        self.grown = 0
        self.retired = 0
        self.high_water = 0
        for _ in range(self.sizing.min_workers):
            self._spawn()

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()
        if self._draining is not None:
            with self._lock:
                self.rejected += 1
            raise ServiceBusyError(self._draining)
        try:
            self._queue.put_nowait((future, lambda: fn(*args)))
        except queue.Full:
            with self._lock:
                self.rejected += 1
            raise ServiceBusyError(
                f"{self.sizing.max_queue} requests already waiting; retry shortly (instance at capacity)"
            ) from None
        with self._lock:
            self.submitted += 1
        self._maybe_resize()
        return future

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` on a worker and wait for it (the synchronous callers: Lambda mode)."""
        return self.submit(fn, *args).result()

    def _maybe_resize(self) -> None:
        now = time.monotonic()
        with self._lock:
            if self._closed or now - self._last_check < self.sizing.check_s:
                return
            cpu_now = time.process_time()
            # Process CPU seconds per wall second per usable CPU: 1.0 means every CPU we have is busy.
            self.cpu = (cpu_now - self._last_cpu) / max(now - self._last_check, 1e-6) / self.cpus
            self._last_check, self._last_cpu = now, cpu_now
            waiting = self._queue.qsize()
            self.high_water = max(self.high_water, waiting)
            wanted, self._streak = decide(self._workers, waiting, self.cpu, self._streak, self.sizing)
            grow = wanted > self._workers
        if grow:
            self._spawn()

    def _spawn(self) -> None:
        with self._lock:
            if self._workers >= self.sizing.max_workers:
                return
            self._workers += 1
            self._serial += 1
            if self._serial > self.sizing.min_workers:
                self.grown += 1
            name = f"{self.name}-{self._serial}"
        threading.Thread(target=self._work, name=name, daemon=True).start()

    def _work(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self.sizing.idle_s)
            except queue.Empty:
                with self._lock:
                    if self._workers > self.sizing.min_workers:
                        self._workers -= 1
                        self.retired += 1
                        return
                continue
            if item is None:  # shutdown
                return
            future, job = item
            if not future.set_running_or_notify_cancel():
                continue
            with self._lock:
                self._busy += 1
            try:
                future.set_result(job())
            except BaseException as e:
                future.set_exception(e)
            finally:
                with self._lock:
                    self._busy -= 1
                    self.completed += 1
            del future, job, item  # drop the request's objects now, not when the next one arrives
            self._maybe_resize()

    def drain(self, reason: str) -> int:
        """Graceful shutdown, first step: refuse new requests and fail every queued-but-unstarted one at once
        with `ServiceBusyError(reason)`; requests already running go on. Returns how many were failed."""
        with self._lock:
            self._draining = reason
        failed, sentinels = 0, 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                sentinels += 1
                continue
            future, _ = item
            if future.set_running_or_notify_cancel():
                future.set_exception(ServiceBusyError(reason))
                failed += 1
        for _ in range(sentinels):  # a shutdown already under way keeps its stop signals
            self._queue.put_nowait(None)
        with self._lock:
            self.rejected += failed
        return failed

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            workers = self._workers
        for _ in range(workers):
            try:
                self._queue.put(None, timeout=1)
            except queue.Full:
                break

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "workers": self._workers,
                "busy": self._busy,
                "draining": self._draining is not None,
                "queued": self._queue.qsize(),
                "queue_high_water": self.high_water,
                "min_workers": self.sizing.min_workers,
                "max_workers": self.sizing.max_workers,
                "max_queue": self.sizing.max_queue,
                "cpu_use": round(self.cpu, 3),
                "submitted": self.submitted,
                "completed": self.completed,
                "rejected": self.rejected,
                "grown": self.grown,
                "retired": self.retired,
            }


# Requests waiting per worker before 503: enough to keep every worker busy through a burst, few enough that
# a request is never queued for more than a few service times (bench/bench_load.py measures the trade).
QUEUE_PER_WORKER = 8


def sizing_from_environ(environ: Mapping[str, str], cpus: int) -> Sizing:
    """WARMSTART_WORKERS_MIN (default 1), WARMSTART_WORKERS_MAX (default: the usable CPUs, at least 2) and
    WARMSTART_QUEUE_MAX (default: 8 per worker). `cpus` is the quota's (`handler.core.cpu`), never the host's
    core count, so both follow the CPU the instance really has."""
    max_workers = env_int(environ, "WARMSTART_WORKERS_MAX", max(2, cpus), 1, 256)
    return Sizing(
        min_workers=env_int(environ, "WARMSTART_WORKERS_MIN", 1, 1, max_workers),
        max_workers=max_workers,
        max_queue=env_int(environ, "WARMSTART_QUEUE_MAX", QUEUE_PER_WORKER * max_workers, 1, 100_000),
    )
