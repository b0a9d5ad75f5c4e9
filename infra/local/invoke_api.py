"""The Lambda Invoke API (2015-03-31) as boto3 speaks it, plus the emulator's `functions/function` path."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infra.local.invocation import (
    MAX_ASYNC_PAYLOAD,
    MAX_REQUEST_PAYLOAD,
    UNHANDLED,
    FunctionNotFound,
    Invocation,
    Outcome,
    QualifierConflict,
    QueueFull,
    Target,
)
from infra.local.pool import THROTTLE_REASON, Throttled

INVOCATION_TYPES = ("RequestResponse", "Event", "DryRun")

# Invoke API error codes (x-amzn-ErrorType; botocore maps them to client.exceptions.*).
NOT_FOUND = "ResourceNotFoundException"
TOO_MANY_REQUESTS = "TooManyRequestsException"
TOO_LARGE = "RequestTooLargeException"
BAD_CONTENT = "InvalidRequestContentException"
BAD_PARAMETER = "InvalidParameterValueException"
# The Event queue is full (a local bound: Lambda's own queue is not documented as bounded); boto3 retries
# a 429 TooManyRequestsException by itself, as a caller throttled by Lambda would be.
QUEUE_FULL_REASON = "EventQueueFull"


class Functions(Protocol):
    """What the Invoke API needs of the local Lambda (`infra.local.server.LocalLambda` is one)."""

    def resolve(self, name: str, qualifier: str | None) -> Target: ...
    def new_invocation(self, target: Target, payload: bytes, *, client_context: str | None = None) -> Invocation: ...
    def enqueue(self, inv: Invocation) -> None: ...
    async def invoke(self, inv: Invocation) -> Outcome: ...


def _error(status: int, code: str, message: str, **extra: str) -> Response:
    body = json.dumps({"Type": "User", "message": message, **extra})
    return Response(body, status, {"x-amzn-ErrorType": code}, media_type="application/json")


class _TooLarge(Exception):
    pass


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refused (_TooLarge) on its Content-Length or as soon as the stream passes `limit`:
    never more than `limit` bytes are held, whatever the client sends."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _TooLarge
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _TooLarge
    return bytes(body)


def client_context(raw: str) -> str:
    """X-Amz-Client-Context: base64 of a JSON object, passed on re-serialized. Re-serializing is what keeps
    it one header line on /next: JSON escapes every control character, CR and LF included."""
    decoded = json.loads(base64.b64decode(raw, validate=True).decode())
    if not isinstance(decoded, dict):
        raise ValueError("not a JSON object")
    return json.dumps(decoded, separators=(",", ":"))


def build_app(local: Functions) -> Starlette:
    async def invoke(request: Request) -> Response:
        try:
            target = local.resolve(request.path_params["name"], request.query_params.get("Qualifier"))
        except FunctionNotFound as exc:
            return _error(404, NOT_FOUND, f"Function not found: {exc}")
        except QualifierConflict as exc:
            return _error(400, BAD_PARAMETER, str(exc))
        kind = request.headers.get("x-amz-invocation-type", "RequestResponse")
        if kind not in INVOCATION_TYPES:
            return _error(400, BAD_PARAMETER, f"InvocationType must be one of {', '.join(INVOCATION_TYPES)}")
        limit = MAX_ASYNC_PAYLOAD if kind == "Event" else MAX_REQUEST_PAYLOAD
        try:
            payload = await _read_body(request, limit)
        except _TooLarge:
            message = f"Request must be smaller than {limit} bytes for the InvokeFunction operation"
            return _error(413, TOO_LARGE, message)
        if not payload.strip():
            payload = b"{}"
        try:
            json.loads(payload)
        except ValueError as exc:
            return _error(400, BAD_CONTENT, f"Could not parse request body into json: {exc}")
        context = None
        if raw_context := request.headers.get("x-amz-client-context"):
            try:
                context = client_context(raw_context)
            except (binascii.Error, UnicodeDecodeError, ValueError):
                return _error(400, BAD_PARAMETER, "Client context must be a valid Base64-encoded JSON object.")
        headers = {"X-Amz-Executed-Version": target.version}
        if kind == "DryRun":
            return Response(status_code=204, headers=headers)
        inv = local.new_invocation(target, payload, client_context=context)
        if kind == "Event":  # Lambda's answer: 202, an empty body, the request id, no executed version
            try:
                local.enqueue(inv)
            except QueueFull:
                return _error(429, TOO_MANY_REQUESTS, "Rate Exceeded.", Reason=QUEUE_FULL_REASON)
            return Response(status_code=202, headers={"x-amzn-RequestId": inv.request_id})
        headers["x-amzn-RequestId"] = inv.request_id
        try:
            outcome = await local.invoke(inv)
        except Throttled:
            return _error(429, TOO_MANY_REQUESTS, "Rate Exceeded.", Reason=THROTTLE_REASON)
        if outcome.error_type is not None:
            headers["X-Amz-Function-Error"] = UNHANDLED
        if request.headers.get("x-amz-log-type") == "Tail":
            headers["X-Amz-Log-Result"] = inv.log_tail()
        return Response(outcome.payload, 200, headers, media_type="application/json")

    return Starlette(routes=[Route("/2015-03-31/functions/{name}/invocations", invoke, methods=["POST"])])
