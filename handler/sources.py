"""Event sources: who invoked us, how to read the request out of the event and how to shape the answer.

Each source is a small object with `infer(event) -> bool`; `SOURCES` is tried in order and `Direct`
takes whatever is left. HTTP sources answer errors as status codes; a direct invoke raises the typed
error so the runtime client reports its class name as `errorType`.
"""

from __future__ import annotations

import base64
import binascii
import json
from http import HTTPStatus
from typing import Any, Protocol

from handler.config import LAMBDA_PAYLOAD_LIMIT
from handler.errors import (
    InvalidEncodingError,
    InvalidJSONError,
    PayloadTooLargeError,
    UnsupportedRequestError,
)
from handler.types import JSON, Event

JSON_HEADERS = {"content-type": "application/json"}


class MethodNotAllowedError(UnsupportedRequestError):
    """HTTP method other than POST on the inference endpoint."""

    status = 405


def decode_body(raw: bytes, limit: int = LAMBDA_PAYLOAD_LIMIT) -> JSON:
    """Bytes → JSON value with the size, encoding and syntax errors told apart (`limit`: the host's)."""
    if len(raw) > limit:
        raise PayloadTooLargeError(f"body is {len(raw)} bytes; the limit is {limit} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidEncodingError(f"body is not valid UTF-8: {e.reason} at byte {e.start}") from None
    try:
        return json.loads(text)
    except ValueError as e:
        raise InvalidJSONError(f"body is not valid JSON: {e}") from None
    except RecursionError:  # `[[[[...` deeper than the interpreter's recursion limit
        raise InvalidJSONError("body is not valid JSON: nested too deeply") from None


def _request_context(event: Event) -> dict[str, Any]:
    context = event.get("requestContext") if isinstance(event, dict) else None
    return context if isinstance(context, dict) else {}


def _dumps(body: JSON) -> str:
    return json.dumps(body, separators=(",", ":"))


class EventSource(Protocol):
    name: str
    http: bool

    def infer(self, event: Event) -> bool: ...

    def payload(self, event: Event) -> JSON: ...

    def respond(self, event: Event, body: JSON, status: int = 200) -> Any: ...


class _Http:
    """Shared by the HTTP-shaped sources: body extraction and the proxy-integration response."""

    name = "http"
    http = True

    def method(self, event: dict[str, Any]) -> str:
        return str(event.get("httpMethod", "POST")).upper()

    def path(self, event: dict[str, Any]) -> str:
        """The request path (a compatible API's route when it names one)."""
        return str(event.get("path") or "/")

    def payload(self, event: dict[str, Any]) -> JSON:
        method = self.method(event)
        if method != "POST":
            raise MethodNotAllowedError(f"method {method} is not allowed; POST a JSON body")
        body = event.get("body")
        if body is None or body == "":
            raise InvalidJSONError('request has no body; send a JSON object such as {"inputs": ["text"]}')
        if not isinstance(body, str):
            raise InvalidJSONError(f"body must be a string in the event, got {type(body).__name__}")
        if event.get("isBase64Encoded"):
            if len(body) > LAMBDA_PAYLOAD_LIMIT * 4 // 3 + 4:
                raise PayloadTooLargeError(f"body is over the limit of {LAMBDA_PAYLOAD_LIMIT} bytes (Lambda's 6 MB)")
            try:
                raw = base64.b64decode(body, validate=True)
            except (binascii.Error, ValueError) as e:
                raise InvalidEncodingError(f"isBase64Encoded is true but the body is not valid base64: {e}") from None
        else:
            try:
                raw = body.encode("utf-8")
            except UnicodeEncodeError as e:  # lone surrogates smuggled in through JSON escapes
                raise InvalidEncodingError(f"body is not valid UTF-8: {e.reason}") from None
        return decode_body(raw)

    def respond(self, event: dict[str, Any], body: JSON, status: int = 200) -> dict[str, Any]:
        return {"statusCode": status, "headers": dict(JSON_HEADERS), "body": _dumps(body), "isBase64Encoded": False}


class HttpApiV2(_Http):
    """API Gateway HTTP API (payload format 2.0) and Lambda Function URLs, which share the shape."""

    name = "http-api-v2"

    def infer(self, event: Event) -> bool:
        return (
            isinstance(event, dict)
            and event.get("version") == "2.0"
            and isinstance(_request_context(event).get("http"), dict)
        )

    def method(self, event: dict[str, Any]) -> str:
        return str(event["requestContext"]["http"].get("method", "POST")).upper()

    def path(self, event: dict[str, Any]) -> str:
        return str(event.get("rawPath") or event["requestContext"]["http"].get("path") or "/")


class Alb(_Http):
    """Application Load Balancer target: needs `statusDescription`, and multi-value headers when enabled."""

    name = "alb"

    def infer(self, event: Event) -> bool:
        return isinstance(_request_context(event).get("elb"), dict)

    def respond(self, event: dict[str, Any], body: JSON, status: int = 200) -> dict[str, Any]:
        response = super().respond(event, body, status)
        response["statusDescription"] = f"{status} {HTTPStatus(status).phrase}"
        if "multiValueHeaders" in event:
            response["multiValueHeaders"] = {k: [v] for k, v in response.pop("headers").items()}
        return response


class ApiGatewayV1(_Http):
    """API Gateway REST API proxy integration (payload format 1.0)."""

    name = "api-gateway-v1"

    def infer(self, event: Event) -> bool:
        return (
            isinstance(event, dict)
            and "httpMethod" in event
            and isinstance(event.get("requestContext"), dict)
            and "elb" not in event["requestContext"]
        )


class Direct:
    """`lambda:Invoke` with a JSON payload (SDK, CLI, Step Functions, EventBridge, warmers)."""

    name = "direct"
    http = False

    def infer(self, event: Event) -> bool:
        return True

    def payload(self, event: Event) -> JSON:
        # The runtime client hands raw bytes over when the payload was not sent as application/json.
        if isinstance(event, bytes | bytearray):
            return decode_body(bytes(event))
        return event

    def respond(self, event: Event, body: JSON, status: int = 200) -> JSON:
        return body


SOURCES: tuple[EventSource, ...] = (HttpApiV2(), Alb(), ApiGatewayV1(), Direct())


def infer_source(event: Event, sources: tuple[EventSource, ...] = SOURCES) -> EventSource:
    for source in sources:
        if source.infer(event):
            return source
    return sources[-1]
