"""A bounded worker pool with a bounded queue, sized from load with hysteresis and hard bounds, and
dynamic batching: queued requests with the same batch key run as one call.

Inference runs here; warm pings and status requests never do (their callers answer them inline), so they
are never stuck behind a model run. When the queue is full a request is refused at once with 503
(`ServiceBusyError`) instead of waiting without bound.

Batching (`submit_batch`): a worker that takes a request also takes every queued request with the same key,
up to `max_batch`, and runs them in one call of the key, `run_many(items, batch)`, which answers each item
through `batch.settle(i, outcome)` the moment that item's outcome is ready (a small request batched with a
large one is answered after its own model run, not after the whole batch). When others were already waiting
as it took the first (the instance is under load), it waits up to `batch_wait_s` for more to fill the batch;
with nothing queued it runs at once, so a lone request never waits. An item the call cannot run with the
others (a route or task that does not batch) goes back with `batch.alone(i, call)`, to run as its own job next.
A batch call that fails as a whole is run again one request at a time, for the items it had not answered.

Callers that leave (`abandon`): a queued request leaves the queue at once (its place is free for a live one);
a running one is marked, and a batch call skips it before its next model run (`batch.gone(i)`).

Sizing: one more worker when requests have been waiting for `grow_after` consecutive checks and the
process is not already using the CPUs it has (more threads on saturated cores only add latency); one less
when a worker has found nothing to do for `idle_s`. Growing is quick and shrinking slow: that gap is the
hysteresis. Never fewer than `min_workers`, never more than `max_workers`.

About one thing (one queue and the workers that take from it: its admission, batching, abandonment and
sizing each change the others' counts under the same lock), hence its length.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol, TypeVar

from handler.core.config import Config, env_int
from handler.core.errors import Abandoned, ServiceBusyError
from handler.runtime.pieces import DEFAULT_BOUND, Stream, job_done, pump

T = TypeVar("T")


class Batch(Protocol):
    """What a batch call gets beside its items (`WorkerPool.submit_batch`)."""

    def settle(self, index: int, outcome: Any) -> None:
        """Item `index` is done: its result, or an exception as its own error (`Abandoned`: it was dropped)."""

    def gone(self, index: int) -> bool:
        """True once item `index`'s caller has left: the call may skip it (then settle it `Abandoned()`)."""

    def alone(self, index: int, call: Callable[[], Any]) -> None:
        """Item `index` runs as its own job, next in the queue: `call()` gives its result."""


# A batch key: called with the items of one batch, it settles each through the `Batch` before returning.
RunMany = Callable[[Sequence[Any], Batch], None]


@dataclass(frozen=True)
class Sizing:
    min_workers: int = 1
    max_workers: int = 4
    max_queue: int = 64
    grow_after: int = 2  # consecutive checks with requests waiting
    cpu_high: float = 0.9  # of the CPUs this process may use
    idle_s: float = 10.0  # a worker idle this long retires (down to min_workers)
    check_s: float = 0.05  # at most one sizing decision per interval
    max_batch: int = 32  # requests one worker takes into one batch
    batch_tokens: int = Config.batch_tokens  # padded tokens (rows x longest) of one model run (one source)
    batch_wait_s: float = 0.002  # under load only: how long a batch may wait for more requests


def decide(workers: int, waiting: int, cpu: float, streak: int, sizing: Sizing) -> tuple[int, int]:
    """(workers wanted, new backlog streak): pure, so the policy is tested without threads or clocks."""
    streak = streak + 1 if waiting > 0 else 0
    if streak >= sizing.grow_after and cpu < sizing.cpu_high and workers < sizing.max_workers:
        return workers + 1, 0
    return workers, streak


class _Job:
    __slots__ = ("call", "future", "gone", "item", "key", "running")

    def __init__(
        self, future: Future[Any], call: Callable[[], Any] | None, key: Hashable, item: Any, running: bool = False
    ) -> None:
        self.future, self.call, self.key, self.item = future, call, key, item
        self.running = running  # its future is already running (an item a batch handed back)
        self.gone = False  # its caller left while it ran


