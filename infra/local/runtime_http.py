"""A minimal HTTP/1.1 server for the Runtime API: one listener per instance, keep-alive, single-write responses.

Why not uvicorn here: each instance needs its own listener created while the server runs (the port says
which instance calls), and the Runtime API's hot path is two tiny requests per invocation, so a ~150-line
asyncio protocol is both simpler and faster than adding sockets to a running uvicorn. asyncio transports
set TCP_NODELAY, and every response below is written with one `transport.write`.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Protocol

from infra.local.chunked import ChunkedDecoder, ChunkedError

MAX_HEAD = 64 * 1024


@dataclass(slots=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    too_large: bool = False  # body exceeded the server's limit and was discarded, not buffered
    trailers: dict[str, str] = field(default_factory=dict)  # a chunked body's (names lower-cased)


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    close: bool = False


Handler = Callable[[Request], "Response | Awaitable[Response]"]


class BodySink(Protocol):
    """Where a chunked body goes as it arrives (a streamed Lambda response): `attach` hands it the
    connection's pause/resume (back-pressure), `close` gets the trailers and gives the answer, `abort` is
    the connection lost mid-body."""

    def attach(self, pause: Callable[[], None], resume: Callable[[], None]) -> None: ...
    def write(self, data: bytes) -> None: ...
    def close(self, trailers: dict[str, str]) -> Response | Awaitable[Response]: ...
    def abort(self) -> None: ...


# Asked at the head of a chunked request (body not read yet): a sink to stream it into, a Response to
# refuse it (the connection closes: the body is never read), or None to buffer it (max_body) as usual.
StreamOpener = Callable[[Request], "BodySink | Response | None"]
# Is this accepted connection the instance's own? True / False, or None while that cannot be told yet
# (a restored copy connects before its pid reaches us): its requests wait until peer_known().
Guard = Callable[[socket.socket], "bool | None"]
_REFUSED = Response(
    403,
    b'{"errorMessage":"This Runtime API serves only its own instance","errorType":"AccessDeniedException"}',
    [("Content-Type", "application/json")],
    close=True,
)


def encode(response: Response) -> bytes:
    reason = HTTPStatus(response.status).phrase
    lines = [f"HTTP/1.1 {response.status} {reason}", f"Content-Length: {len(response.body)}"]
    for k, v in response.headers:
        if "\r" in v or "\n" in v or "\r" in k or "\n" in k:  # a header must never start another one
            raise ValueError(f"CR/LF in response header {k!r}")
        lines.append(f"{k}: {v}")
    if response.close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + response.body


class _Connection(asyncio.Protocol):
    def __init__(self, server: RuntimeHTTPServer) -> None:
        self._server = server
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._head: tuple[str, str, dict[str, str]] | None = None
        self._need = 0  # body bytes still expected for the current request
        self._discard = False
        self._pending: asyncio.Future[Response] | None = None
        self._close_after = False  # a refused 100-continue body: the stream is no longer in sync
        self._allowed: bool | None = True if server.guard is None else None  # None: not decided yet
        self._sock: socket.socket | None = None
        self._chunked: ChunkedDecoder | None = None  # reading a chunked body
        self._sink: BodySink | None = None  # ... into this sink, else into _body
        self._body = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._server.connections.add(self)
        self._sock = sock
        self.check_peer()

    def check_peer(self) -> None:
        """Run the server's guard: refuse a stranger at once, let a waiting instance's requests through."""
        guard = self._server.guard
        if self._allowed is not None or guard is None or self._transport is None:
            return
        started = time.perf_counter()
        verdict = guard(self._sock) if self._sock is not None else False
        self._server.guard_seconds += time.perf_counter() - started
        if verdict is None:
            return
        self._server.checked += 1
        self._allowed = verdict
        if not verdict:
            self._server.refused += 1
            self._buf.clear()
            self._write(_REFUSED)
            return
        if self._buf and self._pending is None:
            self._process()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._transport = None
        if self._pending is not None and not self._pending.done():
            self._pending.cancel()  # a parked /next whose caller went away
        if self._sink is not None:
            sink, self._sink = self._sink, None
            sink.abort()  # a streamed response cut off mid-body

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._allowed is False:
            return
        self._buf += data
        if self._allowed is None and len(self._buf) > MAX_HEAD:  # undecided peers get no big buffer
            self._write(Response(431, close=True))
            return
        if self._pending is None and self._allowed:
            self._process()

    def _process(self) -> None:
        while self._transport is not None and self._pending is None:
            if self._head is None:
                end = self._buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buf) > MAX_HEAD:
                        self._write(Response(431, close=True))
                    return
                if not self._parse_head(bytes(self._buf[:end])):
                    return
                del self._buf[: end + 4]
            if self._chunked is not None:
                if not self._feed_chunked():
                    return
                continue
            if self._discard:
                take = min(self._need, len(self._buf))
                del self._buf[:take]
                self._need -= take
                if self._need:
                    return
                body = b""
            else:
                if len(self._buf) < self._need:
                    return
                body = bytes(self._buf[: self._need])
                del self._buf[: self._need]
            assert self._head is not None
            method, path, headers = self._head
            request = Request(method, path, headers, body, self._discard)
            self._head, self._need, self._discard = None, 0, False
            self._dispatch(request)

    def _parse_head(self, raw: bytes) -> bool:
        try:
            line, *rest = raw.decode("latin-1").split("\r\n")
            method, target, _version = line.split(" ", 2)
            headers = {}
            for item in rest:
                name, _, value = item.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
        except ValueError:
            self._write(Response(400, close=True))
            return False
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return self._open_chunked(method, target, headers)
        self._head, self._need = (method, target, headers), length
        self._discard = length > self._server.max_body
        if headers.get("expect", "").lower() == "100-continue" and self._transport is not None:
            if self._discard:  # answer now; the client will not send the body
                self._need, self._close_after = 0, True
            else:
                self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return True

    def _open_chunked(self, method: str, target: str, headers: dict[str, str]) -> bool:
        """A chunked body (Lambda's response streaming): into a sink as it arrives, or buffered."""
        opened: BodySink | Response | None = None
        if self._server.open_stream is not None:
            try:
                opened = self._server.open_stream(Request(method, target, headers, b""))
            except Exception:  # never let a handler bug take the server down
                opened = Response(500, close=True)
        if isinstance(opened, Response):
            opened.close = True  # its body will not be read: the stream is out of sync
            self._write(opened)
            return False
        self._head, self._need, self._discard = (method, target, headers), 0, False
        self._chunked, self._sink = ChunkedDecoder(), opened
        self._body.clear()
        if opened is not None:
            opened.attach(self._pause_reading, self._resume_reading)
        if headers.get("expect", "").lower() == "100-continue" and self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return True

    def _feed_chunked(self) -> bool:
        """Decode what is buffered; True once the body (and its trailers) is complete and dispatched."""
        assert self._chunked is not None and self._head is not None
        data = bytes(self._buf)
        self._buf.clear()
        try:
            pieces = self._chunked.feed(data)
        except ChunkedError:
            self._chunked = None
            if self._sink is not None:
                sink, self._sink = self._sink, None
                sink.abort()
            self._write(Response(400, close=True))
            return False
        for piece in pieces:
            if self._sink is not None:
                self._sink.write(piece)
            elif not self._discard:
                self._body += piece
                if len(self._body) > self._server.max_body:  # over the limit: never held whole
                    self._discard = True
                    self._body.clear()
        if not self._chunked.done:
            return False
        self._buf += self._chunked.rest
        trailers = self._chunked.trailers
        method, path, headers = self._head
        self._head, self._chunked = None, None
        if self._sink is not None:
            sink, self._sink = self._sink, None
            try:
                self._deliver(sink.close(trailers))
            except Exception:
                self._write(Response(500, close=True))
        else:
            request = Request(method, path, headers, bytes(self._body), self._discard, trailers)
            self._body.clear()
            self._discard = False
            self._dispatch(request)
        return True

    def _pause_reading(self) -> None:
        if self._transport is not None:
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    def _dispatch(self, request: Request) -> None:
        try:
            result = self._server.handler(request)
        except Exception as exc:  # never let a handler bug take the server down
            body = f'{{"errorMessage":"{type(exc).__name__}","errorType":"InternalServerError"}}'
            result = Response(500, body.encode())
        self._deliver(result)

    def _deliver(self, result: Response | Awaitable[Response]) -> None:
        if isinstance(result, Response):
            self._write(result)
            return
        self._pending = asyncio.ensure_future(result)
        self._pending.add_done_callback(self._finish)

    def _finish(self, fut: asyncio.Future[Response]) -> None:
        self._pending = None
        if fut.cancelled() or self._transport is None:
            return
        exc = fut.exception()
        self._write(fut.result() if exc is None else Response(500, close=True))
        if self._buf:
            self._process()

    def _write(self, response: Response) -> None:
        if self._transport is None:
            return
        try:
            data = encode(response)
        except ValueError:
            data, response = encode(Response(500, close=True)), Response(500, close=True)
        self._transport.write(data)
        if response.close or self._close_after:
            self._transport.close()


class RuntimeHTTPServer:
    """Listens on a fresh 127.0.0.1 port; `address` is what goes into AWS_LAMBDA_RUNTIME_API."""

    def __init__(
        self, handler: Handler, *, host: str = "127.0.0.1", max_body: int = 6 * 1024 * 1024, guard: Guard | None = None
    ) -> None:
        self.handler = handler
        self.open_stream: StreamOpener | None = None  # chunked bodies are buffered unless set
        self.host = host
        self.max_body = max_body
        self.guard = guard
        self.refused = 0  # connections the guard turned away
        self.checked = 0  # connections the guard decided, and the time it took (bench_local_limits.py)
        self.guard_seconds = 0.0
        self.connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), sock=sock, backlog=16)
        self.port = sock.getsockname()[1]
        return f"{self.host}:{self.port}"

    def peer_known(self) -> None:
        """The instance's pid is known now: decide the connections that waited for it."""
        for conn in list(self.connections):
            conn.check_peer()

    def close(self) -> None:
        """Stop listening and drop every connection, parked long-polls included."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for conn in list(self.connections):
            conn.abort()
        self.connections.clear()
