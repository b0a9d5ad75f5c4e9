"""Event sources: who invoked us, how to read the request out of the event and how to shape the answer.

Each source is a small object with `infer(event) -> bool`; `SOURCES` is tried in order and `Direct`
takes whatever is left. HTTP sources answer errors as status codes; a direct invoke raises the typed
error so the runtime client reports its class name as `errorType`.
"""

from __future__ import annotations

import json
from typing import Any

from handler.api.encode import dumps
from handler.core.config import LAMBDA_PAYLOAD_LIMIT
from handler.core.errors import (
    InvalidEncodingError,
    InvalidJSONError,
    PayloadTooLargeError,
    UnsupportedEventSourceError,
    UnsupportedRequestError,
)
from handler.core.types import JSON, Event, Protocol

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


def strip_stage(path: str, event: dict[str, Any]) -> str:
    """`path` without the `/<stage>` an HTTP API puts in front of it on a named stage (`requestContext.stage`;
    `$default` is served at the root and adds nothing). Only a whole first segment equal to the stage goes:
    stage `prod` leaves `/production/...` alone, and stage `v1` turns `/v1/v1/embeddings` into `/v1/embeddings`."""
    stage = _request_context(event).get("stage")
    if not isinstance(stage, str) or not stage or stage == "$default":
        return path
    prefix = f"/{stage}"
    if path == prefix:
        return "/"
    return path[len(prefix) :] if path.startswith(prefix + "/") else path


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
            import base64  # deferred: a base64 body only (a direct invoke never decodes one)

            try:
                raw = base64.b64decode(body, validate=True)
            except ValueError as e:  # binascii.Error is a ValueError
                raise InvalidEncodingError(f"isBase64Encoded is true but the body is not valid base64: {e}") from None
        else:
            try:
                raw = body.encode("utf-8")
            except UnicodeEncodeError as e:  # lone surrogates smuggled in through JSON escapes
                raise InvalidEncodingError(f"body is not valid UTF-8: {e.reason}") from None
        return decode_body(raw)

    def respond(self, event: dict[str, Any], body: JSON, status: int = 200) -> dict[str, Any]:
        # The answer written once here (`handler.api.encode`); the envelope around it, at the Lambda edge.
        return self.respond_text(event, dumps(body).decode(), JSON_HEADERS["content-type"], status)

    def respond_text(self, event: dict[str, Any], text: str, media: str, status: int = 200) -> dict[str, Any]:
        """An answer already written (a buffered stream's server-sent events), with its media type."""
        return {"statusCode": status, "headers": {"content-type": media}, "body": text, "isBase64Encoded": False}


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
        """The route's path: `rawPath` (with the stage in front on a named stage, custom domains included)."""
        return strip_stage(str(event.get("rawPath") or event["requestContext"]["http"].get("path") or "/"), event)


class Alb(_Http):
    """Application Load Balancer target: needs `statusDescription`, and multi-value headers when enabled."""

    name = "alb"

    def infer(self, event: Event) -> bool:
        return isinstance(_request_context(event).get("elb"), dict)

    def respond_text(self, event: dict[str, Any], text: str, media: str, status: int = 200) -> dict[str, Any]:
        response = super().respond_text(event, text, media, status)
        from http import HTTPStatus  # deferred: ALB only; building its enum was ~2% of init's import instructions

        response["statusDescription"] = f"{status} {HTTPStatus(status).phrase}"
        if "multiValueHeaders" in event:
            response["multiValueHeaders"] = {k: [v] for k, v in response.pop("headers").items()}
        return response


class ApiGatewayV1(_Http):
    """API Gateway REST API proxy integration, and HTTP API integrations on payload format 1.0."""

    name = "api-gateway-v1"

    def path(self, event: dict[str, Any]) -> str:
        """A REST API's `path` never holds the stage (`requestContext.path` does), so it is the route's path as
        it is; an HTTP API's payload 1.0 (`"version": "1.0"`; REST events have no version) has the stage in
        `path` on a named stage, as payload 2.0 has in `rawPath`."""
        path = super().path(event)
        return strip_stage(path, event) if event.get("version") == "1.0" else path

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


# `eventSource` of a trigger's records → how the refusal names it (others: "an <eventSource> event").
_RECORD_SOURCES = {
    "aws:s3": "an S3 event",
    "aws:sqs": "an SQS event",
    "aws:sns": "an SNS event",
    "aws:dynamodb": "a DynamoDB stream event",
    "aws:kinesis": "a Kinesis event",
    "aws:kafka": "an MSK (Kafka) event",
    "SelfManagedKafka": "a Kafka event",
    "aws:mq": "an Amazon MQ event",
    "aws:rmq": "an Amazon MQ (RabbitMQ) event",
    "aws:ses": "an SES event",
}


def unsupported_source(event: Event) -> str | None:
    """What kind of trigger sent an event we do not serve, told by its shape; None for anything else. An
    event with an "inputs" field is always a request (a direct invoke may carry any other keys too)."""
    if not isinstance(event, dict) or "inputs" in event:
        return None
    records = event.get("Records")
    first = records[0] if isinstance(records, list) and records else None
    if isinstance(first, dict):
        origin = first.get("eventSource") or first.get("EventSource")
        if isinstance(origin, str) and origin:
            return _RECORD_SOURCES.get(origin, f"an {origin} event")
    origin = event.get("eventSource")  # Kafka and MQ batches: no Records list
    if isinstance(origin, str) and origin in _RECORD_SOURCES:
        return _RECORD_SOURCES[origin]
    if isinstance(event.get("awslogs"), dict):
        return "a CloudWatch Logs event"
    context = _request_context(event)
    if "method" in event and ("raw_path" in event or "serviceNetworkArn" in context or "targetGroupArn" in context):
        return "a VPC Lattice event"
    kind = event.get("detail-type")
    if isinstance(kind, str) and "source" in event and "detail" in event and kind != "Scheduled Event":
        return f"an EventBridge event ({kind!r} from {event['source']!r})"  # schedules are warm pings
    return None


class Unsupported:
    """Events from triggers we do not serve: refused with a message naming the trigger (the error is raised,
    as for any direct invoke, so the trigger's own retry and failure handling see it)."""

    name = "unsupported"
    http = False

    def infer(self, event: Event) -> bool:
        return unsupported_source(event) is not None

    def payload(self, event: Event) -> JSON:
        raise UnsupportedEventSourceError(
            f"{unsupported_source(event)}: warmstart serves direct invokes, API Gateway, Function URLs and ALB; "
            'send {"inputs": [...]}'
        )

    def respond(self, event: Event, body: JSON, status: int = 200) -> JSON:
        return body


SOURCES: tuple[EventSource, ...] = (HttpApiV2(), Alb(), ApiGatewayV1(), Unsupported(), Direct())


def infer_source(event: Event, sources: tuple[EventSource, ...] = SOURCES) -> EventSource:
    for source in sources:
        if source.infer(event):
            return source
    return sources[-1]