class _Batch:
    """The pool's side of one batch call: each job's future set once, when its item is settled."""

    __slots__ = ("handed", "jobs", "pool", "settled", "skipped")

    def __init__(self, pool: WorkerPool, jobs: list[_Job]) -> None:
        self.pool, self.jobs = pool, jobs
        self.settled = [False] * len(jobs)
        self.handed = 0  # items handed back to run alone: counted as completed when they run
        self.skipped = 0  # items settled `Abandoned`: dropped, not completed

    def settle(self, index: int, outcome: Any) -> None:
        if self.settled[index]:
            return
        self.settled[index] = True
        future = self.jobs[index].future
        if isinstance(outcome, Abandoned):
            self.skipped += 1
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    def gone(self, index: int) -> bool:
        return self.jobs[index].gone

    def alone(self, index: int, call: Callable[[], Any]) -> None:
        if self.settled[index]:
            return
        self.settled[index] = True
        self.handed += 1
        job = self.jobs[index]
        self.pool._requeue(_Job(job.future, call, None, None, running=True))

    def unsettled(self) -> list[_Job]:
        return [job for job, done in zip(self.jobs, self.settled, strict=True) if not done]


class WorkerPool:
    def __init__(self, sizing: Sizing | None = None, cpus: int = 1, name: str = "warmstart-worker") -> None:
        self.sizing = sizing or Sizing()
        self.cpus = max(1, cpus)
        self.name = name
        self._jobs: deque[_Job | None] = deque()  # None: a worker's stop signal
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
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
        self.batches = 0  # batch calls run (of any size)
        self.batched = 0  # requests answered by them
        self.largest_batch = 0
        self.batch_fallbacks = 0  # batch calls that failed as a whole and were run one request at a time
        self.abandoned = 0  # requests whose caller left before their answer
        self.dropped = 0  # of those, never run: taken out of the queue, or skipped by their batch
        self._running: list[_Batch] = []  # batch calls under way (`abandon` marks their jobs)
        for _ in range(self.sizing.min_workers):
            self._spawn()

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()
        self._put(_Job(future, lambda: fn(*args), None, None))
        return future

    def submit_stream(self, pieces: Callable[..., Iterator[Any]], *args: Any, bound: int = DEFAULT_BOUND) -> Stream:
        """Queue a job whose answer is a sequence of pieces: `pieces(*args)` runs on a worker and each piece it
        yields reaches the returned `Stream` as it is made, at most `bound` ahead of the consumer. The consumer
        leaving (`Stream.close`) takes a queued job out of the queue, and stops a running one at its next
        piece, freeing the worker. Refused like `submit` (ServiceBusyError) when the queue is full."""
        future: Future[int] = Future()
        stream = Stream(bound, future, leave=partial(self.abandon, future))
        self._put(_Job(future, partial(pump, stream, partial(pieces, *args)), None, None))
        future.add_done_callback(partial(job_done, stream))
        return stream

    def submit_batch(self, run_many: RunMany, item: Any) -> Future[Any]:
        """Queue `item`; it runs in a call `run_many([item, ...], batch)` with others queued under the same key
        (`run_many`, compared with ==: a bound method is the same key each time it is looked up)."""
        future: Future[Any] = Future()
        self._put(_Job(future, None, run_many, item))
        return future

    def _put(self, job: _Job) -> None:
        with self._lock:
            if self._draining is not None:
                self.rejected += 1
                raise ServiceBusyError(self._draining)
            if len(self._jobs) >= self.sizing.max_queue:
                self.rejected += 1
                raise ServiceBusyError(
                    f"{self.sizing.max_queue} requests already waiting; retry shortly (instance at capacity)"
                )
            self._jobs.append(job)
            self.submitted += 1
            self._ready.notify()
        self._maybe_resize()

    def _requeue(self, job: _Job) -> None:
        """A job already admitted (an item a batch handed back) goes ahead of every new one, past `max_queue`
        (it was counted when it came), behind those handed back before it (in their order)."""
        with self._lock:
            at = 0
            while at < len(self._jobs) and (ahead := self._jobs[at]) is not None and ahead.running:
                at += 1
            self._jobs.insert(at, job)
            self._ready.notify()

    def abandon(self, future: Future[Any]) -> bool:
        """The caller waiting on `future` has left. Queued: out of the queue at once (its place is free),
        the future cancelled. Running: marked, so its batch skips it before the next model run. False when
        it was already answered."""
        with self._lock:
            if future.done():
                return False
            self.abandoned += 1
            queued = True
            for job in self._jobs:
                if job is not None and job.future is future:
                    self._jobs.remove(job)
                    self.dropped += 1
                    break
            else:
                for batch in self._running:
                    for job in batch.jobs:
                        if job.future is future:
                            job.gone = True
                queued = False
        if queued:
            if not future.cancel():  # an item a batch handed back: its future was already running
                future.set_exception(Abandoned())
        elif future.cancel():  # taken by a worker, not yet started: it will skip it
            with self._lock:
                self.dropped += 1
        return True

    def reserve(self, workers: int) -> None:
        """Keep at least `workers` workers, started now: for jobs that mostly wait (streams from an engine that
        runs their steps on its own thread), so the CPU check that bounds growth must not hold them back."""
        with self._lock:
            if workers <= self.sizing.min_workers:
                return
            self.sizing = replace(self.sizing, min_workers=workers, max_workers=max(workers, self.sizing.max_workers))
        while self._workers < workers:
            self._spawn()

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
            waiting = len(self._jobs)
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

    def _gather_locked(self, key: Hashable, batch: list[_Job]) -> None:
        """Move queued jobs with `key` into `batch` (in arrival order), up to `max_batch`; the rest keep
        their places."""
        room = self.sizing.max_batch - len(batch)
        if room <= 0 or not self._jobs:
            return
        kept: deque[_Job | None] = deque()
        for job in self._jobs:
            if room > 0 and job is not None and job.key is not None and job.key == key:
                batch.append(job)
                room -= 1
            else:
                kept.append(job)
        self._jobs = kept

    def _take(self) -> list[_Job] | None:
        """The next job, with its batch-mates; None: stop (shutdown, or retired after `idle_s` idle)."""
        sizing = self.sizing
        with self._lock:
            deadline = time.monotonic() + sizing.idle_s
            while not self._jobs:
                left = deadline - time.monotonic()
                if left <= 0:
                    if self._workers > sizing.min_workers:
                        self._workers -= 1
                        self.retired += 1
                        return None
                    deadline = time.monotonic() + sizing.idle_s
                    continue
                self._ready.wait(left)
            first = self._jobs.popleft()
            if first is None:
                return None
            batch = [first]
            if first.key is None:
                return batch
            loaded = bool(self._jobs)  # others were waiting: the instance is busy, a short wait fills a batch
            self._gather_locked(first.key, batch)
            if loaded and sizing.batch_wait_s > 0 and len(batch) < sizing.max_batch:
                until = time.monotonic() + sizing.batch_wait_s
                while len(batch) < sizing.max_batch and (left := until - time.monotonic()) > 0:
                    self._ready.wait(left)
                    self._gather_locked(first.key, batch)
            if self._jobs:
                self._ready.notify()  # what is left (other keys, past max_batch) is another worker's
            return batch

    def _work(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            batch = [job for job in batch if job.running or job.future.set_running_or_notify_cancel()]
            if not batch:
                continue
            with self._lock:
                self._busy += 1
            handed = skipped = 0
            try:
                if batch[0].key is None:
                    _run_one(batch[0])
                else:
                    handed, skipped = self._run_batch(batch)
            finally:
                with self._lock:
                    self._busy -= 1
                    self.completed += len(batch) - handed - skipped
                    self.dropped += skipped
            del batch  # drop the requests' objects now, not when the next one arrives
            self._maybe_resize()

    def _run_batch(self, jobs: list[_Job]) -> tuple[int, int]:
        """One batch call; returns how many items it handed back to run alone, and how many it skipped."""
        run_many = jobs[0].key
        assert callable(run_many)
        batch = _Batch(self, jobs)
        with self._lock:
            self.batches += 1
            self.batched += len(jobs)
            self.largest_batch = max(self.largest_batch, len(jobs))
            self._running.append(batch)
        try:
            try:
                run_many([job.item for job in jobs], batch)
                left = batch.unsettled()
                if left:
                    raise RuntimeError(f"a batch of {len(jobs)} left {len(left)} unanswered")
            except BaseException as e:
                left = batch.unsettled()
                if len(jobs) == 1:
                    if left:
                        batch.settle(0, e)
                    return batch.handed, batch.skipped
                # The batch failed as a whole: what it had not answered runs alone, each with its own outcome.
                with self._lock:
                    self.batch_fallbacks += 1
                for job in left:
                    alone = _Batch(self, [job])
                    try:
                        if job.gone:
                            alone.settle(0, Abandoned())
                        else:
                            run_many([job.item], alone)
                        if alone.unsettled():
                            raise RuntimeError("a batch of 1 left it unanswered") from None
                    except BaseException as error:
                        alone.settle(0, error)
                    batch.handed += alone.handed
                    batch.skipped += alone.skipped
        finally:
            with self._lock:
                self._running.remove(batch)
        return batch.handed, batch.skipped

    def drain(self, reason: str) -> int:
        """Graceful shutdown, first step: refuse new requests and fail every queued-but-unstarted one at once
        with `ServiceBusyError(reason)`; requests already running go on. Returns how many were failed."""
        with self._lock:
            self._draining = reason
            queued = [job for job in self._jobs if job is not None]
            # A shutdown already under way keeps its stop signals.
            self._jobs = deque(job for job in self._jobs if job is None)
        failed = 0
        for job in queued:
            if job.running or job.future.set_running_or_notify_cancel():
                job.future.set_exception(ServiceBusyError(reason))
                failed += 1
        with self._lock:
            self.rejected += failed
        return failed

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            self._jobs.extend([None] * self._workers)
            self._ready.notify_all()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "workers": self._workers,
                "busy": self._busy,
                "draining": self._draining is not None,
                "queued": sum(job is not None for job in self._jobs),
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
                "max_batch": self.sizing.max_batch,
                "batch_tokens": self.sizing.batch_tokens,
                "batch_wait_ms": round(self.sizing.batch_wait_s * 1000, 3),
                "batches": self.batches,
                "batched": self.batched,
                "largest_batch": self.largest_batch,
                "batch_fallbacks": self.batch_fallbacks,
                "abandoned": self.abandoned,
                "dropped": self.dropped,
            }


