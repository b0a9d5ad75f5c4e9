"""Status and leak diagnostics: threads, memory, pool and worker stats, and a tracemalloc diff on request.

Asked by a direct invoke `{"warmstart": "status"}` (everything), or `GET /status` on the HTTP host (counts
and health only, unless `WARMSTART_HTTP_STATUS=full`). Tracing is the operator's to start, never an HTTP
caller's: a direct invoke `{"warmstart": "status", "tracemalloc": true}` (for `"tracemalloc_s"` seconds,
default 300, at most 3600), or `WARMSTART_TRACEMALLOC_S` from the end of init. It costs (~2x slower
allocations; 13-15% slower inference measured), so it stops by itself when its time is up: checked at each
invocation, so no timer thread is needed and the stop survives a fork snapshot. While it runs, each status
request with `"tracemalloc": true` reports the top `"top"` (default 10) allocation sites by growth since the
previous such request: what grows across invocations is what leaks.
"""

from __future__ import annotations

import gc
import threading
import time
import tracemalloc
from typing import Any

from handler.core.errors import InvalidInputError
from handler.core.types import JSON
from handler.observability.report import memory_mb

MAX_TOP = 50
DEFAULT_TRACE_S = 300
MAX_TRACE_S = 3600
# The tracer's own bookkeeping and the import machinery are not the function's leaks.
_IGNORED = (
    tracemalloc.__file__,
    "<frozen importlib._bootstrap>",
    "<frozen importlib._bootstrap_external>",
    "<unknown>",
)


def is_status(payload: JSON) -> bool:
    return isinstance(payload, dict) and payload.get("warmstart") == "status"


def _now() -> float:
    return time.monotonic()  # one name for tests to move the clock of this module only


def _seconds(payload: dict[str, Any]) -> int | None:
    raw = payload.get("tracemalloc_s")
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= MAX_TRACE_S:
        raise InvalidInputError(
            f"tracemalloc_s must be an integer number of seconds in [1, {MAX_TRACE_S}], got {raw!r}"
        )
    return raw


class _Tracing:
    """The process's one tracemalloc window (tracing is process-wide, so is its deadline)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.deadline: float | None = None  # set while tracing that warmstart started runs
        self.snapshot: tracemalloc.Snapshot | None = None

    def start_locked(self, seconds: int) -> None:
        if not tracemalloc.is_tracing():
            tracemalloc.start()
            self.snapshot = None
        self.deadline = _now() + seconds

    def stop_locked(self) -> None:
        if self.deadline is not None:  # only what we started: PYTHONTRACEMALLOC's tracing is the user's
            tracemalloc.stop()
        self.deadline, self.snapshot = None, None


_tracing = _Tracing()


class Diagnostics:
    def facts(self) -> dict[str, Any]:
        threads = threading.enumerate()
        return {
            "threads": {"count": len(threads), "names": sorted(t.name for t in threads)},
            **memory_mb(),
            "gc": {"counts": list(gc.get_count()), "objects": len(gc.get_objects())},
        }

    @property
    def tracing(self) -> bool:
        return tracemalloc.is_tracing()

    def tick(self) -> None:
        """Stop tracing whose time is up; called at each invocation (a read of one attribute otherwise)."""
        deadline = _tracing.deadline
        if deadline is not None and _now() >= deadline:
            with _tracing.lock:
                if _tracing.deadline is not None and _now() >= _tracing.deadline:
                    _tracing.stop_locked()

    def start_tracing(self, seconds: int) -> None:
        """The operator's switch (`WARMSTART_TRACEMALLOC_S`): trace for `seconds`, then stop by itself."""
        with _tracing.lock:
            _tracing.start_locked(min(seconds, MAX_TRACE_S))

    def stop_tracing(self) -> None:
        with _tracing.lock:
            _tracing.stop_locked()

    def tracemalloc(self, payload: dict[str, Any]) -> dict[str, Any] | None:
        self.tick()
        if payload.get("tracemalloc") is not True:
            return None
        top = payload.get("top", 10)
        if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= MAX_TOP:
            raise InvalidInputError(f"top must be an integer in [1, {MAX_TOP}], got {top!r}")
        seconds = _seconds(payload)
        with _tracing.lock:
            if not tracemalloc.is_tracing() or seconds is not None:
                _tracing.start_locked(seconds or DEFAULT_TRACE_S)
            snapshot = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, pattern) for pattern in _IGNORED]
            )
            previous, _tracing.snapshot = _tracing.snapshot, snapshot
            deadline = _tracing.deadline
        current, peak = tracemalloc.get_traced_memory()
        out: dict[str, Any] = {"traced_kb": round(current / 1024, 1), "peak_kb": round(peak / 1024, 1)}
        out["stops_in_s"] = None if deadline is None else round(max(0.0, deadline - _now()), 1)
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
