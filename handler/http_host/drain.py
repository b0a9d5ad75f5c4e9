"""Graceful shutdown of the HTTP host: what SIGTERM starts (Cloud Run, Knative, Kubernetes scale-in).

The moment the signal arrives (`begin`, scheduled on the event loop from the signal handler):

1. `/ping`, `/healthz` and `/health` answer 503: the platform stops routing here;
2. requests queued but not started are answered at once, 503 `ServiceBusyError` with `Retry-After`
   (another instance can take them now; this one would only make them wait);
3. new requests, on connections still open, get the same 503;
4. requests already running finish, for up to `drain_s` seconds; one still running then (or whose body is
   still uploading) is answered 503 `ServiceBusyError` too (its worker finishes in the background), so no
   client ever gets uvicorn's plain-text 500 from a cancelled task;
5. every answer sent from then on carries `Connection: close` (`CloseWhileDraining`), and uvicorn closes
   the connection after it: a keep-alive client (an SDK's pool, a proxy) opens a new connection for its next
   request, which the closed port refuses, instead of sending it on a connection about to be dropped.

The listening socket closes in the same turn of the loop (`on_begin`, the server's), so no connection is
accepted after the first `Connection: close` answer. Connections idle at that moment stay open until their
keep-alive time or the drain's end (`handler.http_host.protocol`), answering 503 whatever arrives on them,
and the process exits once every connection is closed. Answers go through `track`, which chains a worker's
future to an asyncio future this class can settle early: cheaper than a task per request, and nothing is
cancelled under a running model.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from handler.core.errors import RequestError, ServiceBusyError
from handler.runtime.workers import WorkerPool

SHUTTING_DOWN = "instance is shutting down; retry (another instance will answer)"
T = TypeVar("T")


class RequestTimeoutError(RequestError):
    """The request's headers or body did not arrive within the host's time for them
    (`WARMSTART_HTTP_HEADER_TIMEOUT_S`, `WARMSTART_HTTP_BODY_TIMEOUT_S`)."""

    status = 408


class Drain:
    def __init__(self, drain_s: float) -> None:
        self.drain_s = drain_s
        self.started: float | None = None  # time.monotonic() when draining began
        self.failed_queued = 0  # queued requests answered 503 at once
        self.expired = 0  # running requests answered 503 when the drain time ran out
        self._loop: asyncio.AbstractEventLoop | None = None
        self._workers: WorkerPool | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        self._reads: set[asyncio.Timeout] = set()  # body reads under way: the drain's end bounds them too
        self.ends_at: float | None = None  # loop.time() when the drain time runs out
        self.on_begin: list[Callable[[], None]] = []  # the server's: close the listening socket

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
        for hook in self.on_begin:
            hook()
        if self._workers is not None:
            self.failed_queued = self._workers.drain(SHUTTING_DOWN)
        if self._loop is not None:
            self.ends_at = self._loop.time() + self.drain_s
            self._loop.call_at(self.ends_at, self.expire)
            for read in self._reads:
                when = read.when()
                read.reschedule(self.ends_at if when is None else min(when, self.ends_at))

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

    async def read(self, body: Awaitable[T], timeout_s: float) -> T:
        """Await a request body for at most `timeout_s` (then 408 `RequestTimeoutError`) and never past the
        drain's end (then 503 `ServiceBusyError`, like a request still running then)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            async with asyncio.timeout_at(deadline if self.ends_at is None else min(deadline, self.ends_at)) as scope:
                self._reads.add(scope)
                try:
                    return await body
                finally:
                    self._reads.discard(scope)
        except TimeoutError:
            if self.ends_at is not None and self.ends_at <= deadline:
                self.expired += 1
                raise ServiceBusyError(f"{SHUTTING_DOWN}; the drain time of {self.drain_s} s ran out") from None
            raise RequestTimeoutError(f"the request body did not arrive within {timeout_s:g} s") from None

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

    async def answer(self, future: Future[T], receive: Receive) -> T:
        """A worker's answer, through `track`; `ClientDisconnect` as soon as the client leaves instead (the
        caller then abandons the job, so a request nobody waits for never holds a place in the queue). One
        task per request watches `receive`: the only way ASGI tells of a disconnect while the body is read."""
        answer = self.track(future)
        left = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((answer, left), return_when=asyncio.FIRST_COMPLETED)
        finally:
            left.cancel()
            if not answer.done():
                answer.cancel()  # never settled later with an error nobody retrieves
        if answer.cancelled():
            raise ClientDisconnect()
        result: T = answer.result()
        return result

    def describe(self) -> dict[str, Any]:
        return {
            "draining": self.draining,
            "drain_s": self.drain_s,
            "failed_queued": self.failed_queued,
            "expired": self.expired,
        }


class CloseWhileDraining:
    """ASGI: once draining began, every answer carries `Connection: close`, whatever route or error made it
    (uvicorn then closes the connection once the answer is sent)."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app, self.drain = app, drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start" and self.drain.draining:
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, closing)


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone (the body was read before: nothing else comes on `receive`)."""
    while (await receive())["type"] != "http.disconnect":
        pass


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
