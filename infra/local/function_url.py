"""A Function URL in front of the local Lambda: an HTTP request becomes the payload-2.0 event a Function URL
sends, and the function's answer becomes the HTTP response, buffered or (InvokeMode RESPONSE_STREAM) streamed.

Served at `<endpoint>/lambda-url/<function>[:<qualifier>]/<path>`: the function sees `/<path>` as rawPath, as
it would behind `https://<url-id>.lambda-url.<region>.on.aws/<path>`.

Buffered answers follow the Function URL response format: an object with `statusCode` gives the status,
`headers`, `cookies` (Set-Cookie) and `body` (`isBase64Encoded`); anything else is the body of a 200
`application/json` response. A streamed answer whose content type is
`application/vnd.awslambda.http-integration-response` begins with the prelude: a JSON object
(`statusCode`, `headers`, `cookies`) then 8 NUL bytes; the rest is the body, sent as it comes. Another
content type is streamed as the body of a 200 with that content type.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl

HTTP_INTEGRATION = "application/vnd.awslambda.http-integration-response"
PRELUDE_END = b"\0" * 8
MAX_PRELUDE = 64 * 1024  # a prelude is a status and a few headers; past this the stream is not one
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/javascript", "+json", "+xml")


class PreludeError(ValueError):
    """A streamed HTTP integration response whose prelude is missing, too long or not a JSON object."""


def url_id(function_name: str) -> str:
    """A stable 32-character id standing in for the URL's (`<url-id>.lambda-url.<region>.on.aws`)."""
    return hashlib.sha256(function_name.encode()).hexdigest()[:32]


def _is_text(content_type: str) -> bool:
    ct = content_type.split(";", 1)[0].strip().lower()
    return any(ct.startswith(t) or ct.endswith(t) for t in _TEXT_TYPES) if ct else True


def event(
    *,
    method: str,
    path: str,
    query: str,
    headers: Iterable[tuple[str, str]],
    body: bytes,
    source_ip: str,
    request_id: str,
    function_name: str,
    region: str,
) -> dict[str, Any]:
    """The Function URL event (payload format 2.0) for one HTTP request."""
    merged: dict[str, str] = {}
    cookies: list[str] = []
    for name, value in headers:
        key = name.lower()
        if key == "cookie":
            cookies += [c.strip() for c in value.split(";") if c.strip()]
            continue
        merged[key] = f"{merged[key]},{value}" if key in merged else value
    params: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        params[name] = f"{params[name]},{value}" if name in params else value
    text = _is_text(merged.get("content-type", ""))
    if text:
        try:
            body_text, encoded = body.decode("utf-8"), False
        except UnicodeDecodeError:
            text = False
    if not text:
        body_text, encoded = base64.b64encode(body).decode(), True
    uid = url_id(function_name)
    now = time.time()
    out: dict[str, Any] = {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": query,
        "headers": merged,
        "requestContext": {
            "accountId": "anonymous",
            "apiId": uid,
            "domainName": f"{uid}.lambda-url.{region}.on.aws",
            "domainPrefix": uid,
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": source_ip,
                "userAgent": merged.get("user-agent", ""),
            },
            "requestId": request_id,
            "routeKey": "$default",
            "stage": "$default",
            "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "timeEpoch": int(now * 1000),
        },
        "isBase64Encoded": encoded,
    }
    if cookies:
        out["cookies"] = cookies
    if params:
        out["queryStringParameters"] = params
    if body:
        out["body"] = body_text
    return out


Head = tuple[int, list[tuple[str, str]]]  # status, headers (Set-Cookie repeated)


def _head(status: Any, headers: Any, cookies: Any, default_type: str | None) -> Head:
    out = [(str(k), str(v)) for k, v in (headers or {}).items()] if isinstance(headers, dict) else []
    out += [("set-cookie", str(c)) for c in cookies or []] if isinstance(cookies, list) else []
    if default_type and not any(k.lower() == "content-type" for k, _ in out):
        out.append(("content-type", default_type))
    return (int(status) if isinstance(status, int | str) and str(status).isdigit() else 200), out


def buffered(payload: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    """A buffered answer as the HTTP response a Function URL makes of it."""
    try:
        answer = json.loads(payload)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or "statusCode" not in answer:
        return 200, [("content-type", "application/json")], payload
    status, headers = _head(answer.get("statusCode"), answer.get("headers"), answer.get("cookies"), None)
    body = answer.get("body") or ""
    if not isinstance(body, str):
        body = json.dumps(body)
    data = base64.b64decode(body) if answer.get("isBase64Encoded") else body.encode()
    return status, headers, data


def split_prelude(buf: bytes | bytearray) -> tuple[Head, bytes] | None:
    """(status and headers, the body bytes after it) once `buf` holds the whole prelude; None until then.
    Raises PreludeError past MAX_PRELUDE or for a prelude that is not a JSON object."""
    end = bytes(buf).find(PRELUDE_END)
    if end < 0:
        if len(buf) > MAX_PRELUDE:
            raise PreludeError(f"no prelude end (8 NUL bytes) in the first {MAX_PRELUDE} bytes")
        return None
    try:
        prelude = json.loads(bytes(buf[:end]))
    except ValueError as exc:
        raise PreludeError(f"the prelude is not JSON: {exc}") from None
    if not isinstance(prelude, dict):
        raise PreludeError("the prelude is not a JSON object")
    head = _head(
        prelude.get("statusCode", 200), prelude.get("headers"), prelude.get("cookies"), "application/octet-stream"
    )
    return head, bytes(buf[end + len(PRELUDE_END) :])
