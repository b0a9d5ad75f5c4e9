"""What to warm and how: targets (function + qualifier + N), the ping payload style, timeouts and retry bounds.

Everything comes from keyword arguments, an event (the scheduled warmer) or the environment (`environ=None`
reads `os.environ`, tests pass a dict). Closed sets are validated here, at the boundary, with errors that
list the valid choices.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

PayloadStyle = Literal["warmstart", "lambda-warmer", "serverless-plugin-warmup"]
PAYLOAD_STYLES: tuple[PayloadStyle, ...] = get_args(PayloadStyle)

# Lambda's default per-account concurrency: asking for more can only be throttled.
MAX_CONCURRENCY = 1000
# The real handler caps hold_ms at WARMSTART_MAX_HOLD_MS (10 s by default); holding longer buys nothing.
MAX_HOLD_MS = 10_000

ENV_TARGETS = "WARMSTART_WARM_TARGETS"
ENV_CONCURRENCY = "WARMSTART_WARM_CONCURRENCY"
ENV_QUALIFIER = "WARMSTART_WARM_QUALIFIER"
ENV_HOLD_MS = "WARMSTART_WARM_HOLD_MS"
ENV_PAYLOAD_STYLE = "WARMSTART_WARM_PAYLOAD_STYLE"
ENV_ENDPOINT = "WARMSTART_WARM_ENDPOINT_URL"
ENV_HISTORY = "WARMSTART_WARM_HISTORY"  # "cloudwatch" or a path to a JSON history file
ENV_FLOOR = "WARMSTART_WARM_FLOOR"
ENV_CEILING = "WARMSTART_WARM_CEILING"
ENV_PERCENTILE = "WARMSTART_WARM_PERCENTILE"


class ConfigError(ValueError):
    """A setting outside its set or range; the message says what is valid."""


def payload_style(value: str) -> PayloadStyle:
    if value not in PAYLOAD_STYLES:
        raise ConfigError(f"payload style must be one of {', '.join(PAYLOAD_STYLES)}; got {value!r}")
    return value


def integer(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer in [{low}, {high}]; got {value!r}")
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ConfigError(f"{name} must be an integer in [{low}, {high}]; got {value!r}") from None
    if not low <= number <= high:
        raise ConfigError(f"{name} must be an integer in [{low}, {high}]; got {number}")
    return number


@dataclass(frozen=True, slots=True)
class Target:
    """One function to keep warm: name or ARN, qualifier (version or alias) and how many instances."""

    function: str
    concurrency: int = 1
    qualifier: str | None = None
    payload_style: PayloadStyle = "warmstart"

    def __post_init__(self) -> None:
        if not self.function or not isinstance(self.function, str):
            raise ConfigError(f"a target needs a function name or ARN; got {self.function!r}")
        integer("concurrency", self.concurrency, 1, MAX_CONCURRENCY)
        payload_style(self.payload_style)
        embedded = self.embedded_qualifier
        if embedded and self.qualifier and embedded != self.qualifier:
            # Lambda rejects the pair; say so before a whole fan-out of failures.
            raise ConfigError(
                f"{self.function!r} names qualifier {embedded!r} but qualifier {self.qualifier!r} was given"
            )

    @property
    def embedded_qualifier(self) -> str | None:
        """The qualifier inside `name:alias` or `arn:...:function:name:alias`, if any."""
        parts = self.function.split(":")
        if self.function.startswith("arn:") and len(parts) == 8:
            return parts[7]
        if len(parts) == 2:
            return parts[1]
        return None

    @property
    def label(self) -> str:
        """What the report calls it: the function with its qualifier, whichever way it was given."""
        return f"{self.function}:{self.qualifier}" if self.qualifier else self.function

    @property
    def metric_names(self) -> tuple[str, str | None]:
        """(FunctionName, Resource) as CloudWatch's ConcurrentExecutions dimensions name them."""
        name = self.function
        parts = name.split(":")
        if name.startswith("arn:") and len(parts) >= 7:
            name = parts[6]
        elif len(parts) == 2:
            name = parts[0]
        qualifier = self.qualifier or self.embedded_qualifier
        return name, (f"{name}:{qualifier}" if qualifier else None)

    @classmethod
    def parse(cls, raw: Any, *, concurrency: int = 1, qualifier: str | None = None, style: str = "warmstart") -> Target:
        """A target from a string (name or ARN) or a mapping with function/concurrency/qualifier/payload_style."""
        if isinstance(raw, str):
            return cls(raw.strip(), concurrency, qualifier, payload_style(style))
        if not isinstance(raw, Mapping):
            raise ConfigError(f"a target is a function name/ARN or an object; got {raw!r}")
        known = {"function", "concurrency", "qualifier", "payload_style"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"unknown target keys {unknown}; valid keys: {', '.join(sorted(known))}")
        return cls(
            function=str(raw.get("function", "")),
            concurrency=integer("concurrency", raw.get("concurrency", concurrency), 1, MAX_CONCURRENCY),
            qualifier=raw.get("qualifier", qualifier),
            payload_style=payload_style(str(raw.get("payload_style", style))),
        )


