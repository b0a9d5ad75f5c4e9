"""Status and leak diagnostics: threads, memory, pool and worker stats, and a tracemalloc diff on request.

Asked by a direct invoke `{"warmstart": "status"}` or `GET /status` on the HTTP host. With
`"tracemalloc": true` the first request starts tracing (it has a cost: ~2x slower allocations, so it is
never on by default) and each later one reports the top `"top"` (default 10) allocation sites by growth
since the previous such request: what grows across invocations is what leaks.
"""

from __future__ import annotations

import gc
import threading
import tracemalloc
from typing import Any

from handler.errors import InvalidInputError
from handler.report import memory_mb
from handler.types import JSON

MAX_TOP = 50
# The tracer's own bookkeeping and the import machinery are not the function's leaks.
_IGNORED = (
    tracemalloc.__file__,
    "<frozen importlib._bootstrap>",
    "<frozen importlib._bootstrap_external>",
    "<unknown>",
)


def is_status(payload: JSON) -> bool:
    return isinstance(payload, dict) and payload.get("warmstart") == "status"


class Diagnostics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshot: tracemalloc.Snapshot | None = None

    def facts(self) -> dict[str, Any]:
        threads = threading.enumerate()
        return {
            "threads": {"count": len(threads), "names": sorted(t.name for t in threads)},
            **memory_mb(),
            "gc": {"counts": list(gc.get_count()), "objects": len(gc.get_objects())},
        }

    def tracemalloc(self, payload: dict[str, Any]) -> dict[str, Any] | None:
        if payload.get("tracemalloc") is not True:
            return None
        top = payload.get("top", 10)
        if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= MAX_TOP:
            raise InvalidInputError(f"top must be an integer in [1, {MAX_TOP}], got {top!r}")
        with self._lock:
            if not tracemalloc.is_tracing():
                tracemalloc.start()
                self._snapshot = None
            snapshot = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, pattern) for pattern in _IGNORED]
            )
            previous, self._snapshot = self._snapshot, snapshot
        current, peak = tracemalloc.get_traced_memory()
        out: dict[str, Any] = {"traced_kb": round(current / 1024, 1), "peak_kb": round(peak / 1024, 1)}
        if previous is None:
            out["started"] = True  # the next status request reports growth since this one
            return out
        diff = snapshot.compare_to(previous, "lineno")
        out["growth_kb"] = round(sum(d.size_diff for d in diff) / 1024, 1)
        out["top"] = [
            {
                "where": f"{d.traceback[0].filename}:{d.traceback[0].lineno}",
                "size_diff_kb": round(d.size_diff / 1024, 2),
                "count_diff": d.count_diff,
                "size_kb": round(d.size / 1024, 2),
            }
            for d in diff[:top]
        ]
        return out
