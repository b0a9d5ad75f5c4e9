"""Adaptive N: the hour-of-week percentile with floor and ceiling, from a history file or CloudWatch (moto)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
from moto import mock_aws

from warmers.adaptive import CloudWatchHistory, FileHistory, Policy, chooser, percentile, slot_of
from warmers.config import Target, WarmerConfig
from warmers.fanout import Warmer

NOW = datetime(2025, 3, 10, 9, 20, tzinfo=UTC)  # a Monday, 09:20 UTC


def weekly(peaks: list[float], hour: datetime = NOW) -> list[tuple[datetime, float]]:
    """One sample per past week at the same hour-of-week, newest first."""
    return [(hour - timedelta(weeks=i + 1), v) for i, v in enumerate(peaks)]


def test_slot_and_percentile() -> None:
    assert slot_of(NOW) == 9
    assert slot_of(datetime(2025, 3, 16, 23, 59, tzinfo=UTC)) == 167
    assert percentile([1, 2, 3, 4, 20], 95) == 20
    assert percentile([1, 2, 3, 4, 20], 50) == 3


def test_hour_of_week_percentile_within_floor_and_ceiling() -> None:
    target = Target("embed", concurrency=10, qualifier="live")
    night = [(NOW - timedelta(hours=6) - timedelta(weeks=w), 40.0) for w in range(3)]  # another slot: ignored
    choice = Policy(percentile=95).choose(target, weekly([3, 4, 6, 5]) + night, NOW)
    assert choice.n == 6
    assert "p95" in choice.reason and "Mon 09:00 UTC" in choice.reason and "4 samples" in choice.reason
    capped = Policy(percentile=95).choose(target, weekly([30, 40, 50]), NOW)
    assert capped.n == 10 and "capped at ceiling 10" in capped.reason
    floored = Policy(percentile=95, floor=2).choose(target, weekly([0, 0, 1]), NOW)
    assert floored.n == 2 and "raised to floor 2" in floored.reason


def test_sparse_history_pools_neighbours_then_falls_back_to_fixed() -> None:
    target = Target("embed", concurrency=4)
    near = [(NOW - timedelta(weeks=1, hours=1), 2.0), (NOW - timedelta(weeks=2, hours=-1), 3.0), *weekly([1])]
    choice = Policy().choose(target, near, NOW)
    assert choice.n == 3 and "+-1 h" in choice.reason
    fallback = Policy().choose(target, [], NOW)
    assert fallback.n == 4 and "too little history" in fallback.reason


def test_history_file_drives_the_chosen_n(tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    stamps = [(NOW - timedelta(weeks=w + 1)).timestamp() for w in range(4)]
    iso = [(NOW - timedelta(weeks=w + 5)).isoformat() for w in range(2)]
    data = {"embed:live": [[stamps[0], 2], [stamps[1], 3], [stamps[2], 3], [stamps[3], 2], *[[s, 9] for s in iso]]}
    path.write_text(json.dumps(data))
    pick = chooser(FileHistory(path), Policy(percentile=90), NOW)
    n, why = pick(Target("embed", concurrency=12, qualifier="live"))
    assert n == 9 and "6 samples" in why
    n, why = pick(Target("unknown", concurrency=8))
    assert n == 8 and "too little history" in why


@mock_aws
def test_cloudwatch_concurrent_executions_per_alias_resource() -> None:
    cw = boto3.client("cloudwatch", region_name="us-east-1")
    now = datetime.now(UTC).replace(minute=30, second=0, microsecond=0)
    dims = [{"Name": "FunctionName", "Value": "embed"}, {"Name": "Resource", "Value": "embed:live"}]
    for week, peak in enumerate([4, 7, 5], start=1):
        for value in (1.0, float(peak)):  # Maximum per hour is what counts
            cw.put_metric_data(
                Namespace="AWS/Lambda",
                MetricData=[
                    {
                        "MetricName": "ConcurrentExecutions",
                        "Dimensions": dims,
                        "Timestamp": now - timedelta(weeks=week) if week < 2 else now - timedelta(days=7 * week),
                        "Value": value,
                    }
                ],
            )
    # The unqualified function's metric ($LATEST traffic) must not leak into the alias's history.
    cw.put_metric_data(
        Namespace="AWS/Lambda",
        MetricData=[
            {
                "MetricName": "ConcurrentExecutions",
                "Dimensions": dims[:1],
                "Timestamp": now - timedelta(weeks=1),
                "Value": 99.0,
            }
        ],
    )
    history = CloudWatchHistory(boto3_client=cw, days=28)
    target = Target("arn:aws:lambda:us-east-1:123456789012:function:embed:live", concurrency=20)
    samples = history.samples(target, now)
    assert sorted(v for _, v in samples) == [4.0, 5.0, 7.0]
    n, why = chooser(history, Policy(percentile=95), now)(target)
    assert n == 7 and "adaptive" in why


def test_history_failure_falls_back_to_fixed_n() -> None:
    class Broken:
        def samples(self, target: Target, now: datetime) -> list[tuple[datetime, float]]:
            raise OSError("history file unreadable")

    warmer = Warmer(WarmerConfig(), boto3_client=object())
    n, why = warmer._plan(Target("embed", 3), chooser(Broken(), Policy(), NOW), prewarm=False)
    assert n == 3 and "history unavailable (OSError" in why
    n, why = warmer._plan(Target("embed", 3), chooser(Broken(), Policy(), NOW), prewarm=True)
    assert n == 3 and "prewarm" in why
