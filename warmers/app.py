"""The scheduled warmer: `warmers.app.lambda_handler`, invoked by an EventBridge schedule.

Configured by the environment (WARMSTART_WARM_TARGETS as a JSON list or comma-separated names/ARNs,
WARMSTART_WARM_CONCURRENCY, WARMSTART_WARM_HOLD_MS, WARMSTART_WARM_HISTORY, ...) and, per rule, by the event:
`{"targets": [...], "concurrency": N, "hold_ms": N, "prewarm": true, "payload_style": "..."}` wins over the
environment (an EventBridge rule's constant input is such an event). Returns the run report and prints it as one
JSON line for CloudWatch Logs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from warmers import metrics
from warmers.adaptive import History, Policy, chooser, history_from
from warmers.config import (
    ENV_CONCURRENCY,
    ENV_PAYLOAD_STYLE,
    ENV_TARGETS,
    MAX_CONCURRENCY,
    MAX_HOLD_MS,
    ConfigError,
    WarmerConfig,
    integer,
    parse_targets,
)
from warmers.fanout import Warmer

EVENT_KEYS = ("targets", "concurrency", "qualifier", "hold_ms", "prewarm", "payload_style")

# Built once per instance (warm invocations reuse the client and its connections), keyed by configuration.
_warmers: dict[WarmerConfig, tuple[Warmer, History | None]] = {}


def config_for(event: Any, environ: Mapping[str, str] | None = None) -> tuple[WarmerConfig, bool]:
    """(config, prewarm) from the environment, overridden by the event's own keys when it has any."""
    env = os.environ if environ is None else environ
    config = WarmerConfig.from_environ(env)
    if not isinstance(event, Mapping) or not any(key in event for key in EVENT_KEYS):
        return config, False  # a plain EventBridge "Scheduled Event": the environment says everything
    overrides: dict[str, Any] = {}
    if "hold_ms" in event:
        overrides["hold_ms"] = integer("hold_ms", event["hold_ms"], 0, MAX_HOLD_MS)
    if "targets" in event or "concurrency" in event or "payload_style" in event or "qualifier" in event:
        raw = event.get("targets", env.get(ENV_TARGETS, ""))
        overrides["targets"] = parse_targets(
            raw,
            concurrency=integer(
                "concurrency", event.get("concurrency", env.get(ENV_CONCURRENCY, 1)), 1, MAX_CONCURRENCY
            ),
            qualifier=event.get("qualifier"),
            style=str(event.get("payload_style", env.get(ENV_PAYLOAD_STYLE, "warmstart"))),
        )
    config = replace(config, **overrides)
    return config, bool(event.get("prewarm", False))


def lambda_handler(event: Any, context: Any = None) -> dict[str, Any]:
    config, prewarm = config_for(event)
    if not config.targets:
        raise ConfigError("no targets: set WARMSTART_WARM_TARGETS or pass {'targets': [...]} in the event")
    cached = _warmers.get(config)
    if cached is None:
        if len(_warmers) >= 8:  # events may vary per rule; keep the cache bounded
            _warmers.clear()
        cached = _warmers[config] = (Warmer(config), history_from(config))
    warmer, history = cached
    pick = chooser(history, Policy.from_config(config)) if history is not None else None
    correlation_id = getattr(context, "aws_request_id", None)
    report = warmer.run(chooser=pick, prewarm=prewarm, correlation_id=correlation_id)
    body = report.to_dict()
    print(metrics.lines(body) + json.dumps({"warmstart_warm": body}, separators=(",", ":")), flush=True)
    return body
