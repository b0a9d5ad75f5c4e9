"""Lambda's HTTP integration response for streamed answers: what a Function URL in `RESPONSE_STREAM` mode and an
API Gateway REST API whose Lambda proxy integration streams (`responseTransferMode: STREAM`) read from a
function's response stream instead of the buffered `{"statusCode", "headers", "body"}` object.

The stream's content type is `application/vnd.awslambda.http-integration-response`; it begins with a JSON
prelude `{"statusCode", "headers", "cookies"}`, then 8 NUL bytes, then the body's bytes as the client gets
them. (The format of aws-lambda-nodejs-runtime-interface-client's `HttpResponseStream` and of
`lambda_runtime::streaming` in the Rust runtime; API Gateway reads the prelude from the first 16 KB.)

Which events get it: a Function URL's (payload 2.0 on a `*.lambda-url.*` domain) and a REST API's (no
`version`). An HTTP API (payload 2.0 or 1.0 elsewhere) and an ALB always buffer: their events keep the buffered
answer even when the function streams.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from handler.api.encode import dumps

CONTENT_TYPE = "application/vnd.awslambda.http-integration-response"
DELIMITER = b"\0" * 8


def prelude(status: int, headers: Mapping[str, str], cookies: Sequence[str] = ()) -> bytes:
    """The prelude and its delimiter: what the stream's first bytes must be. (A JSON text never holds a raw
    NUL byte, so the delimiter cannot appear inside it.)"""
    return dumps({"statusCode": status, "headers": dict(headers), "cookies": list(cookies)}) + DELIMITER


def streams(event: Any) -> bool:
    """Does this HTTP event come from a source that reads a streamed response (a Function URL, a REST API)?"""
    if not isinstance(event, dict):
        return False
    context = event.get("requestContext")
    if not isinstance(context, dict) or "elb" in context:
        return False
    if event.get("version") == "2.0":
        domain = context.get("domainName")
        return isinstance(domain, str) and ".lambda-url." in domain
    return "httpMethod" in event and "version" not in event  # REST; an HTTP API's payload 1.0 says "1.0"


def buffered(response: Mapping[str, Any]) -> bytes:
    """A buffered HTTP-source answer (`EventSource.respond`'s `{"statusCode", "headers", "body",
    "isBase64Encoded"}`) as one integration response: its prelude, then its body's bytes."""
    body = response.get("body") or ""
    if response.get("isBase64Encoded"):
        import base64  # deferred: only a base64 body (none of ours today) needs it

        raw = base64.b64decode(body)
    else:
        raw = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    cookies = response.get("cookies") or ()
    return prelude(int(response.get("statusCode", 200)), response.get("headers") or {}, cookies) + raw
