"""Runtime API 2018-06-01 routes for one instance: status codes, headers and error bodies as Lambda sends them."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import Callable

from infra.local.instances import INVALID_REQUEST_ID, INVALID_STATE, TOO_LARGE, Instance
from infra.local.invocation import MAX_RESPONSE_PAYLOAD, Invocation
from infra.local.runtime_http import BodySink, Request, Response
from infra.local.stream import ResponseStream

PREFIX = "/2018-06-01/runtime/"
ERROR_TYPE_HEADER = "lambda-runtime-function-error-type"
# Response streaming (a custom runtime's; awslambdaric never streams): the mode header on /response, a
# chunked body, and on a mid-stream error the type and the base64 error body as trailers.
RESPONSE_MODE_HEADER = "lambda-runtime-function-response-mode"
STREAMING = "streaming"
ERROR_BODY_TRAILER = "lambda-runtime-function-error-body"

_REFUSALS: dict[str, tuple[int, str]] = {
    INVALID_STATE: (403, "State transition is not allowed"),
    INVALID_REQUEST_ID: (400, "Invalid request ID"),
    TOO_LARGE: (413, f"Exceeded maximum allowed payload size ({MAX_RESPONSE_PAYLOAD} bytes)."),
}
_ACCEPTED = Response(202, b'{"status":"OK"}\n', [("Content-Type", "application/json")])


def _error(status: int, error_type: str, message: str) -> Response:
    body = json.dumps({"errorMessage": message, "errorType": error_type}).encode()
    return Response(status, body, [("Content-Type", "application/json")])


def _answer(refusal: str | None) -> Response:
    if refusal is None:
        return Response(_ACCEPTED.status, _ACCEPTED.body, _ACCEPTED.headers)
    status, message = _REFUSALS[refusal]
    return _error(status, refusal, message)


def next_response(inv: Invocation) -> Response:
    headers = [
        ("Content-Type", "application/json"),
        ("Lambda-Runtime-Aws-Request-Id", inv.request_id),
        ("Lambda-Runtime-Deadline-Ms", str(inv.deadline_ms)),
        ("Lambda-Runtime-Invoked-Function-Arn", inv.function_arn),
        ("Lambda-Runtime-Trace-Id", inv.trace_id),
    ]
    if inv.client_context:
        headers.append(("Lambda-Runtime-Client-Context", inv.client_context))
    return Response(200, inv.payload, headers)


def _relay(waiter: asyncio.Future[Invocation]) -> asyncio.Future[Response]:
    """Turn a parked /next into the response future the HTTP layer writes when it resolves."""
    out: asyncio.Future[Response] = waiter.get_loop().create_future()

    def forward(fut: asyncio.Future[Invocation]) -> None:
        if out.done():
            return
        if fut.cancelled():
            out.cancel()
        else:
            out.set_result(next_response(fut.result()))

    def back(fut: asyncio.Future[Response]) -> None:
        if fut.cancelled() and not waiter.done():
            waiter.cancel()  # connection gone: the instance is no longer parked

    waiter.add_done_callback(forward)
    out.add_done_callback(back)
    return out


class _StreamSink:
    """A streamed /response's chunked body, into the invocation's ResponseStream as it arrives."""

    def __init__(self, instance: Instance, inv: Invocation, stream: ResponseStream) -> None:
        self.instance, self.inv, self.stream = instance, inv, stream

    def attach(self, pause: Callable[[], None], resume: Callable[[], None]) -> None:
        self.stream.pause, self.stream.resume = pause, resume

    def write(self, data: bytes) -> None:
        self.stream.write(data)

    def close(self, trailers: dict[str, str]) -> Response:
        error_type = trailers.get(ERROR_TYPE_HEADER) or None
        body = b""
        if raw := trailers.get(ERROR_BODY_TRAILER, ""):
            try:
                body = base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError):
                body = raw.encode()  # not base64: the text as sent is the best account of the error
        if error_type is None and body:
            error_type = "Unhandled"  # a body without a type is still an error
        return _answer(self.instance.stream_done(self.inv, self.stream, error_type, body))

    def abort(self) -> None:
        self.instance.stream_broken(self.stream)


def _open_stream(instance: Instance, request: Request) -> BodySink | Response | None:
    """At the head of a chunked request: a streamed /response gets a sink; anything else is buffered."""
    path = request.path.split("?", 1)[0]
    parts = path[len(PREFIX) :].split("/") if path.startswith(PREFIX) else []
    mode = request.headers.get(RESPONSE_MODE_HEADER, "").lower()
    if request.method != "POST" or len(parts) != 3 or parts[0] != "invocation" or parts[2] != "response":
        return None
    if mode != STREAMING:
        return None
    result = instance.respond_stream(parts[1], request.headers.get("content-type", ""))
    if isinstance(result, str):
        return _answer(result)
    assert instance.current is not None
    return _StreamSink(instance, instance.current, result)


def bind(instance: Instance) -> None:
    """Route the instance's Runtime API listener to its state machine."""

    def route(request: Request) -> Response | asyncio.Future[Response]:
        path = request.path.split("?", 1)[0]
        if not path.startswith(PREFIX):
            return _error(404, "NotFound", f"no route for {request.method} {path}")
        parts = path[len(PREFIX) :].split("/")
        error_type = request.headers.get(ERROR_TYPE_HEADER)
        match request.method, parts:
            case "GET", ["invocation", "next"]:
                result = instance.next_invocation()
                if isinstance(result, str):
                    return _answer(result)
                if isinstance(result, asyncio.Future):
                    return _relay(result)
                return next_response(result)
            case "POST", ["invocation", request_id, "response"]:
                return _answer(instance.respond(request_id, request.body, request.too_large))
            case "POST", ["invocation", request_id, "error"]:
                if request.too_large:
                    return _answer(instance.respond(request_id, b"", True))
                return _answer(instance.fail(request_id, request.body, error_type))
            case "POST", ["init", "error"]:
                return _answer(instance.init_error(request.body, error_type))
            case "GET", ["restore", "next"]:
                refusal = instance.restore_next()
                return _answer(refusal) if refusal else Response(200)
            case "POST", ["restore", "error"]:
                return _answer(instance.restore_error(request.body, error_type))
        return _error(404, "NotFound", f"no route for {request.method} {path}")

    instance.server.handler = route
    instance.server.open_stream = lambda request: _open_stream(instance, request)
