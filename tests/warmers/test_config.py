"""Targets and settings: parsing from CLI/env/event shapes, closed sets validated with the valid choices listed."""

from __future__ import annotations

import json

import pytest

from warmers.app import config_for
from warmers.config import ConfigError, Target, WarmerConfig, parse_targets

ALIAS_ARN = "arn:aws:lambda:us-east-1:123456789012:function:embed:live"


def test_comma_separated_arns_as_template_sets_them() -> None:
    env = {"WARMSTART_WARM_TARGETS": f"{ALIAS_ARN}, other:prod", "WARMSTART_WARM_CONCURRENCY": "3"}
    config = WarmerConfig.from_environ(env)
    assert [(t.function, t.concurrency, t.label) for t in config.targets] == [
        (ALIAS_ARN, 3, ALIAS_ARN),
        ("other:prod", 3, "other:prod"),
    ]
    assert config.targets[0].metric_names == ("embed", "embed:live")
    assert config.targets[1].embedded_qualifier == "prod"


def test_json_targets_with_their_own_concurrency_and_style() -> None:
    raw = json.dumps(
        [{"function": "a", "concurrency": 5, "qualifier": "live"}, {"function": "b", "payload_style": "lambda-warmer"}]
    )
    a, b = parse_targets(raw, concurrency=2)
    assert (a.function, a.qualifier, a.concurrency, a.label) == ("a", "live", 5, "a:live")
    assert (b.concurrency, b.payload_style) == (2, "lambda-warmer")


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"payload_style": "warmup-plugin"}, "warmstart, lambda-warmer, serverless-plugin-warmup"),
        ({"concurrency": 0}, "[1, 1000]"),
        ({"concurrency": 1001}, "[1, 1000]"),
        ({"function": "fn:live", "qualifier": "prod"}, "names qualifier 'live'"),
    ],
)
def test_invalid_targets_say_what_is_valid(kwargs: dict[str, object], needle: str) -> None:
    settings: dict[str, object] = {"function": "fn", **kwargs}
    with pytest.raises(ConfigError) as caught:
        Target(**settings)  # type: ignore[arg-type]
    assert needle in str(caught.value)


def test_unknown_target_keys_and_empty_targets_are_refused() -> None:
    with pytest.raises(ConfigError, match="valid keys: concurrency, function, payload_style, qualifier"):
        parse_targets([{"function": "a", "n": 3}])
    with pytest.raises(ConfigError, match="no targets"):
        parse_targets(" , ")
    with pytest.raises(ConfigError, match=r"WARMSTART_WARM_HOLD_MS must be an integer in \[0, 10000\]"):
        WarmerConfig.from_environ({"WARMSTART_WARM_HOLD_MS": "lots"})


def test_event_overrides_environment() -> None:
    env = {"WARMSTART_WARM_TARGETS": "a,b", "WARMSTART_WARM_CONCURRENCY": "2", "WARMSTART_WARM_HOLD_MS": "100"}
    config, prewarm = config_for({"source": "aws.events", "detail-type": "Scheduled Event"}, env)
    assert ([t.function for t in config.targets], config.hold_ms, prewarm) == (["a", "b"], 100, False)
    config, prewarm = config_for({"concurrency": 7, "hold_ms": 400, "prewarm": True}, env)
    assert [t.concurrency for t in config.targets] == [7, 7]
    assert (config.hold_ms, prewarm) == (400, True)
    config, _ = config_for({"targets": [{"function": "c", "concurrency": 4}]}, env)
    assert [(t.function, t.concurrency) for t in config.targets] == [("c", 4)]
