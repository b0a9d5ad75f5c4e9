"""The warmer's own CloudWatch EMF metrics, one line per target of a run: `Asked`, `Distinct`, `Cold`,
`Shortfall` (dimension `target`, namespace `WARMSTART_METRICS_NAMESPACE`, default `warmstart`), so the dashboard
shows what each run proved next to the model functions' cold starts. Standard library only."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

METRICS = ("Asked", "Distinct", "Cold", "Shortfall")


def timestamp(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"


def emf_records(run: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    env = os.environ if environ is None else environ
    namespace = env.get("WARMSTART_METRICS_NAMESPACE", "").strip() or "warmstart"
    # A metric, not a message: at the level Lambda's log-level filter keeps (INFO, or the threshold above it).
    threshold = env.get("AWS_LAMBDA_LOG_LEVEL", "").strip().upper().replace("WARNING", "WARN")
    level = threshold if threshold in ("WARN", "ERROR", "FATAL") else "INFO"
    now = time.time()
    records = []
    for target in run.get("targets", []):
        directive = {"Namespace": namespace, "Dimensions": [["target"]], "Metrics": [{"Name": m} for m in METRICS]}
        records.append(
            {
                "_aws": {"Timestamp": int(now * 1000), "CloudWatchMetrics": [directive]},
                "level": level,
                "timestamp": timestamp(now),
                "message": "warm run",
                "correlation_id": run.get("correlation_id"),
                "target": str(target["target"]),
                "Asked": target["asked"],
                "Distinct": target["distinct"],
                "Cold": target["cold"],
                "Shortfall": target["shortfall"],
            }
        )
    return records


def lines(run: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> str:
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in emf_records(run, environ))
