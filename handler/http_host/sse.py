"""Streamed answers as server-sent events, the way OpenAI streams: `data: {json}\\n\\n` per piece, then
`data: [DONE]\\n\\n` (`text/event-stream`; the bytes are `handler.api.sse`'s, shared with the Lambda loop).

A streamed request runs on a worker as a `Stream` (`WorkerPool.submit_stream`, `Runtime.handle_http_stream`).
The route awaits its first item before it answers anything, so a request refused before any piece (bad input,
a full queue, a drain) still gets the ordinary typed JSON error with its status code. Once the first piece is
sent the status is 200 for good: an error after it is an SSE `error` event carrying the same
`{"error": {"type", "message"}}` body (OpenAI's clients raise it as an `APIError`), and the stream ends
without `[DONE]`. A client that leaves at any point closes the stream: the producer stops at its next piece
and its worker is free (uvicorn drops what is sent to a gone client silently, so `receive` is watched).
A stream still running when the drain's time runs out (graceful shutdown) ends with the drain's 503 as an
error event, like any request still running then.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from handler.api.media import Kind, response_kind
from handler.api.sse import DONE, EVENT_STREAM, error_event, event
from handler.core.errors import Abandoned, ServiceBusyError
from handler.http_host.drain import Drain
from handler.runtime.pieces import EMPTY, END, Stream

__all__ = ["DONE", "EVENT_STREAM", "EventStreamResponse", "Reader", "answer", "error_event", "event"]


def accept_kind(accept: str | None, media: tuple[Kind, ...]) -> Kind:
    """The media kind for a request to a streaming model: an SSE client's `Accept: text/event-stream` means
    JSON pieces (and JSON for one answer or an error); anything else is negotiated as for any route."""
    if accept is not None and EVENT_STREAM in accept.lower():
        return "json"
    return response_kind(accept, media)


class Reader:
    """The event loop's side of a `Stream`: woken by the producer (`on_ready`) instead of blocking a thread.
    With the host's `Drain`: a stream still running when the drain time runs out ends with its 503."""

    def __init__(self, stream: Stream, drain: Drain | None = None) -> None:
        self.stream = stream
        self.left = False  # the client has gone
        loop = asyncio.get_running_loop()
        self.ready = asyncio.Event()
        self.expiry: asyncio.Future[Any] | None = None
        if drain is not None and stream.future is not None:
            # Settled by the drain's end (ServiceBusyError), else when the producer stops.
            self.expiry = drain.track(stream.future)
            self.expiry.add_done_callback(self._settled)

        def wake() -> None:  # on the producer's thread
            # RuntimeError: the loop is closed (the process is exiting); nobody reads this stream any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self.ready.set)

        stream.on_ready(wake)

    def _settled(self, expiry: asyncio.Future[Any]) -> None:
        if not expiry.cancelled():
            expiry.exception()  # retrieved: the stream itself carries the producer's own outcome
        self.ready.set()

    def expired(self) -> BaseException | None:
        """The drain's 503, once its time ran out with this stream still running."""
        expiry = self.expiry
        if expiry is None or not expiry.done() or expiry.cancelled():
            return None
        error = expiry.exception()
        return error if isinstance(error, ServiceBusyError) else None

    async def next(self) -> Any:
        """The next piece, END, or the producer's error raised (the drain's 503 when its time ran out);
        ClientDisconnect once the client left."""
        while True:
            if self.left:
                raise ClientDisconnect()
            self.ready.clear()
            item = self.stream.poll()
            if item is not EMPTY:
                return item
            expired = self.expired()
            if expired is not None:
                self.stream.close()  # the producer stops at its next piece
                raise expired
            await self.ready.wait()

    async def watch(self, receive: Receive) -> None:
        """Until the client leaves (nothing but a disconnect comes on `receive` once the body was read); then
        the stream is closed and the reader woken."""
        while (await receive())["type"] != "http.disconnect":
            pass
        self.left = True
        self.stream.close()
        self.ready.set()


async def first_item(reader: Reader, receive: Receive) -> Any:
    """The stream's first item (a piece, one `(status, body, media)` answer, or END), or the producer's error;
    ClientDisconnect (the stream closed) when the client leaves first."""
    watcher = asyncio.ensure_future(reader.watch(receive))
    try:
        return await reader.next()
    except Abandoned:
        raise ClientDisconnect() from None
    finally:
        watcher.cancel()


async def answer(stream: Stream, receive: Receive, headers: Mapping[str, str], drain: Drain | None = None) -> Response:
    """What a streamed request is answered: events from its first piece on; or its one `(status, body, media)`
    answer (a request that did not ask to stream, or one refused before any piece). The producer's error before
    the first piece (a drain's 503) is raised; ClientDisconnect when the client left first."""
    reader = Reader(stream, drain)
    first = await first_item(reader, receive)
    if isinstance(first, tuple):
        status, body, media = first
        if status == 503:  # at capacity (a full queue): the client may retry, as for any other 503
            headers = {**headers, "retry-after": "1"}
        return Response(body, status, headers=headers, media_type=media)
    return EventStreamResponse(reader, first, headers)


class EventStreamResponse(Response):
    """The first piece (already read), every later one as it comes, `[DONE]` at the end. A starlette
    `Response` by type only: its own `__call__` sends the events (no length, no body up front)."""

    def __init__(self, reader: Reader, first: Any, headers: Mapping[str, str] | None = None) -> None:
        self.reader, self.first, self.headers_in = reader, first, dict(headers or {})
        self.status_code, self.background = 200, None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        reader = self.reader
        headers = [
            (b"content-type", f"{EVENT_STREAM}; charset=utf-8".encode()),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),  # proxies (nginx) pass each event on at once
            *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers_in.items()),
        ]
        watcher = asyncio.ensure_future(reader.watch(receive))
        ended = False
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            item = self.first
            while True:
                if item is END:
                    ended = True
                    await send({"type": "http.response.body", "body": DONE, "more_body": False})
                    return
                await send({"type": "http.response.body", "body": event(item), "more_body": True})
                try:
                    item = await reader.next()
                except (ClientDisconnect, Abandoned):  # the client left: nobody to tell
                    return
                except Exception as e:  # after the first piece: in-stream, then the end
                    ended = True
                    await send({"type": "http.response.body", "body": error_event(e), "more_body": False})
                    return
        finally:
            watcher.cancel()
            if not ended:  # cancelled (shutdown) or the client left: stop the producer at its next piece
                reader.stream.close()
