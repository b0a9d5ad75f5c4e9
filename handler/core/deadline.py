"""The invocation's deadline: Lambda says when it will stop the invocation (`Lambda-Runtime-Deadline-Ms`), and
a task that runs long (generation) stops before it with what it has, rather than being cut off with nothing.

Per thread, because an HTTP host's workers run several requests at once; the Lambda loop sets it per invocation
(`set_deadline(epoch_ms)`) and clears it after (`set_deadline(None)`). Stdlib only: on the init import chain.
"""

from __future__ import annotations

import threading
import time

_local = threading.local()


def set_deadline(epoch_ms: int | float | None) -> None:
    """This thread's invocation ends at `epoch_ms` (Unix epoch, milliseconds); None: no deadline."""
    _local.deadline_ms = epoch_ms


def deadline_ms() -> int | float | None:
    """This thread's deadline (epoch ms), or None."""
    value: int | float | None = getattr(_local, "deadline_ms", None)
    return value


def remaining_s() -> float | None:
    """Seconds left before this thread's deadline (negative once past it); None without a deadline."""
    deadline = deadline_ms()
    if deadline is None:
        return None
    return deadline / 1000 - time.time()
