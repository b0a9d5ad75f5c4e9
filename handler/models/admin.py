"""The model admin protocol: `{"warmstart": "reload" | "models"}` events, accepted from direct invokes only,
and the typed errors they answer with."""

from __future__ import annotations

from handler.core.errors import RequestError
from handler.core.types import JSON

ADMIN_ACTIONS = ("reload", "models")


class AdminNotAllowedError(RequestError):
    """An admin event (`{"warmstart": "reload" | "models"}`) arrived through an HTTP source; only direct
    invokes (which need `lambda:InvokeFunction` on the function) may manage models."""

    status = 403


class ReloadInProgressError(RequestError):
    """Another reload is still running; one at a time (each holds a second copy of a model in memory)."""

    status = 409


def admin_action(payload: JSON) -> str | None:
    if not isinstance(payload, dict):
        return None
    action = payload.get("warmstart")
    return action if action in ADMIN_ACTIONS else None
