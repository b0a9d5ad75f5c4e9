"""The local Lambda: an Invoke API (starlette on uvicorn) in front of a pool of awslambdaric instances.

Run it in the foreground with `serve()` or in a background thread with `start()` / `stop()` (tests, the
demo, the benchmark); either way shutdown kills every instance's process group before returning.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import random
import secrets
import socket
import threading
import time
import uuid
from types import TracebackType
from typing import Any, Literal

from infra.local import destination
from infra.local.config import LATEST, InvokeMode, Jitter, LocalLambdaConfig
from infra.local.invocation import (
    MAX_RESPONSE_PAYLOAD,
    RESPONSE_TOO_LARGE,
    FunctionNotFound,
    Invocation,
    Outcome,
    QualifierConflict,
    QueueFull,
    Target,
)
from infra.local.pool import InstancePool, Throttled
from infra.local.stream import ResponseStream

# Lambda retries a failed Event invoke twice: about one minute after the first attempt, two after the second.
RETRY_DELAYS_S = (60.0, 120.0)
QUALIFIER_CONFLICT = "The derived qualifier from the function name does not match the specified qualifier."


def jitter_delay(kind: Jitter, scale_ms: float, rng: random.Random) -> float:
    """A routing delay in seconds: uniform on [0, scale], exponential with mean scale, half-normal with
    sigma scale, or exactly scale."""
    if scale_ms <= 0:
        return 0.0
    if kind == "uniform":
        ms = rng.uniform(0.0, scale_ms)
    elif kind == "exponential":
        ms = rng.expovariate(1.0 / scale_ms)
    elif kind == "normal":
        ms = abs(rng.gauss(0.0, scale_ms))
    else:
        ms = scale_ms
    return ms / 1000.0


InvocationType = Literal["RequestResponse", "Event", "DryRun"]


class LocalLambda:
    def __init__(
        self, config: LocalLambdaConfig | None = None, *, history: int = 1000, seed: int | None = None
    ) -> None:
        self.config = config or LocalLambdaConfig()
        self.pool = InstancePool(self.config)
        # Recent invocations, bounded in count and in bytes (each trimmed: see Invocation.trim_for_history).
        self.history: collections.deque[Invocation] = collections.deque()
        self.history_max = history
        self._history_bytes = 0
        self.rng = random.Random(seed)  # routing jitter
        self.endpoint = ""
        self.queued_events = 0  # Event invokes accepted and not finished (retries pending included)
        self.queued_event_bytes = 0
        self.dropped_events: list[dict[str, object]] = []  # on-failure records (also written to on_failure)
        self._writer: destination.RecordWriter | None = None  # writes them to on_failure, off the loop
        self._retries: set[asyncio.TimerHandle] = set()
        self._events: asyncio.Queue[Invocation] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    # -- the function's names ----------------------------------------------------------------------------

    @property
    def function_name(self) -> str:
        return self.config.function_name

    @property
    def region(self) -> str:
        return self.config.region

    @property
    def invoke_mode(self) -> InvokeMode:
        return self.config.invoke_mode

    def resolve(self, name: str, qualifier: str | None) -> Target:
        """Accept a name, name:qualifier, a partial or full ARN, or the emulator's `function`."""
        cfg = self.config
        parts = name.split(":")
        if name.startswith("arn:") and len(parts) in (7, 8):
            if parts[3] != cfg.region or parts[4] != cfg.account_id or parts[5] != "function":
                raise FunctionNotFound(name)
            name, embedded = parts[6], (parts[7] if len(parts) == 8 else None)
        elif len(parts) in (3, 4) and parts[1] == "function":
            name, embedded = parts[2], (parts[3] if len(parts) == 4 else None)
        elif len(parts) == 2:
            name, embedded = parts
        else:
            embedded = None
        if embedded and qualifier and embedded != qualifier:
            raise QualifierConflict(QUALIFIER_CONFLICT)
        qualifier = qualifier or embedded
        if name not in (cfg.function_name, "function"):
            raise FunctionNotFound(f"{cfg.function_arn[: -len(cfg.function_name)]}{name}")
        if qualifier in (None, "", LATEST):
            version = LATEST
        elif qualifier in cfg.versions:
            version = qualifier
        elif qualifier in cfg.aliases:
            version = cfg.aliases[qualifier]
        else:
            raise FunctionNotFound(f"{cfg.function_arn}:{qualifier}")
        arn = cfg.function_arn + (f":{qualifier}" if qualifier else "")
        return Target(version, arn)

    # -- invoking ----------------------------------------------------------------------------------------

    def new_invocation(
        self, target: Target, payload: bytes, *, client_context: str | None = None, request_id: str | None = None
    ) -> Invocation:
        assert self._loop is not None
        now = int(time.time())
        return Invocation(
            request_id=request_id or str(uuid.uuid4()),
            payload=payload,
            version=target.version,
            function_arn=target.arn,
            done=self._loop.create_future(),
            client_context=client_context,
            trace_id=f"Root=1-{now:08x}-{secrets.token_hex(12)};Parent={secrets.token_hex(8)};Sampled=0",
            stream_started=self._loop.create_future(),
        )

    async def invoke(self, inv: Invocation) -> Outcome:
        """RequestResponse: place it (or raise Throttled) and wait for the whole answer. A streamed one is
        gathered (up to the 6 MB a buffered answer may have), as Lambda's Invoke does for a streaming
        function: the bytes as the function streamed them, an HTTP integration prelude included."""
        answer = await self.invoke_streaming(inv)
        if isinstance(answer, Outcome):
            return answer
        body = bytearray()
        async for data in answer.chunks():
            body += data
            if len(body) > MAX_RESPONSE_PAYLOAD:
                answer.discard()
                body.clear()
                break
        outcome = await inv.done
        if outcome.error_type is not None:
            return outcome
        if answer.discarding:
            message = f"Response payload size exceeded maximum allowed payload size ({MAX_RESPONSE_PAYLOAD} bytes)."
            return Outcome.error(RESPONSE_TOO_LARGE, message)
        return Outcome(bytes(body))

    async def invoke_streaming(self, inv: Invocation) -> Outcome | ResponseStream:
        """RequestResponse, for a reader that streams: place it (or raise Throttled), then the response
        stream as soon as the function starts one, else the buffered answer. A reader that stops reading a
        stream must `discard()` it."""
        await self._jitter()
        self.pool.dispatch(inv)
        inv.done.add_done_callback(lambda _f: self._record(inv))
        started = inv.stream_started
        if started is None:
            return await asyncio.shield(inv.done)
        waits: list[asyncio.Future[Any]] = [inv.done, started]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if started.done() and not started.cancelled():
            stream: ResponseStream = started.result()
            return stream
        return inv.done.result()

    async def _jitter(self) -> None:
        delay = jitter_delay(self.config.jitter, self.config.jitter_ms, self.rng)
        if delay > 0:
            await asyncio.sleep(delay)

    def enqueue(self, inv: Invocation) -> None:
        """Event: accepted now (or QueueFull past the queue's bounds), delivered as capacity allows."""
        assert self._events is not None
        cfg = self.config
        size = len(inv.payload)
        if self.queued_events >= cfg.max_queued_events or self.queued_event_bytes + size > cfg.max_queued_event_bytes:
            raise QueueFull
        self.queued_events += 1
        self.queued_event_bytes += size
        inv.is_async = True
        self._events.put_nowait(inv)

    async def _deliver_events(self) -> None:
        assert self._events is not None
        while True:
            inv = await self._events.get()
            await self._jitter()
            while not self.pool.closed:
                if self._too_old(inv):
                    self._drop(inv, "EventAgeExceeded", None)
                    break
                try:
                    self.pool.dispatch(inv)
                except Throttled:  # Lambda keeps async events queued through throttles
                    await self.pool.wait_capacity(0.25)
                    continue
                inv.done.add_done_callback(functools.partial(self._attempt_done, inv))
                if inv.stream_started is not None:  # nobody reads an Event's answer: a stream is dropped
                    inv.stream_started.add_done_callback(_discard_stream)
                break

    def _too_old(self, inv: Invocation, after_s: float = 0.0) -> bool:
        return time.time() + after_s - inv.first_received > self.config.max_event_age_s

    def _attempt_done(self, inv: Invocation, _done: object = None) -> None:
        """An Event attempt ended: done, retried after Lambda's delay, or dropped to the on-failure file."""
        outcome = inv.outcome
        payload = inv.payload  # before history trims it
        self._record(inv)
        if outcome is None or outcome.error_type is None:
            self._event_finished(inv, len(payload))
            return
        if inv.attempt > self.config.max_retry_attempts:
            self._drop(inv, "RetriesExhausted", outcome, payload)
            return
        delay = RETRY_DELAYS_S[inv.attempt - 1] * self.config.async_retry_scale
        if self._too_old(inv, delay):
            self._drop(inv, "EventAgeExceeded", outcome, payload)
            return
        assert self._loop is not None and self._events is not None
        retry = self.new_invocation(
            Target(inv.version, inv.function_arn), payload, client_context=inv.client_context, request_id=inv.request_id
        )
        retry.is_async, retry.attempt, retry.first_received = True, inv.attempt + 1, inv.first_received
        events = self._events

        def resend() -> None:
            self._retries.discard(handle)
            events.put_nowait(retry)

        handle = self._loop.call_later(delay, resend)
        self._retries.add(handle)

    def _event_finished(self, inv: Invocation, size: int) -> None:
        self.queued_events -= 1
        self.queued_event_bytes -= size

    def _drop(self, inv: Invocation, condition: str, outcome: Outcome | None, payload: bytes | None = None) -> None:
        """Lambda's on-failure destination record for an event it gives up on."""
        payload = inv.payload if payload is None else payload
        self._event_finished(inv, len(payload))
        record: dict[str, object] = {
            "version": "1.0",
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}Z",
            "requestContext": {
                "requestId": inv.request_id,
                "functionArn": f"{self.config.function_arn}:{inv.version}",
                "condition": condition,
                "approximateInvokeCount": inv.attempt if outcome is not None else inv.attempt - 1,
            },
            "requestPayload": _json_or_text(payload),
        }
        if outcome is not None:
            context = {"statusCode": 200, "executedVersion": inv.version, "functionError": "Unhandled"}
            record["responseContext"] = context
            record["responsePayload"] = _json_or_text(outcome.payload)
        self.dropped_events.append(record)
        del self.dropped_events[:-100]
        if self._writer is not None:
            self._writer.put(record)

    def _record(self, inv: Invocation) -> None:
        inv.trim_for_history()
        self.history.append(inv)
        self._history_bytes += inv.history_size()
        while self.history and (
            len(self.history) > self.history_max or self._history_bytes > self.config.history_bytes
        ):
            self._history_bytes -= self.history.popleft().history_size()

    # -- serving -----------------------------------------------------------------------------------------

    def _bind(self) -> socket.socket:
        # proto must say IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only when it does, and
        # uvicorn writes headers and body separately (Nagle + delayed ACK = 40 ms per response otherwise).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.config.host, self.config.port))
        host, port = sock.getsockname()[:2]
        self.endpoint = f"http://{host}:{port}"
        return sock

    async def serve(self, ready: threading.Event | None = None) -> None:
        """Serve until `stop()` (or cancellation), then shut everything down."""
        import uvicorn  # deferred: `warmstart pack` and friends never pay for it

        from infra.local.invoke_api import build_app  # starlette too

        if self.config.on_failure:  # refused now rather than lost with the first dropped event
            destination.check(self.config.on_failure)
            self._writer = destination.RecordWriter(self.config.on_failure)
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._events = asyncio.Queue()
        sock = self._bind()
        self.pool.start()
        server = uvicorn.Server(
            uvicorn.Config(
                build_app(self), log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2
            )
        )
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        delivering = asyncio.ensure_future(self._deliver_events())
        try:
            while not server.started and not serving.done():
                await asyncio.sleep(0.005)
            if serving.done():
                serving.result()  # startup failed: raise it
            if ready is not None:
                ready.set()
            await self._stopping.wait()
        finally:
            delivering.cancel()
            for handle in self._retries:
                handle.cancel()
            await self.pool.close()  # answers pending invokes, kills process groups, waits for exits
            server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await serving
            sock.close()
            if self._writer is not None:
                await asyncio.to_thread(self._writer.close)  # what was dropped last, written (bounded wait)

    def retire_idle(self, timeout: float = 10.0) -> int:
        """From another thread: retire every idle instance and wait for their exits (the next invoke is a
        cold start, or a restore with --snapshot; templates stay). Returns how many were retired."""
        assert self._loop is not None

        async def retire() -> int:
            idle = [i for i in self.pool.instances.values() if i.free and i.state == "ready"]
            for inst in idle:
                self.pool.retire(inst)
            waits = [i.exited for i in idle if i.exited is not None]
            if waits:
                await asyncio.wait(waits, timeout=timeout)
            return len(idle)

        return asyncio.run_coroutine_threadsafe(retire(), self._loop).result(timeout + 5)

    def request_stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)

    def start(self, timeout: float = 30.0) -> str:
        """Serve on a background thread; returns the endpoint URL once it accepts requests."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(self.serve(ready))
            except BaseException as exc:
                failure.append(exc)
                ready.set()

        self._thread = threading.Thread(target=run, name="local-lambda", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError("the local Lambda did not start")
        if failure:
            raise failure[0]
        return self.endpoint

    def stop(self, timeout: float = 15.0) -> None:
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError("the local Lambda did not stop")
            self._thread = None

    def __enter__(self) -> LocalLambda:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _discard_stream(started: asyncio.Future[ResponseStream]) -> None:
    if not started.cancelled():
        started.result().discard()


def _json_or_text(data: bytes) -> object:
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace")
