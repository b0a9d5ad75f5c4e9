"""The local Lambda: an Invoke API (starlette on uvicorn) in front of a pool of awslambdaric instances.

Run it in the foreground with `serve()` or in a background thread with `start()` / `stop()` (tests, the
demo, the benchmark); either way shutdown kills every instance's process group before returning.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import secrets
import socket
import threading
import time
import uuid
from types import TracebackType
from typing import Literal

from infra.local.config import LATEST, LocalLambdaConfig
from infra.local.invocation import FunctionNotFound, Invocation, Outcome, Target
from infra.local.pool import InstancePool, Throttled

InvocationType = Literal["RequestResponse", "Event", "DryRun"]


class LocalLambda:
    def __init__(self, config: LocalLambdaConfig | None = None, *, history: int = 1000) -> None:
        self.config = config or LocalLambdaConfig()
        self.pool = InstancePool(self.config)
        self.history: collections.deque[Invocation] = collections.deque(maxlen=history)
        self.endpoint = ""
        self._events: asyncio.Queue[Invocation] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    # -- the function's names ----------------------------------------------------------------------------

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
            raise FunctionNotFound(f"{name}:{qualifier}")
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

    def new_invocation(self, target: Target, payload: bytes, *, client_context: str | None = None) -> Invocation:
        assert self._loop is not None
        now = int(time.time())
        return Invocation(
            request_id=str(uuid.uuid4()),
            payload=payload,
            version=target.version,
            function_arn=target.arn,
            done=self._loop.create_future(),
            client_context=client_context,
            trace_id=f"Root=1-{now:08x}-{secrets.token_hex(12)};Parent={secrets.token_hex(8)};Sampled=0",
        )

    async def invoke(self, inv: Invocation) -> Outcome:
        """RequestResponse: place it (or raise Throttled) and wait for the answer."""
        self.pool.dispatch(inv)
        outcome = await inv.done
        self.history.append(inv)
        return outcome

    def enqueue(self, inv: Invocation) -> None:
        """Event: accepted now, delivered by the dispatcher as capacity allows."""
        assert self._events is not None
        inv.is_async = True
        self._events.put_nowait(inv)

    async def _deliver_events(self) -> None:
        assert self._events is not None
        while True:
            inv = await self._events.get()
            while not self.pool.closed:
                try:
                    self.pool.dispatch(inv)
                except Throttled:  # Lambda keeps async events queued through throttles
                    await self.pool.wait_capacity(0.25)
                    continue
                inv.done.add_done_callback(functools.partial(self._record, inv))
                break

    def _record(self, inv: Invocation, _done: object) -> None:
        self.history.append(inv)

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
            await self.pool.close()  # answers pending invokes, kills process groups, waits for exits
            server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await serving
            sock.close()

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