def _run_one(job: _Job) -> None:
    assert job.call is not None
    try:
        job.future.set_result(job.call())
    except BaseException as e:
        job.future.set_exception(e)


# Queued requests per worker before 503: one full batch each. With batching, a closed loop of N clients
# never has more than N requests in the queue, so N <= max_queue gets no 503, and N <= workers x max_batch
# means each request waits for at most one batch ahead of it (bench/load/run.py measures the trade).
BATCHES_QUEUED_PER_WORKER = 1
DEFAULT_MAX_BATCH = Sizing.max_batch
DEFAULT_BATCH_TOKENS = Sizing.batch_tokens
DEFAULT_BATCH_WAIT_MS = 2


def sizing_from_environ(environ: Mapping[str, str], cpus: int, batch_tokens: int | None = None) -> Sizing:
    """WARMSTART_WORKERS_MIN (default 1), WARMSTART_WORKERS_MAX (default: the usable CPUs: with batching one
    worker per CPU keeps them busy, and each worker's run gets a CPU to itself), WARMSTART_BATCH_MAX (requests
    per batch, default 32), WARMSTART_BATCH_TOKENS (padded tokens per model run, default 8192),
    WARMSTART_BATCH_WAIT_MS (default 2; 0: never wait) and WARMSTART_QUEUE_MAX (default: one full batch per
    worker). `cpus` is the quota's (`handler.core.cpu`), never the host's core count, so all follow the CPU
    the instance really has. `batch_tokens`: the loaded model's (handler.core.memory, WARMSTART_BATCH_TOKENS
    included), so the pool groups requests as the model runs them; None (a pool made before the model
    loads): the setting, until `Host.start` hands it the model's."""
    max_workers = env_int(environ, "WARMSTART_WORKERS_MAX", max(1, cpus), 1, 256)
    max_batch = env_int(environ, "WARMSTART_BATCH_MAX", DEFAULT_MAX_BATCH, 1, 4096)
    default_queue = BATCHES_QUEUED_PER_WORKER * max_batch * max_workers
    return Sizing(
        min_workers=env_int(environ, "WARMSTART_WORKERS_MIN", 1, 1, max_workers),
        max_workers=max_workers,
        max_queue=env_int(environ, "WARMSTART_QUEUE_MAX", default_queue, 1, 100_000),
        max_batch=max_batch,
        batch_tokens=batch_tokens or env_int(environ, "WARMSTART_BATCH_TOKENS", DEFAULT_BATCH_TOKENS, 1, 1 << 24),
        batch_wait_s=env_int(environ, "WARMSTART_BATCH_WAIT_MS", DEFAULT_BATCH_WAIT_MS, 0, 1000) / 1000,
    )
