"""The Lambda Invoke API as boto3 speaks it: Invoke (2015-03-31), InvokeWithResponseStream (2021-11-15), the
emulator's `functions/function` path, and a Function URL (infra.local.function_url) under /lambda-url/."""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from infra.local import eventstream, function_url
from infra.local.config import InvokeMode
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
from infra.local.stream import ResponseStream

INVOCATION_TYPES = ("RequestResponse", "Event", "DryRun")
STREAM_INVOCATION_TYPES = ("RequestResponse", "DryRun")  # InvokeWithResponseStream has no Event

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
    async def invoke_streaming(self, inv: Invocation) -> Outcome | ResponseStream: ...
    @property
    def function_name(self) -> str: ...
    @property
    def region(self) -> str: ...
    @property
    def invoke_mode(self) -> InvokeMode: ...


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


async def _parse_invoke(
    local: Functions, request: Request, kinds: tuple[str, ...]
) -> tuple[Target, str, bytes, str | None] | Response:
    """What Invoke and InvokeWithResponseStream share: the target, the invocation type, the payload and the
    client context, or the refusal."""
    try:
        target = local.resolve(request.path_params["name"], request.query_params.get("Qualifier"))
    except FunctionNotFound as exc:
        return _error(404, NOT_FOUND, f"Function not found: {exc}")
    except QualifierConflict as exc:
        return _error(400, BAD_PARAMETER, str(exc))
    kind = request.headers.get("x-amz-invocation-type", "RequestResponse")
    if kind not in kinds:
        return _error(400, BAD_PARAMETER, f"InvocationType must be one of {', '.join(kinds)}")
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
    return target, kind, payload, context


async def _relay(stream: ResponseStream) -> AsyncGenerator[bytes, None]:
    """A stream's chunks for an HTTP response; a client that leaves discards the rest (the function goes on)."""
    try:
        async for data in stream.chunks():
            yield data
    finally:
        if not stream.ended or stream.queued:
            stream.discard()


class StreamAborted(Exception):
    """A streamed Function URL response ended in an error: the connection is cut (no final chunk), so the
    client sees a broken transfer rather than a short body that looks complete."""


