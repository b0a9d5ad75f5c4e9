"""Adaptive N: how many instances to keep warm in this time slot, from how many ran at once in the past.

In the spirit of Serverless in the Wild (ATC '20): a per-function histogram, read at a high percentile, instead
of one fixed N for every hour. Here the histogram is of peak concurrency per hour-of-week (168 slots, UTC), so
Monday 09:00 learns from past Mondays 09:00 and not from Sunday night. N = ceil(percentile x headroom), clamped to
[floor, ceiling]; with too few samples in the slot its neighbours (+-1 h, then the same hour on any day) are
pooled, and with none at all the target's fixed N is used. Every choice comes with the sentence saying why.

History comes from CloudWatch `ConcurrentExecutions` (Maximum per hour; dimensions FunctionName, or Resource
`name:alias` for a qualified target) or from a local JSON file `{"<function[:qualifier]>": [[epoch_s, n], ...]}`
(ISO-8601 timestamps also accepted).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from warmers.config import Target, WarmerConfig

Sample = tuple[datetime, float]  # (UTC time, concurrent executions)
SLOTS = 7 * 24
DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


class History(Protocol):
    def samples(self, target: Target, now: datetime) -> list[Sample]: ...


def slot_of(moment: datetime) -> int:
    """Hour of the week, Monday 00:00 UTC = 0."""
    moment = moment.astimezone(UTC)
    return moment.weekday() * 24 + moment.hour


def slot_name(slot: int) -> str:
    return f"{DAY_NAMES[slot // 24]} {slot % 24:02d}:00 UTC"


def percentile(values: Iterable[float], pct: float) -> float:
    """Nearest-rank percentile: always a value that was observed, so N never exceeds the history's peak."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class Choice:
    n: int
    reason: str


@dataclass(frozen=True, slots=True)
class Policy:
    percentile: float = 95.0
    floor: int = 1
    ceiling: int | None = None  # None: the target's configured concurrency
    headroom: float = 1.0  # multiply before rounding up (e.g. 1.2 for 20% spare instances)
    min_samples: int = 3

    @classmethod
    def from_config(cls, config: WarmerConfig) -> Policy:
        return cls(percentile=config.percentile, floor=config.floor, ceiling=config.ceiling)

    def choose(self, target: Target, samples: list[Sample], now: datetime) -> Choice:
        ceiling = self.ceiling if self.ceiling is not None else target.concurrency
        floor = min(self.floor, ceiling)
        slot = slot_of(now)
        pools: list[tuple[str, Callable[[int], bool]]] = [
            ("this hour-of-week", lambda s: s == slot),
            ("this hour-of-week +-1 h", lambda s: min((s - slot) % SLOTS, (slot - s) % SLOTS) <= 1),
            ("this hour on any day", lambda s: s % 24 == slot % 24),
        ]
        scope, values = "", []
        for name, matches in pools:
            values = [v for moment, v in samples if matches(slot_of(moment))]
            if len(values) >= self.min_samples:
                scope = name
                break
        if not scope:
            why = f"{len(samples)} samples, fewer than {self.min_samples} near {slot_name(slot)}"
            n = max(floor, min(ceiling, target.concurrency))
            return Choice(n, f"fixed concurrency {n}: too little history ({why})")
        observed = percentile(values, self.percentile)
        wanted = math.ceil(observed * self.headroom - 1e-9)
        n = max(floor, min(ceiling, wanted))
        clamp = ""
        if n != wanted:
            clamp = f", raised to floor {floor}" if n > wanted else f", capped at ceiling {ceiling}"
        spare = f" x headroom {self.headroom:g}" if self.headroom != 1.0 else ""
        return Choice(
            n,
            f"adaptive: p{self.percentile:g} of peak concurrency over {len(values)} samples ({scope}, "
            f"{slot_name(slot)}) = {observed:g}{spare} -> {wanted}{clamp}",
        )


class FileHistory:
    """Samples from a local JSON file, keyed by the target's label (`name` or `name:qualifier`) or name."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def samples(self, target: Target, now: datetime) -> list[Sample]:
        data = json.loads(self.path.read_text())
        if not isinstance(data, Mapping):
            raise ValueError(f"{self.path}: expected an object of target -> [[time, concurrency], ...]")
        name, resource = target.metric_names
        for key in (target.label, target.function, resource, name):
            if key and key in data:
                return [parse_sample(item) for item in data[key]]
        return []


def parse_sample(item: Any) -> Sample:
    when, value = (item["timestamp"], item["value"]) if isinstance(item, Mapping) else item
    if isinstance(when, int | float):
        moment = datetime.fromtimestamp(when, UTC)
    else:
        moment = datetime.fromisoformat(str(when).replace("Z", "+00:00"))
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
    return moment, float(value)


class CloudWatchHistory:
    """Hourly Maximum of AWS/Lambda ConcurrentExecutions over the last `days` (one call: 14 d x 24 h < 1,440)."""

    def __init__(self, config: WarmerConfig | None = None, *, boto3_client: Any = None, days: int = 14) -> None:
        if boto3_client is None:
            from warmers.fanout import build_client

            boto3_client = build_client(config or WarmerConfig(), "cloudwatch")
        self.client = boto3_client
        self.days = days

    def samples(self, target: Target, now: datetime) -> list[Sample]:
        name, resource = target.metric_names
        # A qualified target's metric is per Resource (`name:alias`); the function-wide one would count $LATEST.
        dimensions = [{"Name": "FunctionName", "Value": name}]
        if resource:
            dimensions.append({"Name": "Resource", "Value": resource})
        response = self.client.get_metric_statistics(
            Namespace="AWS/Lambda",
            MetricName="ConcurrentExecutions",
            Dimensions=dimensions,
            StartTime=now - timedelta(days=self.days),
            EndTime=now,
            Period=3600,
            Statistics=["Maximum"],
        )
        points = response.get("Datapoints", [])
        return [(p["Timestamp"].astimezone(UTC), float(p["Maximum"])) for p in points]


def history_from(config: WarmerConfig, *, cloudwatch_client: Any = None) -> History | None:
    """The history source the config names: None (fixed N), "cloudwatch", or a JSON file path."""
    if not config.history:
        return None
    if config.history == "cloudwatch":
        return CloudWatchHistory(config, boto3_client=cloudwatch_client)
    return FileHistory(config.history)


def chooser(history: History, policy: Policy, now: datetime | None = None) -> Callable[[Target], tuple[int, str]]:
    """A Warmer chooser: target -> (N, why), reading the history at `now` (default: the moment it is asked)."""

    def choose(target: Target) -> tuple[int, str]:
        moment = now or datetime.now(UTC)
        picked = policy.choose(target, history.samples(target, moment), moment)
        return picked.n, picked.reason

    return choose
