"""uvicorn's HTTP/1.1 protocol (h11), with what the host adds at the connection's level:

- **every answer is JSON**: a request h11 cannot parse (a garbage request line, a bad `Content-Length`,
  headers over `MAX_HEADER_BYTES`) gets `{"error": {"type": "InvalidHTTPRequestError", ...}}` with h11's
  status (400, or 431 for headers too large), where uvicorn writes a plain-text 400;
- **a time for the headers**: a connection that has not sent a whole request line and headers within
  `header_timeout_s` of opening (or of its last answer) is closed: 408 `RequestTimeoutError` when part of a
  request came, quietly when nothing did (uvicorn's keep-alive timer restarts on every byte, so a client
  trickling one byte now and then held its connection forever). The body's time is the route's
  (`Drain.read`), since the app reads it;
- **a cap on connections** (`max_connections`, below the file limit): a connection over it takes the place
  of the longest-waiting one that has no request under way (closed as above); when every connection has
  one (bodies trickling in, requests running), the new connection is taken into the **health reserve**
  (`health_reserve` more connections, for health checks only: its health request is answered as usual, any
  other request 503 `ServiceBusyError` with `Connection: close`, unless a place under the cap has come free),
  so a liveness probe never fails because clients hold every connection; with the reserve full too (its
  waiting connections give way as above), the new connection is answered 503 at once and closed;
- **the drain**: uvicorn closes idle keep-alive connections the moment it shuts down, and a request the
  client sent meanwhile is reset unanswered. Here they stay open until their keep-alive time or the drain's
  end, and whatever arrives on them is answered (503, `Connection: close`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from typing import Any, ClassVar, cast

import h11
from uvicorn._types import ASGI3Application, ASGIReceiveCallable, ASGISendCallable, Scope
from uvicorn.protocols.http.h11_impl import H11Protocol

from handler.core.errors import ServiceBusyError, error_body
from handler.http_host.drain import SHUTTING_DOWN, Drain, RequestTimeoutError
from handler.http_host.settings import HostSettings

# After an answer written here the connection half-closes and reads (discarding) for up to this long before it
# closes: closing with the client's request still arriving would reset the connection, and the client's TCP
# stack may then drop the answer unread (the "lingering close" every HTTP server needs).
LINGER_S = 0.5
# What a connection in the health reserve may ask (routes.GET_ROUTES' health handlers); `POST /` is inference.
HEALTH_PATHS = frozenset({"/ping", "/healthz", "/health", "/"})


class HostProtocol(H11Protocol):
    """One connection. `bind` makes the subclass uvicorn instantiates, carrying the host's settings."""

    settings: ClassVar[HostSettings] = HostSettings()
    drain: ClassVar[Drain | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.waiting_since = 0.0  # loop.time() since when this connection waits for a request's headers
        self.received = 0  # bytes received since then
        self.header_timer: asyncio.TimerHandle | None = None
        self.drain_timer: asyncio.TimerHandle | None = None
        self.linger_timer: asyncio.TimerHandle | None = None
        self.reserved = False  # taken over the cap, into the health reserve: health requests only
        self.inner_app: ASGI3Application = self.app  # `self.app` is `health_only` while reserved

    @classmethod
    def bind(cls, settings: HostSettings, drain: Drain) -> type[HostProtocol]:
        return cast("type[HostProtocol]", type("BoundHostProtocol", (cls,), {"settings": settings, "drain": drain}))

    # -- the connection's life

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        over = len(self.connections) > self.settings.max_connections
        if over and not self._make_room() and not self._reserve():
            self.answer_and_close(503, ServiceBusyError.__name__, "too many connections; retry", retry=True)
            return
        self.wait_for_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self.cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.linger_timer is not None:
            return  # answered and half-closed: what still comes is read and dropped
        self.received += len(data)
        super().data_received(data)
        if self.header_timer is not None and not self.waiting():
            self.header_timer.cancel()  # the request's headers are in: the route bounds the body
            self.header_timer = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.waiting():
            self.wait_for_request()

    def waiting(self) -> bool:
        """No request under way: between requests, or part of a request line or headers so far."""
        return self.cycle is None or self.cycle.response_complete

    def closing(self) -> bool:
        """Closed, or answered here and lingering (it closes within LINGER_S)."""
        return self.transport.is_closing() or self.linger_timer is not None

    def wait_for_request(self) -> None:
        self.waiting_since, self.received = self.loop.time(), 0
        if self.header_timer is not None:
            self.header_timer.cancel()
        self.header_timer = self.loop.call_later(self.settings.header_timeout_s, self.header_timeout)

    def header_timeout(self) -> None:
        self.header_timer = None
        if self.waiting() and not self.closing():
            message = f"the request's headers did not arrive within {self.settings.header_timeout_s} s"
            self.close_waiting(408, RequestTimeoutError.__name__, message)

    def close_waiting(self, status: int, type_name: str, message: str) -> None:
        """Close a connection with no request under way: answered if part of one came, quietly if nothing did."""
        if self.received and self.conn.their_state is h11.IDLE:
            self.answer_and_close(status, type_name, message, retry=status == 503)
        else:
            self.close()

    def _live(self, reserved: bool) -> list[HostProtocol]:
        """The open connections under the cap (`reserved=False`) or in the health reserve."""
        return [
            c for c in self.connections if isinstance(c, HostProtocol) and c.reserved is reserved and not c.closing()
        ]

    def _make_room(self) -> bool:
        """Over the cap: close the connection that has waited longest for a request, if any does."""
        return self._room_among(self._live(reserved=False), self.settings.max_connections)

    def _reserve(self) -> bool:
        """Every connection under the cap has a request under way: take this one into the health reserve."""
        self.reserved = True
        if not self._room_among(self._live(reserved=True), self.settings.health_reserve):
            self.reserved = False
            return False
        # Per connection: uvicorn runs `self.app` for each request this connection sends.
        self.app = self.health_only
        return True

    def _room_among(self, live: list[HostProtocol], limit: int) -> bool:
        if len(live) <= limit:
            return True  # the others over the count are closing already
        waiting = [c for c in live if c is not self and c.waiting()]
        if not waiting:
            return False
        oldest = min(waiting, key=lambda c: c.waiting_since)
        oldest.close_waiting(503, ServiceBusyError.__name__, "too many connections; this one waited longest; retry")
        return True

    async def health_only(self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        """The app, for a connection in the health reserve: its health requests, or any request once a place
        under the cap is free; else 503, closing the connection (the body, if any, is not read)."""
        health = scope["type"] == "http" and scope["method"] in ("GET", "HEAD") and scope["path"] in HEALTH_PATHS
        if not health and len(self._live(reserved=False)) < self.settings.max_connections:
            self.reserved, self.app = False, self.inner_app  # a place came free: an ordinary connection now
        if health or not self.reserved:
            await self.inner_app(scope, receive, send)
            return
        body = json.dumps(
            error_body(ServiceBusyError.__name__, "too many connections; this one may ask for health only; retry")
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", b"1"),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    # -- answers written here, not by the app

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot parse (called in its `except h11.RemoteProtocolError`)."""
        error = sys.exc_info()[1]
        status = error.error_status_hint if isinstance(error, h11.RemoteProtocolError) else 400
        detail = f"{msg[:-1] if msg.endswith('.') else msg}: {error}" if error is not None else msg
        self.answer_and_close(status, "InvalidHTTPRequestError", detail)

    def answer_and_close(self, status: int, type_name: str, message: str, retry: bool = False) -> None:
        body = json.dumps(error_body(type_name, message)).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        if retry:
            headers.append((b"retry-after", b"1"))
        try:
            self.transport.write(self.conn.send(h11.Response(status_code=status, headers=headers)) or b"")
            self.transport.write(self.conn.send(h11.Data(data=body)) or b"")
            self.transport.write(self.conn.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:
            self.close()  # an answer is already under way on this connection: it cannot take another
            return
        self.cancel_timers()
        if not self.transport.can_write_eof():
            self.close()
            return
        self.transport.write_eof()
        self.transport.resume_reading()
        self.linger_timer = self.loop.call_later(LINGER_S, self.close)

    def close(self) -> None:
        self.cancel_timers()
        if self.transport.is_closing():
            return
        if self.conn.our_state is not h11.ERROR:
            with contextlib.suppress(h11.LocalProtocolError):
                self.conn.send(h11.ConnectionClosed())
        self.transport.close()

    def cancel_timers(self) -> None:
        for timer in (self.header_timer, self.drain_timer, self.linger_timer):
            if timer is not None:
                timer.cancel()
        self.header_timer = self.drain_timer = self.linger_timer = None

    # -- the drain

    def shutdown(self) -> None:
        """uvicorn's server is shutting down. A connection answering a request closes after that answer
        (uvicorn's way, and the answer says `Connection: close`); one waiting for a request stays open until
        its keep-alive or header time, or the drain's end, so a request already on its way is answered."""
        if not self.waiting():
            super().shutdown()
            return
        ends_at = self.drain.ends_at if self.drain is not None else None
        if ends_at is None:
            super().shutdown()
            return
        self.drain_timer = self.loop.call_at(ends_at, self.drain_over)

    def drain_over(self) -> None:
        self.drain_timer = None
        if self.waiting() and not self.closing():
            self.close_waiting(503, ServiceBusyError.__name__, SHUTTING_DOWN)