class QuietStreamAborts(logging.Filter):
    """uvicorn logs an app's exception with its traceback; a stream cut on purpose is the function's error
    (its log has it), not ours."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], StreamAborted))


def build_app(local: Functions) -> Starlette:
    error_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, QuietStreamAborts) for f in error_log.filters):
        error_log.addFilter(QuietStreamAborts())

    async def invoke(request: Request) -> Response:
        parsed = await _parse_invoke(local, request, INVOCATION_TYPES)
        if isinstance(parsed, Response):
            return parsed
        target, kind, payload, context = parsed
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

    async def invoke_stream(request: Request) -> Response:
        """InvokeWithResponseStream: an event stream of PayloadChunk events as the function streams (one
        with the whole answer for a function that answered buffered), then one InvokeComplete."""
        parsed = await _parse_invoke(local, request, STREAM_INVOCATION_TYPES)
        if isinstance(parsed, Response):
            return parsed
        target, kind, payload, context = parsed
        headers = {"X-Amz-Executed-Version": target.version}
        if kind == "DryRun":
            return Response(status_code=204, headers=headers)
        inv = local.new_invocation(target, payload, client_context=context)
        headers["x-amzn-RequestId"] = inv.request_id
        try:
            answer = await local.invoke_streaming(inv)
        except Throttled:
            return _error(429, TOO_MANY_REQUESTS, "Rate Exceeded.", Reason=THROTTLE_REASON)
        tail = request.headers.get("x-amz-log-type") == "Tail"

        async def events() -> AsyncIterator[bytes]:
            if isinstance(answer, ResponseStream):
                async for data in _relay(answer):
                    yield eventstream.payload_chunk(data)
                outcome = await inv.done
            else:
                outcome = answer
                if outcome.error_type is None and outcome.payload:
                    yield eventstream.payload_chunk(outcome.payload)
            code = details = None
            if outcome.error_type is not None:
                code, details = outcome.error_type, outcome.payload.decode("utf-8", "replace")
            yield eventstream.invoke_complete(code, details, inv.log_tail() if tail else None)

        # Content-Type is ResponseStreamContentType: the type of the data the function streams.
        content_type = answer.content_type if isinstance(answer, ResponseStream) else "application/json"
        return StreamingResponse(events(), 200, headers, media_type=content_type)

    async def url(request: Request) -> Response:
        """The function's Function URL: any method, any path under /lambda-url/<function>/."""
        name = request.path_params["name"]
        qualifier = name.split(":", 1)[1] if ":" in name else None
        try:
            target = local.resolve(name.split(":", 1)[0], qualifier)
        except (FunctionNotFound, QualifierConflict):
            return Response(b'{"Message":"Forbidden"}', 403, media_type="application/json")
        try:
            body = await _read_body(request, MAX_REQUEST_PAYLOAD)
        except _TooLarge:
            return Response(b'{"Message":"Request must be smaller than 6291456 bytes"}', 413)
        inv = local.new_invocation(target, b"")
        path = "/" + request.path_params.get("path", "")
        client = request.client
        inv.payload = json.dumps(
            function_url.event(
                method=request.method,
                path=path,
                query=request.url.query,
                headers=request.headers.items(),
                body=body,
                source_ip=client.host if client else "127.0.0.1",
                request_id=inv.request_id,
                function_name=local.function_name,
                region=local.region,
            )
        ).encode()
        answer: Outcome | ResponseStream
        try:
            if local.invoke_mode == "RESPONSE_STREAM":
                answer = await local.invoke_streaming(inv)
            else:
                answer = await local.invoke(inv)
        except Throttled:
            return Response(b'{"Message":"Rate Exceeded."}', 429, media_type="application/json")
        if isinstance(answer, Outcome):
            if answer.error_type is not None:
                return Response(b"Internal Server Error", 502, media_type="text/plain")
            status, head, data = function_url.buffered(answer.payload)
            return Response(data, status, _headers(head))
        return await _stream_url(answer, inv)

    return Starlette(
        routes=[
            Route("/2015-03-31/functions/{name}/invocations", invoke, methods=["POST"]),
            Route("/2021-11-15/functions/{name}/response-streaming-invocations", invoke_stream, methods=["POST"]),
            Route("/lambda-url/{name}", url, methods=_URL_METHODS),
            Route("/lambda-url/{name}/{path:path}", url, methods=_URL_METHODS),
        ]
    )


_URL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def _headers(head: list[tuple[str, str]]) -> dict[str, str]:
    """starlette takes a dict; Set-Cookie is added again per cookie by the caller's raw headers."""
    return {k: v for k, v in head if k.lower() != "set-cookie"}


class _StreamedURLResponse(StreamingResponse):
    def __init__(self, body: AsyncIterator[bytes], status: int, head: list[tuple[str, str]]) -> None:
        super().__init__(body, status, _headers(head))
        self.raw_headers += [(b"set-cookie", v.encode("latin-1")) for k, v in head if k.lower() == "set-cookie"]


async def _stream_url(stream: ResponseStream, inv: Invocation) -> Response:
    """A streamed answer on a RESPONSE_STREAM Function URL: the prelude's status and headers, then the body
    as it comes; a function that did not send an HTTP integration response streams a 200 of its type."""
    chunks = _relay(stream)
    first = b""
    if stream.content_type.split(";", 1)[0].strip().lower() == function_url.HTTP_INTEGRATION:
        buf = bytearray()
        split = None
        async for data in chunks:
            buf += data
            try:
                split = function_url.split_prelude(buf)
            except function_url.PreludeError:
                break
            if split is not None:
                break
        if split is None:
            await chunks.aclose()  # discards the rest
            return Response(b"Internal Server Error", 502, media_type="text/plain")
        (status, head), first = split
    else:
        status, head = 200, [("content-type", stream.content_type)]

    async def body() -> AsyncIterator[bytes]:
        try:
            if first:
                yield first
            async for data in chunks:
                yield data
        finally:
            await chunks.aclose()
        outcome = await inv.done
        if outcome.error_type is not None:
            raise StreamAborted(f"{outcome.error_type}: {outcome.payload[:200]!r}")

    return _StreamedURLResponse(body(), status, head)
