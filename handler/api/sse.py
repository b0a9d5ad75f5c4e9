"""Server-sent events, the way OpenAI streams: `data: {json}\\n\\n` per piece, then `data: [DONE]\\n\\n`
(`text/event-stream`); an error after the first piece is an `event: error` carrying the same
`{"error": {"type", "message"}}` body an HTTP error has, and the stream ends without `[DONE]`.

The bytes only: the HTTP host (`handler.http_host.sse`) and the Lambda streaming loop
(`handler.runtime.streamed`) send the very same events, so one client parser reads both.
"""

from __future__ import annotations

from typing import Any

from handler.api.encode import dumps
from handler.core.errors import RequestError, internal_error_body

EVENT_STREAM = "text/event-stream"
DONE = b"data: [DONE]\n\n"
# What an event stream's response carries besides its content type (the HTTP host adds X-Accel-Buffering).
HEADERS = {"content-type": f"{EVENT_STREAM}; charset=utf-8", "cache-control": "no-cache"}


def event(piece: Any) -> bytes:
    return b"data: " + dumps(piece) + b"\n\n"


def error_event(error: BaseException) -> bytes:
    body = error.to_body() if isinstance(error, RequestError) else internal_error_body(error)
    return b"event: error\ndata: " + dumps(body) + b"\n\n"
