"""The current invocation's deadline, for work that can end early with what it has (a generation stops before
Lambda would kill the invocation, and answers with `finish_reason: "length"`).

Thread-local: each Lambda invocation (and each HTTP worker's request) sets its own, `None` meaning no deadline.
`handler.runtime.invocation` sets it from the Lambda context for each invocation and clears it after.
"""

from __future__ import annotations

import threading
import time

_local = threading.local()


def set_deadline(epoch_ms: float | None) -> None:
    """This thread's deadline, in milliseconds since the epoch (Lambda's `context.deadline_ms`), or None."""
    _local.deadline_ms = epoch_ms


def deadline_ms() -> float | None:
    value: float | None = getattr(_local, "deadline_ms", None)
    return value


def remaining_s() -> float | None:
    """Seconds left before this thread's deadline (negative once past it); None without one."""
    deadline = deadline_ms()
    if deadline is None:
        return None
    return (deadline - time.time() * 1000) / 1000
