"""Control replies: warm pings, `{"warmstart": "status"}` and the HTTP host's basic `/status`. None of them
touches the model or goes through the worker pool."""

from __future__ import annotations

import threading
import time
from typing import Any

from handler.api.ping import hold_ms
from handler.observability import report
from handler.runtime.instance import Instance


def ping(instance: Instance, payload: dict[str, Any], context: Any, cold: bool, count: int) -> dict[str, Any]:
    remaining = context.get_remaining_time_in_millis() if context is not None else None
    held = hold_ms(payload, instance.config.max_hold_ms, remaining)
    if held:
        time.sleep(held / 1000)
    reply = {
        "warm": True,
        "instance_id": instance.instance_id,
        "cold": cold,
        "init_ms": instance.init_report["total_ms"],
        "invocations": count,
        "held_ms": held,
        "model": instance.manifest.key,
    }
    if "correlation_id" in payload:
        reply["correlation_id"] = payload["correlation_id"]
    return reply


def status(instance: Instance, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    """Instance facts for `{"warmstart": "status"}` and `GET /status` (full): never touches the model."""
    leaks = instance.diagnostics.tracemalloc(payload or {})
    reloader = instance.reloader
    reply: dict[str, Any] = {
        "warmstart": "status",
        "instance_id": instance.instance_id,
        "model": instance.manifest.key,
        "init_type": instance.init_report.get("init_type"),
        "restore": instance.init_report.get("restore"),
        "uptime_s": round(time.monotonic() - instance.started, 3),
        "invocations": instance.counted(),
        **instance.diagnostics.facts(),
        "pool": instance.pool.stats(),
        "workers": instance.workers.stats() if instance.workers else None,
        "models": instance.registry.describe(),
        "reload": reloader.describe(),
        "cache": reloader.sources.describe_cache(),  # None unless a model came from S3
    }
    if leaks is not None:
        reply["tracemalloc"] = leaks
    if payload and payload.get("golden") is True:  # the PreTraffic hook's question (warmers.pretraffic)
        reply["golden"] = instance.manifest.golden()
    return reply


def health(instance: Instance) -> dict[str, Any]:
    """What `GET /status` shows whoever reaches the HTTP port: counts and health only. No model sources
    (s3:// URIs, paths), reload errors or pointer; tracing cannot be started from there."""
    reloader = instance.reloader
    last = reloader.last
    return {
        "warmstart": "status",
        "detail": "basic",
        "instance_id": instance.instance_id,
        "model": instance.manifest.key,
        "uptime_s": round(time.monotonic() - instance.started, 3),
        "invocations": instance.counted(),
        "models": instance.registry.counts(),
        "reload": {"running": reloader.running, "last_ok": None if last is None else last["ok"]},
        "workers": instance.workers.stats() if instance.workers else None,
        "threads": threading.active_count(),
        "tracemalloc": instance.diagnostics.tracing,
        **report.memory_mb(),
    }
