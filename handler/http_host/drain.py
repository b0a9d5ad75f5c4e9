"""Graceful shutdown of the HTTP host: what SIGTERM starts (Cloud Run, Knative, Kubernetes scale-in).

The moment the signal arrives (`begin`, scheduled on the event loop from the signal handler):

1. `/ping`, `/healthz` and `/health` answer 503: the platform stops routing here;
2. requests queued but not started are answered at once, 503 `ServiceBusyError` with `Retry-After`
   (another instance can take them now; this one would only make them wait);
3. new requests, on connections still open, get the same 503;
4. requests already running finish, for up to `drain_s` seconds; one still running then is answered 503
   `ServiceBusyError` too (its worker finishes in the background), so no client ever gets uvicorn's
   plain-text 500 from a cancelled task.

The server (uvicorn) stops accepting connections on the same signal and exits once every answer is sent.
Answers go through `track`, which chains a worker's future to an asyncio future this class can settle
early: cheaper than a task per request, and nothing is cancelled under a running model.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import Future
from typing import Any

from handler.core.errors import ServiceBusyError
from handler.runtime.workers import WorkerPool

SHUTTING_DOWN = "instance is shutting down; retry (another instance will answer)"


class Drain:
    def __init__(self, drain_s: float) -> None:
        self.drain_s = drain_s
        self.started: float | None = None  # time.monotonic() when draining began
        self.failed_queued = 0  # queued requests answered 503 at once
        self.expired = 0  # running requests answered 503 when the drain time ran out
        self._loop: asyncio.AbstractEventLoop | None = None
        self._workers: WorkerPool | None = None
        self._pending: set[asyncio.Future[Any]] = set()

    @property
    def draining(self) -> bool:
        return self.started is not None

    def bind(self, loop: asyncio.AbstractEventLoop, workers: WorkerPool) -> None:
        """At startup: the loop answers run on and the pool whose queue a drain empties."""
        self._loop, self._workers = loop, workers

    def begin_threadsafe(self) -> None:
        """Safe from a signal handler or any thread: `begin` runs on the loop at its next turn."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.begin)

    def begin(self) -> None:
        if self.started is not None:
            return
        self.started = time.monotonic()
        if self._workers is not None:
            self.failed_queued = self._workers.drain(SHUTTING_DOWN)
        if self._loop is not None:
            self._loop.call_later(self.drain_s, self.expire)

    def expire(self) -> None:
        """The drain time is over: whatever is still running is answered now."""
        for answer in list(self._pending):
            if not answer.done():
                answer.set_exception(ServiceBusyError(f"{SHUTTING_DOWN}; the drain time of {self.drain_s} s ran out"))
                self.expired += 1

    def check(self) -> None:
        """Refuse a new request while draining."""
        if self.started is not None:
            raise ServiceBusyError(SHUTTING_DOWN)

    def track(self, future: Future[Any]) -> asyncio.Future[Any]:
        """An awaitable for a worker's future that `expire` can settle early."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()
        self._pending.add(answer)
        answer.add_done_callback(self._pending.discard)

        def done(f: Future[Any]) -> None:  # on the worker thread
            # RuntimeError: the loop is closed, the process is exiting and nobody waits for this answer.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, answer, f)

        future.add_done_callback(done)
        return answer

    def describe(self) -> dict[str, Any]:
        return {
            "draining": self.draining,
            "drain_s": self.drain_s,
            "failed_queued": self.failed_queued,
            "expired": self.expired,
        }


def _settle(answer: asyncio.Future[Any], future: Future[Any]) -> None:
    if answer.done():  # answered by `expire`, or the client went away
        return
    if future.cancelled():
        answer.set_exception(ServiceBusyError(SHUTTING_DOWN))
        return
    error = future.exception()
    if error is not None:
        answer.set_exception(error)
    else:
        answer.set_result(future.result())
