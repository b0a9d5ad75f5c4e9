"""Trace ids: Lambda's `_X_AMZN_TRACE_ID`, the HTTP `traceparent` (W3C) and `X-Amzn-Trace-Id` headers, and
OpenTelemetry spans when, and only when, OpenTelemetry is in use.

The X-Ray root id (`1-5759e988-bd862e3fe1be46a994272793`) is what logs carry as `xray_trace_id` (Powertools'
key): a W3C trace id maps onto it one to one (`1-` + first 8 hex digits + `-` + the other 24), which is how
X-Ray and ADOT join the two.

OpenTelemetry is never imported by this module on its own: spans are made when `opentelemetry.trace` is
already loaded (an ADOT layer or the user's code set it up before our init) or `WARMSTART_OTEL=1` asks for it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from handler.core.config import env_switch

if TYPE_CHECKING:  # the optional dependency, for its types only
    from opentelemetry.trace import Span, Tracer

ENV = "_X_AMZN_TRACE_ID"
_HEX = "0123456789abcdef"


def _hex(text: str, digits: int) -> bool:
    """`digits` lowercase hex digits. String operations, not the regexes they replace: compiling two patterns
    at import was ~3% of this package's init instructions (docs/benchmarks.md, "Against a tuned floor")."""
    return len(text) == digits and not text.strip(_HEX)


def xray_root(header: str | None) -> str | None:
    """`Root=1-...;Parent=...;Sampled=1` → `1-...` (None when absent or malformed)."""
    if not header:
        return None
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == "Root":
            parts = value.split("-")  # 1-{8 hex}-{24 hex}
            ok = len(parts) == 3 and parts[0] == "1" and _hex(parts[1], 8) and _hex(parts[2], 24)
            return value if ok else None
    return None


def lambda_trace_id() -> str | None:
    """This invocation's X-Ray root: awslambdaric sets `_X_AMZN_TRACE_ID` from the Runtime API per invoke."""
    return xray_root(os.environ.get(ENV))


def from_traceparent(header: str | None) -> str | None:
    """A W3C `traceparent` → the X-Ray root id of the same trace (None when malformed or all-zero)."""
    if not header:
        return None
    parts = header.strip().lower().split("-")  # {2 hex}-{32 hex}-{16 hex}-{2 hex}
    if len(parts) != 4 or not all(_hex(p, n) for p, n in zip(parts, (2, 32, 16, 2), strict=True)):
        return None
    version, trace, parent = parts[0], parts[1], parts[2]
    if version == "ff" or set(trace) == {"0"} or set(parent) == {"0"}:
        return None
    return f"1-{trace[:8]}-{trace[8:]}"


def from_headers(headers: Mapping[str, str]) -> tuple[str | None, dict[str, str]]:
    """(xray_trace_id, headers to echo) for an HTTP request: `traceparent` wins when both are valid, and
    only valid headers are echoed back."""
    echo: dict[str, str] = {}
    trace_id = None
    parent = headers.get("traceparent")
    if parent and (tid := from_traceparent(parent)):
        echo["traceparent"] = parent.strip()
        trace_id = tid
    amzn = headers.get("x-amzn-trace-id")
    if amzn and (root := xray_root(amzn)):
        echo["x-amzn-trace-id"] = amzn.strip()
        trace_id = trace_id or root
    return trace_id, echo


# -- OpenTelemetry (optional) ------------------------------------------------------------------------------


def otel_tracer(environ: Mapping[str, str] | None = None) -> Tracer | None:
    """An OpenTelemetry tracer if OpenTelemetry is in use, else None (and nothing imported)."""
    env = os.environ if environ is None else environ
    wanted = env_switch(env, "WARMSTART_OTEL")  # None: only if OpenTelemetry is already in use
    if wanted is False or (wanted is None and "opentelemetry.trace" not in sys.modules):
        return None
    try:
        from opentelemetry import trace  # deferred: only where OpenTelemetry is already in use or asked for
    except ImportError:
        return None
    return trace.get_tracer("warmstart")


def init_spans(
    tracer: Tracer | None, phases_ms: Mapping[str, float], total_ms: float, attributes: Mapping[str, Any]
) -> None:
    """The init phase as one span with a child per phase, laid end to end back from now (phases run in turn)."""
    if tracer is None:
        return
    from opentelemetry import trace

    end = time.time_ns()
    start = end - int(total_ms * 1e6)
    root = tracer.start_span("warmstart.init", start_time=start, attributes=dict(attributes))
    ctx = trace.set_span_in_context(root)
    at = start
    for name, ms in phases_ms.items():
        span = tracer.start_span(f"warmstart.init.{name}", context=ctx, start_time=at)
        at += int(ms * 1e6)
        span.end(end_time=at)
    root.end(end_time=end)


@contextmanager
def span(tracer: Tracer | None, name: str, attributes: Mapping[str, Any]) -> Iterator[Span | None]:
    if tracer is None:
        yield None
        return
    with tracer.start_as_current_span(name, attributes=dict(attributes)) as s:
        yield s
