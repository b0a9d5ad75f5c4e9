"""Metrics: CloudWatch Embedded Metric Format (EMF) lines on Lambda; the HTTP host swaps in Prometheus.

Why hand-written: EMF is one JSON line on stdout that CloudWatch Logs turns into metrics. The official
`aws-embedded-metrics` library (and Powertools' Metrics) import dozens of modules at init and build a dict per
record; here the constant part of each record (namespace, dimension sets, metric declarations, dimension
values) is serialized once per record shape and cached, so an invocation pays for a few numbers, two ids and
one write (bench/hotpath/observability.py measures it against the 50 µs budget). Cold start is the product:
nothing here imports beyond the standard library.

What is emitted (names shared with Prometheus, `docs/observability.md`):
- on each invocation: `Requests`, `HandlerDuration` (ms), `BatchSize`, `Tokens`, `Errors` (also by
  `error_type`), `Faults` (internal errors only), `Pings`; on an instance's first invocation `ColdStart`, or
  `RestoreStart` when the instance was restored from a SnapStart snapshot (counted apart);
- in the init report line: `InitDuration` and `Init<Phase>Duration` per init phase; in the restore line:
  `RestoreDuration`.
Dimensions: `function_name`, `model` (id@version), `backend`; `error_type` for `Errors`; and a small set by
`function_name` + `function_version` (Lambda version) for rollback alarms during a deployment.

Settings (read at init): `WARMSTART_METRICS` = `emf` (default on Lambda) | `init` (init, restore and cold
starts only: per-invocation metrics off) | `off` (default elsewhere); `WARMSTART_METRICS_NAMESPACE`
(default `warmstart`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeAlias

from handler.core.errors import ConfigError
from handler.core.types import Protocol
from handler.observability import logs

Mode: TypeAlias = "Literal['emf', 'init', 'off']"  # a string at run time: see backends.registry.Needs
MODES: tuple[Mode, ...] = ("emf", "init", "off")
DEFAULT_NAMESPACE = "warmstart"
DIMENSIONS = ("function_name", "model", "backend")
VERSION_DIMENSIONS = ("function_name", "function_version")
# Metrics also published by function version (the rollback alarms' view of one deployment): only those of
# rare records (cold starts, init, restore, faults), so a warm invocation's line stays short. The error rate of a
# version divides `Faults` by AWS/Lambda's own `Invocations` by `ExecutedVersion`.
BY_VERSION = frozenset({"Faults", "ColdStart", "RestoreStart", "InitDuration", "RestoreDuration"})
UNITS = {
    "Requests": "Count",
    "HandlerDuration": "Milliseconds",
    "BatchSize": "Count",
    "Tokens": "Count",
    "Errors": "Count",
    "Faults": "Count",
    "Pings": "Count",
    "ColdStart": "Count",
    "RestoreStart": "Count",
    "InitDuration": "Milliseconds",
    "RestoreDuration": "Milliseconds",
}
# The same measurements on the HTTP host (handler.observability.prometheus): Prometheus names for the EMF ones.
PROMETHEUS = {
    "Requests": "warmstart_requests_total",
    "HandlerDuration": "warmstart_handler_duration_milliseconds",
    "BatchSize": "warmstart_batch_size",
    "Tokens": "warmstart_tokens_total",
    "Errors": "warmstart_errors_total",
    "Faults": "warmstart_faults_total",
    "Pings": "warmstart_pings_total",
    "ColdStart": "warmstart_cold_start_total",
    "RestoreStart": "warmstart_restore_start_total",
    "InitDuration": "warmstart_init_duration_milliseconds",
    "InitPhaseDuration": "warmstart_init_phase_duration_milliseconds",  # Init<Phase>Duration, labelled by phase
    "RestoreDuration": "warmstart_restore_duration_milliseconds",
}
_encode: Callable[[str], str] = json.encoder.encode_basestring  # the C encoder: a quoted JSON string


def _declare(name: str) -> dict[str, str]:
    unit = UNITS.get(name, "Milliseconds")
    return {"Name": name} if unit == "Count" else {"Name": name, "Unit": unit}


def phase_metric(phase: str) -> str:
    """`session` → `InitSessionDuration` (EMF); Prometheus labels the phase instead."""
    return "Init" + "".join(p[:1].upper() + p[1:] for p in phase.replace("-", "_").split("_")) + "Duration"


def mode_from_environ(environ: Mapping[str, str] | None = None) -> Mode:
    env = os.environ if environ is None else environ
    raw = env.get("WARMSTART_METRICS", "").strip().lower()
    if not raw:
        return "emf" if env.get("AWS_LAMBDA_FUNCTION_NAME") else "off"
    for mode in MODES:
        if raw == mode:
            return mode
    raise ConfigError(f"WARMSTART_METRICS={raw!r}; valid values: {', '.join(MODES)}")


class Recorder(Protocol):
    """Where the runtime's measurements go: EMF lines (Lambda), Prometheus (HTTP host), or nowhere."""

    def invocation(self, inv: logs.Invocation, ms: float, restored: bool) -> None: ...

    def report_fields(self, record: Mapping[str, Any]) -> dict[str, Any]: ...


class NoMetrics:
    def invocation(self, inv: logs.Invocation, ms: float, restored: bool) -> None:
        pass

    def report_fields(self, record: Mapping[str, Any]) -> dict[str, Any]:
        return {}