def parse_targets(
    raw: Any, *, concurrency: int = 1, qualifier: str | None = None, style: str = "warmstart"
) -> tuple[Target, ...]:
    """Targets from a JSON list/object, a comma-separated list of names/ARNs (what template.yaml sets), or a list."""
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith(("[", "{")):
            try:
                raw = json.loads(text)
            except ValueError as exc:
                raise ConfigError(f"targets are not valid JSON: {exc}") from None
        else:
            raw = [part for part in (p.strip() for p in text.split(",")) if part]
    if isinstance(raw, Mapping):
        raw = [raw]
    if not isinstance(raw, list | tuple) or not raw:
        raise ConfigError("no targets: give at least one function name or ARN")
    return tuple(Target.parse(item, concurrency=concurrency, qualifier=qualifier, style=style) for item in raw)


@dataclass(frozen=True, slots=True)
class WarmerConfig:
    targets: tuple[Target, ...] = ()
    hold_ms: int = 250  # long enough for N parallel pings to overlap, short enough to bill little
    endpoint_url: str | None = None
    region: str | None = None
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 30.0  # covers a cold init (the model's init report says ~0.3 s; VPC or large models more)
    max_attempts: int = 4  # per ping, throttles included; 1 means no retry
    backoff_base_s: float = 0.1
    backoff_cap_s: float = 2.0
    deadline_s: float = 50.0  # no retry starts past this (the scheduled warmer's timeout is 60 s)
    max_pool_connections: int = 64  # at least the largest fan-out, or pings queue for a connection
    history: str | None = None  # adaptive N: "cloudwatch" or a JSON history file; None = fixed N
    floor: int = 1
    ceiling: int | None = None  # None: the target's own concurrency
    percentile: float = 95.0

    def __post_init__(self) -> None:
        integer("hold_ms", self.hold_ms, 0, MAX_HOLD_MS)
        integer("max_attempts", self.max_attempts, 1, 10)
        integer("floor", self.floor, 0, MAX_CONCURRENCY)
        if self.ceiling is not None:
            integer("ceiling", self.ceiling, max(1, self.floor), MAX_CONCURRENCY)
        if not 0 < self.percentile <= 100:
            raise ConfigError(f"percentile must be in (0, 100]; got {self.percentile}")
        for name in ("connect_timeout_s", "read_timeout_s", "deadline_s"):
            if not 0 < getattr(self, name) <= 900:  # Lambda's own 15-minute bound
                raise ConfigError(f"{name} must be in (0, 900] seconds; got {getattr(self, name)}")

    def with_targets(self, targets: tuple[Target, ...]) -> WarmerConfig:
        return replace(self, targets=targets)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> WarmerConfig:
        """Settings from WARMSTART_WARM_* variables; keyword arguments win."""
        env = os.environ if environ is None else environ
        settings: dict[str, Any] = {}
        concurrency = integer(ENV_CONCURRENCY, env.get(ENV_CONCURRENCY, "1"), 1, MAX_CONCURRENCY)
        style = payload_style(env.get(ENV_PAYLOAD_STYLE, "warmstart"))
        if env.get(ENV_TARGETS, "").strip():
            qualifier = env.get(ENV_QUALIFIER) or None
            settings["targets"] = parse_targets(
                env[ENV_TARGETS], concurrency=concurrency, qualifier=qualifier, style=style
            )
        if ENV_HOLD_MS in env:
            settings["hold_ms"] = integer(ENV_HOLD_MS, env[ENV_HOLD_MS], 0, MAX_HOLD_MS)
        if env.get(ENV_ENDPOINT):
            settings["endpoint_url"] = env[ENV_ENDPOINT]
        if env.get("AWS_REGION"):
            settings["region"] = env["AWS_REGION"]
        if env.get(ENV_HISTORY):
            settings["history"] = env[ENV_HISTORY]
        if ENV_FLOOR in env:
            settings["floor"] = integer(ENV_FLOOR, env[ENV_FLOOR], 0, MAX_CONCURRENCY)
        if ENV_CEILING in env:
            settings["ceiling"] = integer(ENV_CEILING, env[ENV_CEILING], 1, MAX_CONCURRENCY)
        if ENV_PERCENTILE in env:
            try:
                settings["percentile"] = float(env[ENV_PERCENTILE])
            except ValueError:
                raise ConfigError(f"{ENV_PERCENTILE} must be a number in (0, 100]") from None
        settings.update(overrides)
        return cls(**settings)
