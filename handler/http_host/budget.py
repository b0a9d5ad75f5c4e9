"""The bytes of request bodies one HTTP host holds at once: read, queued or running.

Each body is bounded by the payload limit, but a host holds many at once (the queue takes one full batch per
worker, 64 on two CPUs), and on Knative or Cloud Run a body may be 32 MB: 64 of them are 2 GB of bytes alone,
twice the deploy manifests' 1 GiB, before JSON parsing doubles them. So the host keeps a budget: a body is
charged as it arrives (its Content-Length up front when it sends one) and released when its answer is done,
or when its work ends after its client left. A body that would go over the budget is refused at once with 503
and `Retry-After` (as a full queue is): the instance is at capacity, another instance or a retry serves it.
A body alone may always use the whole budget, so a budget below the payload limit still serves one at a time.

Charged from the event loop, released from worker threads (an abandoned request's work ends there): a lock.
"""

from __future__ import annotations

import threading

from handler.core.errors import ServiceBusyError


class BodyBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.high_water = 0
        self.refused = 0
        self._lock = threading.Lock()

    def charge(self, size: int) -> None:
        """Hold `size` more bytes, or raise ServiceBusyError (nothing held) when the budget has no room."""
        with self._lock:
            if self.held and self.held + size > self.limit:
                self.refused += 1
                raise ServiceBusyError(
                    f"{self.held} bytes of request bodies already in flight, the limit is {self.limit} "
                    "(WARMSTART_HTTP_BODY_BUDGET_BYTES); retry shortly (instance at capacity)"
                )
            self.held += size
            self.high_water = max(self.high_water, self.held)

    def release(self, size: int) -> None:
        with self._lock:
            self.held -= size

    def describe(self) -> dict[str, int]:
        with self._lock:
            return {"limit": self.limit, "held": self.held, "high_water": self.high_water, "refused": self.refused}
