"""Init-phase timing and the one structured JSON init report line.

Report lines (init, snapshot, restore) carry `level`, `timestamp` and `message` like every other line, at a
level Lambda's log-level filtering never drops (`logs.keep_level`), and the metrics of the record (EMF
members, `handler.observability.metrics`) when metrics are on: one line each, no second record.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from handler.core.types import Protocol
from handler.observability import logs


class _Fields(Protocol):
    def report_fields(self, record: dict[str, Any]) -> dict[str, Any]: ...


# The instance's metrics recorder (set by Runtime.start): its EMF members are merged into each report line.
metrics: _Fields | None = None


class PhaseTimer:
    """Wall-clock milliseconds per named phase, in order."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.phases: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = round(self.phases.get(name, 0.0) + (time.perf_counter() - t0) * 1000, 3)

    def total_ms(self) -> float:
        return round((time.perf_counter() - self.started) * 1000, 3)


def memory_mb() -> dict[str, float]:
    """Current and peak resident set size from /proc (no psutil on the import chain)."""
    out: dict[str, float] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key = "rss_mb" if line.startswith("VmRSS") else "peak_rss_mb"
                    out[key] = round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return out


def process_age_ms() -> float | None:
    """Milliseconds since this process started (exec), from /proc; covers interpreter start-up and imports
    that ran before our first line. Resolution is the kernel's clock tick (10 ms)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return round((uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")) * 1000, 1)


MESSAGES = {"init": "init report", "snapshot": "before snapshot", "restore": "after restore"}


def emit(record: dict[str, Any], stream: TextIO | None = None) -> None:
    """One JSON line: CloudWatch (and our local Lambda) keep it as a single searchable event."""
    out = stream or sys.stdout
    kind = str(record.get("warmstart", ""))
    line = logs.stamp(record, MESSAGES.get(kind, kind or "report"))
    if metrics is not None:
        line.update(metrics.report_fields(record))
    out.write(json.dumps(line, separators=(",", ":"), default=str) + "\n")
    out.flush()
