"""The HTTP host: SageMaker's container convention (`POST /invocations`, `GET /ping`), also right for Cloud
Run and Knative, plus `/healthz` and `/status`. A starlette app served by uvicorn (`python -m handler`).
Compatible APIs (`handler.api.compat`): OpenAI `POST /v1/embeddings`, `/v1/chat/completions`, `/v1/completions`,
`GET /v1/models`; Cohere `POST /v2/embed`, `/v2/rerank`; text-embeddings-inference `POST /embed`,
`/rerank`, `/predict`, `GET /info`, `/health`. `GET /docs`: the OpenAPI document as a page (`docs_page`).
Every answer is JSON (or .npy when asked; `/docs`, `/metrics`: text), 404 and 405 too.
Graceful shutdown on SIGTERM: `handler.http_host.drain`.

Same runtime as Lambda: `python -m handler` starts it by importing `handler.app`, so the init phase runs once
per process (at startup, before the port accepts connections), with the same task and error contract
(`{"error": {"type", "message"}}` with 400/405/413; 503 when the queue is full). Inference runs on the
bounded worker pool; pings, health and status are answered on the event loop, never queued behind it.

Whoever reaches the port may ask `GET /status`: it shows counts and health only (`WARMSTART_HTTP_STATUS=full`
shows what a direct invoke's status shows), and it never starts tracemalloc (403).

Only this module (and `python -m handler` in HTTP mode) imports starlette: it is not on Lambda's import chain.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future
from contextlib import asynccontextmanager
from functools import partial
from importlib import metadata
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from handler.api import compat, oip, schemas
from handler.api.media import request_kind, response_kind
from handler.api.sources import MethodNotAllowedError
from handler.core.errors import (
    PayloadTooLargeError,
    RequestError,
    ServiceBusyError,
    UnsupportedRequestError,
    error_body,
    internal_error_body,
)
from handler.http_host import sse
from handler.http_host.budget import BodyBudget
from handler.http_host.drain import RequestTimeoutError
from handler.http_host.host import Host
from handler.http_host.settings import HostSettings
from handler.models.admin import AdminNotAllowedError
from handler.observability import trace
from handler.observability.prometheus import CONTENT_TYPE_LATEST
from handler.runtime.invocation import HttpCall, batchable
from handler.tasks import catalog
from handler.tasks.streaming import streams

DOCS_POLICY = "default-src 'none'; style-src 'unsafe-inline'"  # `GET /docs` loads nothing: the browser is told so
ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


try:
    VERSION = metadata.version("warmstart")
except metadata.PackageNotFoundError:  # a checkout run without installing
    VERSION = "0"

# What a request whose client left is "answered" (nginx's code for it): nothing is sent, uvicorn drops it.
CLIENT_GONE = 499
REQUEST_ID_CHARS = 200  # X-Request-Id goes into every log line of its request: no more than this of it


def request_id(value: str | None) -> str | None:
    """The client's X-Request-Id as it goes into log lines: printable characters only (no forged line or
    terminal escape), at most REQUEST_ID_CHARS of them; None when nothing is left."""
    if not value:
        return None
    cleaned = "".join(c for c in value[: REQUEST_ID_CHARS * 4] if c.isprintable())[:REQUEST_ID_CHARS]
    return cleaned or None


class NotFoundError(UnsupportedRequestError):
    """No route at this path; the message lists the routes there are."""

    status = 404


def _release(bodies: BodyBudget, size: int, _: Future[Any]) -> None:
    bodies.release(size)


def _error(error: RequestError) -> JSONResponse:
    headers = {"retry-after": "1"} if isinstance(error, ServiceBusyError) else {}
    if isinstance(error, RequestTimeoutError | PayloadTooLargeError):
        headers["connection"] = "close"  # the rest of the body is unread: the connection cannot carry another
    return JSONResponse(error.to_body(), error.status, headers=headers)


async def _read_body(request: Request, settings: HostSettings, charged: list[int], bodies: BodyBudget) -> bytes:
    """The body, refused with 413 as soon as it is over the host's limit (never buffered past it), and with
    408 once it falls under the minimum rate: all of it that came by then must have come by `grace + received /
    rate` seconds (Apache's MinRate), so a trickle cannot hold a connection for the whole body timeout. Its bytes
    are charged to the host's body budget (`charged[0]`: what this request holds; the caller releases it),
    a declared length up front, a chunked body as it comes: 503 when the budget has no room."""
    limit, rate, grace = settings.payload_limit, settings.body_min_rate, settings.body_grace_s
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise PayloadTooLargeError(f"body is {length} bytes; the limit is {limit} bytes")
    if length.isdigit():
        bodies.charge(int(length))
        charged[0] = int(length)
    chunks: list[bytes] = []
    size = 0
    started = asyncio.get_running_loop().time()
    try:
        # One timer for the whole body, moved on as bytes arrive (not one per chunk).
        async with asyncio.timeout_at(started + grace if rate else None) as scope:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLargeError(f"body is over the limit of {limit} bytes")
                if size > charged[0]:  # chunked, or more than it declared (h11 refuses that; charged anyway)
                    bodies.charge(size - charged[0])
                    charged[0] = size
                chunks.append(chunk)
                if rate:
                    scope.reschedule(started + grace + size / rate)
    except TimeoutError:  # this scope's own: the body timeout's and the drain's are outside it
        raise RequestTimeoutError(
            f"the request body came at under {rate} bytes/s after its first {grace} s ({size} bytes by then; "
            "WARMSTART_HTTP_BODY_MIN_RATE)"
        ) from None
    return b"".join(chunks)


class Routes:
    """The host's route handlers, one named method each; `create_app` maps paths onto them."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.drain = host.drain
        self.document = document()
        self.docs_html: str | None = None

    def inference(self, route: compat.Route) -> Callable[[Request], Awaitable[Response]]:
        """The handler for one inference route (native `/invocations` or a compatible API's path)."""

        async def endpoint(request: Request) -> Response:
            return await self.infer(route, request)

        return endpoint

    async def infer(self, route: compat.Route, request: Request) -> Response:
        host, drain = self.host, self.drain
        charged = [0]  # bytes of this request's body held in the host's budget
        running: Future[Any] | None = None  # its job, while its client left and the job may still run
        try:
            if request.method != "POST":
                raise MethodNotAllowedError(f"method {request.method} is not allowed; POST a JSON body")
            drain.check()
            if host.standby is not None:
                host.standby.touch()  # the idle time counts from this arrival (the engine wakes as it starts it)
            content = request_kind(request.headers.get("content-type"))
            # A model whose task streams also takes SSE clients' `Accept: text/event-stream`; so does a route
            # whose answer streams in its API's chunks, whichever model the request names (`compat.chunks`).
            streamed = streams(host.runtime.task) or hasattr(route, "pieces")
            accept = (sse.accept_kind if streamed else response_kind)(request.headers.get("accept"), route.media)
            # traceparent / X-Amzn-Trace-Id: in the request's log records, and echoed back when valid.
            trace_id, echo = trace.from_headers(request.headers)
            # Bounded in time: the body timeout (408), and the drain's end (503) if it comes first.
            raw = await drain.read(
                _read_body(request, host.settings, charged, host.bodies), host.settings.body_timeout_s
            )
            drain.check()  # the body may have taken a while
            runtime, limit = host.runtime, host.settings.payload_limit
            rid = request_id(request.headers.get("x-request-id"))
            if streamed:  # its own job, its answer read piece by piece as it is made (handler.http_host.sse)
                stream = host.workers.submit_stream(
                    runtime.handle_http_stream, raw, route, content, accept, limit, trace_id, rid
                )
                running = stream.future  # the body is held until the producer stops
                # ClientDisconnect: the stream is closed; the drain's end: 503, or an error event mid-stream
                return await sse.answer(stream, request.receive, echo, drain)
            if batchable(route):
                # Queued as one of a batch: requests waiting together for the same model share its run.
                call = HttpCall(raw, route, content, accept, limit, trace_id, rid)
                future = host.workers.submit_batch(runtime.handle_http_batch, call)
            else:  # its own job: gathered into a batch, its run would hold up the batch's other requests
                future = host.workers.submit(runtime.handle_http, raw, route, content, accept, limit, trace_id, rid)
            try:
                status, body, media = await drain.answer(future, request.receive)
            except ClientDisconnect:
                host.workers.abandon(future)  # out of the queue, or skipped by its batch: nobody waits for it
                running = future
                raise
        except RequestError as e:
            host.runtime.count("rejected")
            return _error(e)
        except ClientDisconnect:  # gone while sending its body or waiting: no answer reaches it
            return Response(status_code=CLIENT_GONE)
        finally:
            if charged[0]:
                if running is not None and not running.done():  # its body is held until its work ends
                    running.add_done_callback(partial(_release, host.bodies, charged[0]))
                else:
                    host.bodies.release(charged[0])
        return Response(body, status, headers=echo, media_type=media)

    def healthy(self) -> Response | None:
        """None while serving; a 503 once draining (the platform then stops sending requests here)."""
        if self.drain.draining:
            return JSONResponse({"status": "draining", "instance_id": self.host.runtime.instance_id}, 503)
        return None

    async def ping(self, request: Request) -> Response:
        # SageMaker marks the container healthy on 200; answered here, on the loop, without the model.
        runtime = self.host.runtime
        runtime.count("ping")
        if self.host.prometheus is not None:
            self.host.prometheus.ping(runtime.manifest.key)
        return self.healthy() or JSONResponse(
            {"status": "ok", "instance_id": runtime.instance_id, "model": runtime.manifest.key}
        )

    async def healthz(self, request: Request) -> Response:
        return self.healthy() or JSONResponse({"ok": True})

    async def info(self, request: Request) -> Response:
        """text-embeddings-inference's `GET /info` (its `Info` schema's fields), for the default model."""
        runtime, workers = self.host.runtime, self.host.workers
        manifest = runtime.manifest
        spec = catalog.spec(manifest.task)  # TEI's name for the task and its facts: the task's spec says
        max_length = manifest.max_seq_length or 0
        return JSONResponse(
            {
                "model_id": manifest.id,
                "model_sha": manifest.version,
                "model_dtype": "float32",
                "model_type": {spec.info_kind: spec.tei_info(manifest)},
                "max_concurrent_requests": workers.sizing.max_workers + workers.sizing.max_queue,
                "max_input_length": max_length,
                # One request's texts are one batch: at most max_client_batch_size texts of max_input_length.
                "max_batch_tokens": max(workers.sizing.batch_tokens, max_length * runtime.config.max_inputs),
                # Requests queued together for the same model share one model run (dynamic batching).
                "max_batch_requests": workers.sizing.max_batch,
                "max_client_batch_size": runtime.config.max_inputs,
                "auto_truncate": True,  # long texts always lose their end, as sentence-transformers does
                "tokenization_workers": workers.sizing.max_workers,
                "version": f"warmstart {VERSION}",
                "sha": None,
                "docker_label": None,
            }
        )

    async def models(self, request: Request) -> Response:
        """OpenAI's `GET /v1/models`: the models this instance serves (no model run: on the loop)."""
        return JSONResponse(self.host.runtime.model_list())

    async def oip(self, request: Request) -> Response:
        """The Open Inference Protocol's routes (`handler.api.oip`): its answers, and its `{"error"}` shape."""
        kind, name = oip.match(request.url.path) or ("", None)
        if kind == "infer" and name is not None:
            if "inference-header-content-length" in request.headers:  # not JSON: refused before its body is read
                self.host.runtime.count("rejected")
                return JSONResponse({"error": oip.BINARY_REFUSED}, 400, headers={"connection": "close"})
            answer = await self.infer(oip.Infer(name), request)
            if answer.status_code >= 400 and answer.media_type == "application/json":
                headers = {k: v for k, v in answer.headers.items() if k not in ("content-length", "content-type")}
                answer = JSONResponse(json.loads(oip.reshape_error(bytes(answer.body))), answer.status_code, headers)
            return answer
        try:
            if request.method != "GET":
                raise MethodNotAllowedError(f"method {request.method} is not allowed on {request.url.path}; GET it")
            ready = not self.drain.draining
            if kind == "model":  # on a thread: an on-demand model loads for its metadata
                status, body = await asyncio.to_thread(oip.get, self.host.runtime, kind, name, VERSION, ready)
            else:
                status, body = oip.get(self.host.runtime, kind, name, VERSION, ready)
        except RequestError as e:
            self.host.runtime.count("rejected")
            status, body = oip.error_answer(e)
        return JSONResponse(body, status)

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(self.document)

    async def docs(self, request: Request) -> Response:
        """The document as a page to read, written here: it loads nothing from elsewhere (`docs_page`)."""
        if self.docs_html is None:  # on first use: most instances are never asked
            from handler.http_host import docs_page  # deferred: only a reader's browser asks for it

            self.docs_html = docs_page.render(self.document)
        return HTMLResponse(self.docs_html, headers={"content-security-policy": DOCS_POLICY})

    async def status(self, request: Request) -> Response:
        runtime = self.host.runtime
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
        body = runtime.status() if runtime.config.http_status == "full" else runtime.health()
        if self.host.standby is not None:
            body["standby"] = self.host.standby.describe()
        return JSONResponse(body)

    async def metrics(self, request: Request) -> Response:
        self.host.start()  # the registry is made with the runtime
        assert self.host.prometheus is not None
        return Response(self.host.prometheus.exposition(), media_type=CONTENT_TYPE_LATEST)

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.host.start()  # init now, before the port serves requests
        self.drain.bind(asyncio.get_running_loop(), self.host.workers)
        standby = asyncio.create_task(self.host.standby.run()) if self.host.standby is not None else None
        yield
        if standby is not None:
            standby.cancel()
        self.host.close()


# The routes answered on the event loop: path → (handler name, summary, answer schema, media type).
GET_ROUTES: dict[str, tuple[str, str, str | None, str]] = {
    # `GET /` first: `POST /` is an inference route on the same path.
    "/": ("healthz", "text-embeddings-inference's health route (503 when draining)", "Health", "application/json"),
    "/ping": ("ping", "SageMaker's health check: 200 once init is done, 503 when draining", "Ping", "application/json"),
    "/healthz": ("healthz", "health, for Kubernetes probes (503 when draining)", "Health", "application/json"),
    "/health": (
        "healthz",
        "text-embeddings-inference's health route (503 when draining)",
        "Health",
        "application/json",
    ),
    "/info": ("info", "text-embeddings-inference's model facts, for the default model", "Info", "application/json"),
    "/status": ("status", "counts and health (WARMSTART_HTTP_STATUS)", "Status", "application/json"),
    "/metrics": ("metrics", "Prometheus exposition", "", CONTENT_TYPE_LATEST),
    "/openapi.json": ("openapi", "this document", None, "application/json"),
    "/docs": (
        "docs",
        "this document as a page to read (plain HTML: no script, nothing from elsewhere)",
        "",
        "text/html",
    ),
    compat.MODELS_PATH: (
        "models",
        "OpenAI's model list: the models this instance serves",
        "ModelList",
        "application/json",
    ),
}


# The Open Inference Protocol's paths (`handler.api.oip.match` reads them); `versions/{version}` is ignored.
OIP_PATHS = [
    oip.PREFIX,
    f"{oip.PREFIX}/health/live",
    f"{oip.PREFIX}/health/ready",
    *(
        f"{oip.PREFIX}/models/{{name}}{versions}{tail}"
        for versions in ("", "/versions/{version}")
        for tail in ("", "/ready", "/infer")
    ),
]


def document() -> dict[str, Any]:
    """The OpenAPI document, from the schemas the routes validate requests with (`handler.api.schemas`)."""
    paths: dict[str, dict[str, Any]] = {}
    for path, (_, summary, answer, media) in GET_ROUTES.items():
        op = schemas.operation(summary, answer, media=media)
        if answer is None:  # the document itself
            op["responses"]["200"]["content"] = {"application/json": {"schema": {"type": "object"}}}
        paths.setdefault(path, {})["get"] = op
    for route in compat.ROUTES.values():
        op = schemas.operation(route.summary, route.answer, route.schema)
        if route is compat.NATIVE:
            op["description"] = (
                "JSON, or `application/x-npy` for a tensor model with one input; `Accept: application/x-npy` "
                "answers .npy for an embedding model or a tensor model with one output"
            )
        paths.setdefault(route.path, {})["post"] = op
    return schemas.openapi(dict(sorted(paths.items())), VERSION, catalog.specs())


def create_app(host: Host) -> Starlette:
    handlers = Routes(host)
    routes = [Route(path, getattr(handlers, name), methods=["GET"]) for path, (name, *_) in GET_ROUTES.items()]
    routes += [Route(r.path, handlers.inference(r), methods=ALL_METHODS) for r in compat.ROUTES.values()]
    routes += [Route(path, handlers.oip, methods=ALL_METHODS) for path in OIP_PATHS]
    paths = ", ".join(sorted({r.path for r in routes}))  # once each: `/` has a GET and a POST route

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            return _error(NotFoundError(f"no route {request.url.path}; routes: {paths}"))
        if exc.status_code == 405:
            return _error(MethodNotAllowedError(f"method {request.method} is not allowed on {request.url.path}"))
        return JSONResponse(error_body("HTTPError", str(exc.detail)), exc.status_code, headers=exc.headers)

    async def internal_error(request: Request, exc: Exception) -> Response:
        # Never starlette's plain-text 500: the same JSON error contract as every other answer.
        return JSONResponse(internal_error_body(exc), 500)

    return Starlette(
        routes=routes,
        lifespan=handlers.lifespan,
        exception_handlers={HTTPException: http_error, Exception: internal_error},
    )
