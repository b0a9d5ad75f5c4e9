"""Runtime API 2018-06-01 routes for one instance: status codes, headers and error bodies as Lambda sends them."""

from __future__ import annotations

import asyncio
import json

from infra.local.instances import INVALID_REQUEST_ID, INVALID_STATE, TOO_LARGE, Instance
from infra.local.invocation import MAX_RESPONSE_PAYLOAD, Invocation
from infra.local.runtime_http import Request, Response

PREFIX = "/2018-06-01/runtime/"
ERROR_TYPE_HEADER = "lambda-runtime-function-error-type"

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
