"""The HTTP host's lines for people and log queries: one access line per request, the startup line, and an
expected startup failure said in one sentence (no traceback).

The access line is a JSON log record at INFO (`logger` `warmstart.access`): route, method, status, ms, model and
request id; never a body (it may hold what a user sent). WARMSTART_LOG_LEVEL=WARN silences it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from handler.core.errors import WarmstartError
from handler.http_host.routes import request_id

ACCESS_LOGGER = "warmstart.access"


class AccessLog:
    """ASGI: one `warmstart.access` record per HTTP request once its answer has started (or it failed)."""

    def __init__(self, app: ASGIApp, model: Callable[[], str | None]) -> None:
        self.app, self.model = app, model
        self.logger = logging.getLogger(ACCESS_LOGGER)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.logger.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]  # what the log says when the app raised before answering

        async def seen(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, seen)
        finally:
            self.log(scope, status[0], (time.perf_counter() - started) * 1000)

    def log(self, scope: Scope, status: int, ms: float) -> None:
        headers = dict(scope.get("headers") or [])
        route = getattr(scope.get("route"), "path", None) or scope.get("path", "")
        fields = {
            "route": route,
            "method": scope.get("method"),
            "status": status,
            "ms": round(ms, 3),
            "model": self.model(),
            "request_id": request_id(headers.get(b"x-request-id", b"").decode("latin-1")),
        }
        message = f"{fields['method']} {route} {status} {fields['ms']} ms"
        self.logger.info(message, extra={"fields": fields})


class PlainStartupFailure:
    """ASGI: when init failed with an expected error (a WarmstartError: no model, an unpacked directory, a model
    configured twice), uvicorn logs the error's sentence, not starlette's traceback of it."""

    def __init__(self, app: ASGIApp, failure: Callable[[], BaseException | None]) -> None:
        self.app, self.failure = app, failure

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def plain(message: Message) -> None:
            error = self.failure()
            if message["type"] == "lifespan.startup.failed" and isinstance(error, WarmstartError):
                message = {**message, "message": f"{type(error).__name__}: {error}"}
            await send(message)

        await self.app(scope, receive, plain)
