"""The ping each payload style sends, and what a reply proves.

Every style carries `hold_ms` and `correlation_id`: the warmstart handler treats all three shapes as pings and
honours both keys, and functions written for the other warmers ignore keys they do not know.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from warmers.config import PayloadStyle

PLUGIN_SOURCE = "serverless-plugin-warmup"


def ping(style: PayloadStyle, *, index: int, total: int, hold_ms: int, correlation_id: str) -> tuple[bytes, str | None]:
    """(Payload, ClientContext) of ping `index` (0-based) out of `total`."""
    body: dict[str, Any]
    client_context = None
    if style == "warmstart":
        body = {"warmer": True}
    elif style == "lambda-warmer":
        # lambda-warmer's own fan-out fields, as its first instance would send to copy i (1-based). We never
        # send its `concurrency` key: a function that saw it would fan out again and multiply our N.
        body = {
            "warmer": True,
            "__WARMER_INVOCATION__": index + 1,
            "__WARMER_CONCURRENCY__": total,
            "__WARMER_CORRELATIONID__": correlation_id,
        }
    else:
        # serverless-plugin-warmup sends its payload as the event and again as ClientContext `custom`.
        body = {"source": PLUGIN_SOURCE}
        custom = json.dumps({"custom": body}, separators=(",", ":"))
        client_context = base64.b64encode(custom.encode()).decode()
    body = {**body, "hold_ms": hold_ms, "correlation_id": f"{correlation_id}/{index}"}
    return json.dumps(body, separators=(",", ":")).encode(), client_context


def read_reply(raw: bytes) -> dict[str, Any] | None:
    """The reply as a dict when it is a JSON object; anything else proves nothing about the instance."""
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
