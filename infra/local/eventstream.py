"""The AWS event stream binary encoding (`application/vnd.amazon.eventstream`), the encoder side.

A message: prelude (total length u32, headers length u32, CRC32 of those 8 bytes), headers, payload, CRC32 of
everything before it; all big-endian. A header: name length u8, name, value type u8, value; only strings
(type 7: length u16 + UTF-8) are written here. botocore's `botocore/eventstream.py` is the decoder the
tests hold this to. InvokeWithResponseStream sends `PayloadChunk` events (the payload is the raw bytes) and
one `InvokeComplete` (a JSON object: ErrorCode, ErrorDetails, LogResult).
"""

from __future__ import annotations

import binascii
import json
import struct

STRING = 7
MAX_PAYLOAD = 16 * 1024 * 1024  # botocore's limit for one message's payload
MAX_HEADERS = 128 * 1024


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return struct.pack("!B", len(raw_name)) + raw_name + struct.pack("!BH", STRING, len(raw_value)) + raw_value


def message(headers: dict[str, str], payload: bytes) -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"event payload of {len(payload)} bytes is over {MAX_PAYLOAD}")
    raw_headers = b"".join(_header(k, v) for k, v in headers.items())
    if len(raw_headers) > MAX_HEADERS:
        raise ValueError("event headers too large")
    total = 12 + len(raw_headers) + len(payload) + 4
    prelude = struct.pack("!II", total, len(raw_headers))
    prelude += struct.pack("!I", binascii.crc32(prelude))
    body = prelude + raw_headers + payload
    return body + struct.pack("!I", binascii.crc32(body))


def event(event_type: str, payload: bytes, content_type: str) -> bytes:
    headers = {":event-type": event_type, ":content-type": content_type, ":message-type": "event"}
    return message(headers, payload)


def payload_chunk(data: bytes) -> bytes:
    return event("PayloadChunk", data, "application/octet-stream")


def invoke_complete(
    error_code: str | None = None, error_details: str | None = None, log_result: str | None = None
) -> bytes:
    fields = {"ErrorCode": error_code, "ErrorDetails": error_details, "LogResult": log_result}
    body = json.dumps({k: v for k, v in fields.items() if v is not None}).encode()
    return event("InvokeComplete", body, "application/json")
