"""Warm pings: recognized only on direct invokes, answered without touching the model."""

from __future__ import annotations

from typing import Any

from handler.core.errors import InvalidInputError
from handler.core.types import JSON


def is_ping(payload: JSON) -> bool:
    if not isinstance(payload, dict):
        return False
    if payload.get("warmer") is True:  # ours and lambda-warmer's
        return True
    source = payload.get("source")
    if source == "serverless-plugin-warmup":
        return True
    # An EventBridge schedule pointed straight at the function.
    return source == "aws.events" and payload.get("detail-type") == "Scheduled Event"


def hold_ms(payload: dict[str, Any], cap_ms: int, remaining_ms: int | None) -> int:
    """How long to stay busy so parallel pings land on distinct instances: bounded by the configured cap
    and by the invocation's remaining time (leaving 100 ms to answer)."""
    raw = payload.get("hold_ms", 0)
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw != raw or raw < 0:
        raise InvalidInputError(f"hold_ms must be a non-negative number of milliseconds, got {raw!r}")
    bound = cap_ms if remaining_ms is None else max(0, min(cap_ms, remaining_ms - 100))
    return int(min(raw, bound))