class Emf:
    """EMF records to stdout. `report_fields` adds metrics to the init and restore report lines (one line
    each, no extra record); `invocation` writes one line per invocation, which is also its structured log
    record (`function_request_id`, `xray_trace_id`, `cold_start`, `model`)."""

    def __init__(
        self,
        namespace: str = DEFAULT_NAMESPACE,
        dimensions: Mapping[str, str] | None = None,
        function_version: str | None = None,
        per_invocation: bool = True,
        level: str = "INFO",
        write: Callable[[str], Any] | None = None,
    ) -> None:
        self.namespace = namespace
        self.dimensions = dict(dimensions or {})
        self.function_version = function_version
        self.per_invocation = per_invocation
        self.level = level
        self._write = write  # None: sys.stdout at the time of writing (awslambdaric and pytest replace it)
        # (metric names, has an error, model) -> the record's constant middle, serialized once
        self._prefixes: dict[tuple[tuple[str, ...], bool, str], str] = {}

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], model: str, backend: str, mode: Mode | None = None) -> Recorder:
        mode = mode or mode_from_environ(environ)
        if mode == "off":
            return NoMetrics()
        function = environ.get("AWS_LAMBDA_FUNCTION_NAME") or "local"
        return cls(
            namespace=environ.get("WARMSTART_METRICS_NAMESPACE", "").strip() or DEFAULT_NAMESPACE,
            dimensions={"function_name": function, "model": model, "backend": backend},
            function_version=environ.get("AWS_LAMBDA_FUNCTION_VERSION") or None,
            per_invocation=mode == "emf",
            level=logs.keep_level(environ),
        )

    def directive(self, names: tuple[str, ...], error: bool) -> list[dict[str, Any]]:
        """The `_aws.CloudWatchMetrics` list for a record holding `names`."""
        base = [d for d in DIMENSIONS if d in self.dimensions]
        # Counts are declared without a unit (CloudWatch's "None"): ~20 bytes less per metric on every line.
        declared = [_declare(n) for n in names]
        directives: list[dict[str, Any]] = [{"Namespace": self.namespace, "Dimensions": [base], "Metrics": declared}]
        if error:
            errors = [_declare("Errors")]
            directives.append({"Namespace": self.namespace, "Dimensions": [[*base, "error_type"]], "Metrics": errors})
        by_version = [d for d in declared if d["Name"] in BY_VERSION]
        if self.function_version and by_version:
            dims = [d for d in VERSION_DIMENSIONS if d == "function_version" or d in self.dimensions]
            directives.append({"Namespace": self.namespace, "Dimensions": [dims], "Metrics": by_version})
        return directives

    def _prefix(self, names: tuple[str, ...], error: bool, model: str) -> str:
        key = (names, error, model)
        cached = self._prefixes.get(key)
        if cached is None:
            directives = json.dumps(self.directive(names, error), separators=(",", ":"))
            dims = {**self.dimensions, "model": model} if "model" in self.dimensions else self.dimensions
            static = "".join(f",{_encode(k)}:{_encode(v)}" for k, v in dims.items())
            if self.function_version:
                static += f',"function_version":{_encode(self.function_version)}'
            static += f',"level":{_encode(self.level)},"message":"invocation"'
            if len(self._prefixes) > 256:  # bounded: models and error types are few, but never trust that
                self._prefixes.clear()
            cached = self._prefixes[key] = f',"CloudWatchMetrics":{directives}}}{static}'
        return cached

    def report_fields(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """EMF members for an init or restore report: merged into that line, so no second record."""
        kind = record.get("warmstart")
        values: dict[str, Any] = {}
        if kind == "init":
            values["InitDuration"] = record.get("total_ms", 0.0)
            for phase, ms in (record.get("phases_ms") or {}).items():
                values[phase_metric(phase)] = ms
        elif kind == "restore":
            values["RestoreDuration"] = record.get("total_ms", 0.0)
        if not values:
            return {}
        aws = {"Timestamp": int(time.time() * 1000), "CloudWatchMetrics": self.directive(tuple(values), error=False)}
        out: dict[str, Any] = {"_aws": aws, **self.dimensions, **values}
        if self.function_version:
            out["function_version"] = self.function_version
        return out

    def invocation(self, inv: logs.Invocation, ms: float, restored: bool) -> None:
        first = inv.cold_start
        if not self.per_invocation and not first:
            return
        names: list[str] = []
        parts: list[str] = []
        if self.per_invocation:
            if inv.kind == "ping":
                names.append("Pings")
                parts.append(',"Pings":1')
            elif inv.kind == "inference":
                names += ("Requests", "HandlerDuration", "BatchSize", "Tokens")
                parts.append(f',"Requests":1,"HandlerDuration":{ms:.3f},"BatchSize":{inv.batch},"Tokens":{inv.tokens}')
                if inv.error is not None:
                    names += ("Errors", "Faults")
                    parts.append(f',"Errors":1,"Faults":{int(inv.fault)},"error_type":{_encode(inv.error)}')
        if first:
            name = "RestoreStart" if restored else "ColdStart"
            names.append(name)
            parts.append(f',"{name}":1')
        if not names:
            return
        now = time.time()
        prefix = self._prefix(tuple(names), inv.error is not None and "Errors" in names, inv.model)
        ids = f',"function_request_id":{_encode(inv.request_id or "")}'
        if inv.trace_id:
            ids += f',"xray_trace_id":{_encode(inv.trace_id)}'
        line = (
            f'{{"_aws":{{"Timestamp":{int(now * 1000)}{prefix},"timestamp":"{logs.timestamp(now)}"{ids}'
            f',"cold_start":{"true" if first else "false"}{"".join(parts)}}}\n'
        )
        if self._write is not None:
            self._write(line)
        else:
            sys.stdout.write(line)
            sys.stdout.flush()
