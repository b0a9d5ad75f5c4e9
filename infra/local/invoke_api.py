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


class Functions(Protocol):
    """What the Invoke API needs of the local Lambda (`infra.local.server.LocalLambda` is one)."""

    def resolve(self, name: str, qualifier: str | None) -> Target: ...
    def new_invocation(self, target: Target, payload: bytes, *, client_context: str | None = None) -> Invocation: ...
    def enqueue(self, inv: Invocation) -> None: ...
    async def invoke(self, inv: Invocation) -> Outcome: ...


def _error(status: int, code: str, message: str, **extra: str) -> Response:
    body = json.dumps({"Type": "User", "message": message, **extra})
    return Response(body, status, {"x-amzn-ErrorType": code}, media_type="application/json")


def build_app(local: Functions) -> Starlette:
    async def invoke(request: Request) -> Response:
        try:
            target = local.resolve(request.path_params["name"], request.query_params.get("Qualifier"))
        except FunctionNotFound as exc:
            return _error(404, NOT_FOUND, f"Function not found: {exc}")
        kind = request.headers.get("x-amz-invocation-type", "RequestResponse")
        if kind not in INVOCATION_TYPES:
            return _error(400, BAD_PARAMETER, f"InvocationType must be one of {', '.join(INVOCATION_TYPES)}")
        payload = await request.body()
        limit = MAX_ASYNC_PAYLOAD if kind == "Event" else MAX_REQUEST_PAYLOAD
        if len(payload) > limit:
            message = f"Request must be smaller than {limit} bytes for the InvokeFunction operation"
            return _error(413, TOO_LARGE, message)
        if not payload.strip():
            payload = b"{}"
        try:
            json.loads(payload)
        except ValueError as exc:
            return _error(400, BAD_CONTENT, f"Could not parse request body into json: {exc}")
        client_context = None
        if raw_context := request.headers.get("x-amz-client-context"):
            try:
                client_context = base64.b64decode(raw_context, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                return _error(400, BAD_PARAMETER, "Client context must be a valid Base64-encoded JSON object.")
        headers = {"X-Amz-Executed-Version": target.version}
        if kind == "DryRun":
            return Response(status_code=204, headers=headers)
        inv = local.new_invocation(target, payload, client_context=client_context)
        headers["x-amzn-RequestId"] = inv.request_id
        if kind == "Event":
            local.enqueue(inv)
            return Response(status_code=202, headers=headers)
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
