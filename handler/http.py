"""The HTTP host: SageMaker's container convention (`POST /invocations`, `GET /ping`), also right for Cloud
Run and Knative, plus `/healthz` and `/status`. A starlette app served by uvicorn (`python -m handler`).

Same runtime as Lambda: by default the instance `handler.app` builds on import, so the init phase runs once
per process (at startup, before the port accepts connections), and the same task and error contract
(`{"error": {"type", "message"}}` with 400/405/413; 503 when the queue is full). Inference runs on the
bounded worker pool; pings, health and status are answered on the event loop, never queued behind it.

Whoever reaches the port may ask `GET /status`: it shows counts and health only (`WARMSTART_HTTP_STATUS=full`
shows what a direct invoke's status shows), and it never starts tracemalloc (403).

Only this module (and `python -m handler` in HTTP mode) imports starlette: it is not on Lambda's import chain.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from handler.config import LAMBDA_PAYLOAD_LIMIT
from handler.cpu import cpu_budget
from handler.errors import PayloadTooLargeError, RequestError, ServiceBusyError
from handler.reload import AdminNotAllowedError
from handler.runtime import Runtime
from handler.sources import MethodNotAllowedError
from handler.workers import WorkerPool, sizing_from_environ

ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def lambda_runtime() -> Runtime:
    """The process's one runtime: importing `handler.app` is the init phase, exactly as on Lambda."""
    from handler import app  # deferred: the import runs init (seconds), at startup and not at import of this module

    return app.runtime


class Host:
    """Owns the runtime and its worker pool; both are made once, on first need."""

    def __init__(self, start: Callable[[], Runtime] = lambda_runtime, workers: WorkerPool | None = None) -> None:
        self._start = start
        self._runtime: Runtime | None = None
        self._workers = workers

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            self._runtime = self._start()
            if self._workers is None:
                cpus = cpu_budget(os.environ).cpus
                self._workers = WorkerPool(sizing_from_environ(os.environ, cpus), cpus, name="warmstart-http")
            self._runtime.workers = self._workers
        return self._runtime

    @property
    def workers(self) -> WorkerPool:
        self.runtime  # noqa: B018  (makes both)
        assert self._workers is not None
        return self._workers

    def close(self) -> None:
        if self._workers is not None:
            self._workers.shutdown()


def _error(error: RequestError) -> JSONResponse:
    headers = {"retry-after": "1"} if isinstance(error, ServiceBusyError) else None
    return JSONResponse(error.to_body(), error.status, headers=headers)


async def _read_body(request: Request) -> bytes:
    """The body, refused with 413 as soon as it is over the limit (never buffered past it)."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > LAMBDA_PAYLOAD_LIMIT:
        raise PayloadTooLargeError(f"body is {length} bytes; the limit is {LAMBDA_PAYLOAD_LIMIT} (Lambda's 6 MB)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > LAMBDA_PAYLOAD_LIMIT:
            raise PayloadTooLargeError(f"body is over the limit of {LAMBDA_PAYLOAD_LIMIT} bytes (Lambda's 6 MB)")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(host: Host | None = None) -> Starlette:
    host = host or Host()

    async def invocations(request: Request) -> Response:
        try:
            if request.method != "POST":
                raise MethodNotAllowedError(f"method {request.method} is not allowed; POST a JSON body")
            raw = await _read_body(request)
            future = host.workers.submit(host.runtime.handle_body, raw)
        except RequestError as e:
            host.runtime.count("rejected")
            return _error(e)
        status, body = await asyncio.wrap_future(future)
        return Response(body, status, media_type="application/json")

    async def ping(request: Request) -> Response:
        # SageMaker marks the container healthy on 200; answered here, on the loop, without the model.
        runtime = host.runtime
        runtime.count("ping")
        return JSONResponse({"status": "ok", "instance_id": runtime.instance_id, "model": runtime.manifest.key})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def status(request: Request) -> Response:
        runtime = host.runtime
        if "tracemalloc" in request.query_params:
            # Tracing slows every allocation in the process: the operator starts it, not whoever reaches the port.
            runtime.count("rejected")
            return _error(
                AdminNotAllowedError(
                    "tracemalloc is started by the operator: WARMSTART_TRACEMALLOC_S, or a direct invoke "
                    '{"warmstart": "status", "tracemalloc": true}; it stops by itself'
                )
            )
        runtime.count("status")
        # Model sources, paths, reload errors and the pointer only when the operator allows it.
        return JSONResponse(runtime.status() if runtime.config.http_status == "full" else runtime.health())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        host.runtime  # noqa: B018  (init now, before the port serves requests)
        yield
        host.close()

    routes = [
        Route("/invocations", invocations, methods=ALL_METHODS),
        Route("/ping", ping, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/status", status, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
