"""The HTTP host's metrics: Prometheus text format at `GET /metrics`, the same measurements as EMF on Lambda.

Imported only by `handler.http_host.routes` (prometheus_client is in the `http` extra, never on Lambda's import chain).
Names follow the EMF ones (`metrics.PROMETHEUS` maps them): `Requests` → `warmstart_requests_total`,
`HandlerDuration` → `warmstart_handler_duration_milliseconds`, the init phases as one gauge with a `phase`
label. Labels: `model`, `backend` (and `error_type` on errors). One registry per host, not the global one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from handler.observability import logs
from handler.observability.metrics import PROMETHEUS

__all__ = ["CONTENT_TYPE_LATEST", "Prometheus"]

log = logging.getLogger(logs.LOGGER)
LABELS = ("model", "backend")
DURATION_BUCKETS_MS = (1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _base(name: str) -> str:
    """prometheus_client appends `_total` to counters itself."""
    return PROMETHEUS[name].removesuffix("_total")


class Prometheus:
    def __init__(self, backend: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.backend = backend
        r = self.registry
        self.requests = Counter(_base("Requests"), "Inference requests served", LABELS, registry=r)
        self.duration = Histogram(
            _base("HandlerDuration"), "Handler time per request (ms)", LABELS, buckets=DURATION_BUCKETS_MS, registry=r
        )
        self.batch = Histogram(_base("BatchSize"), "Inputs per request", LABELS, buckets=BATCH_BUCKETS, registry=r)
        self.tokens = Counter(_base("Tokens"), "Tokens run through the model", LABELS, registry=r)
        self.errors = Counter(_base("Errors"), "Failed requests by error type", (*LABELS, "error_type"), registry=r)
        self.faults = Counter(_base("Faults"), "Internal errors (5xx)", LABELS, registry=r)
        self.pings = Counter(_base("Pings"), "Health pings answered", LABELS, registry=r)
        self.cold = Counter(_base("ColdStart"), "First requests of an instance that ran init", LABELS, registry=r)
        self.restores = Counter(_base("RestoreStart"), "First requests of a restored instance", LABELS, registry=r)
        self.init = Gauge(_base("InitDuration"), "Init phase of this instance (ms)", LABELS, registry=r)
        self.phases = Gauge(
            PROMETHEUS["InitPhaseDuration"], "Each init phase of this instance (ms)", (*LABELS, "phase"), registry=r
        )
        self.restore = Gauge(_base("RestoreDuration"), "After-restore hooks (ms)", LABELS, registry=r)

    def labels(self, model: str) -> tuple[str, str]:
        return model, self.backend

    def init_report(self, record: Mapping[str, Any]) -> None:
        """The instance's init (and restore) figures as gauges."""
        model = str(record.get("model", ""))
        self.init.labels(*self.labels(model)).set(float(record.get("total_ms") or 0.0))
        for phase, ms in (record.get("phases_ms") or {}).items():
            self.phases.labels(*self.labels(model), phase).set(float(ms))
        restore = record.get("restore")
        if isinstance(restore, Mapping):
            self.restore.labels(*self.labels(model)).set(float(restore.get("total_ms") or 0.0))

    def ping(self, model: str) -> None:
        self.pings.labels(*self.labels(model)).inc()

    def invocation(self, inv: logs.Invocation, ms: float, restored: bool) -> None:
        labels = self.labels(inv.model)
        if inv.cold_start:
            (self.restores if restored else self.cold).labels(*labels).inc()
        if inv.kind == "ping":
            self.pings.labels(*labels).inc()
            return
        if inv.kind != "inference":
            return
        self.requests.labels(*labels).inc()
        self.duration.labels(*labels).observe(ms)
        if inv.batch:
            self.batch.labels(*labels).observe(inv.batch)
        self.tokens.labels(*labels).inc(inv.tokens)
        if inv.error is not None:
            self.errors.labels(*labels, inv.error).inc()
            if inv.fault:
                self.faults.labels(*labels).inc()
        # The request's access record (uvicorn's access log is off): in its context, with its trace id.
        log.info("invocation %.3f ms", ms)

    def report_fields(self, record: Mapping[str, Any]) -> dict[str, Any]:
        return {}

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
