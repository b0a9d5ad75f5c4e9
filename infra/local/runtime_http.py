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

MAX_HEAD = 64 * 1024


@dataclass(slots=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    too_large: bool = False  # body exceeded the server's limit and was discarded, not buffered


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    close: bool = False


Handler = Callable[[Request], "Response | Awaitable[Response]"]
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
            # Response streaming mode; awslambdaric never uses it for Python.
            self._write(Response(501, b'{"errorType":"NotImplemented"}', close=True))
            return False
        self._head, self._need = (method, target, headers), length
        self._discard = length > self._server.max_body
        if headers.get("expect", "").lower() == "100-continue" and self._transport is not None:
            if self._discard:  # answer now; the client will not send the body
                self._need, self._close_after = 0, True
            else:
                self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return True

    def _dispatch(self, request: Request) -> None:
        try:
            result = self._server.handler(request)
        except Exception as exc:  # never let a handler bug take the server down
            body = f'{{"errorMessage":"{type(exc).__name__}","errorType":"InternalServerError"}}'
            result = Response(500, body.encode())
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
