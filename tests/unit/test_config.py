"""Config.from_environ: defaults, closed sets and ranges, with errors that say what is valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from handler.core.config import DEFAULT_MODEL_DIRS, Config
from handler.core.errors import ConfigError


def test_defaults_from_an_empty_environment() -> None:
    config = Config.from_environ({})
    assert config.backend is None  # the manifest decides
    assert config.model_dir in DEFAULT_MODEL_DIRS
    assert (config.max_inputs, config.max_chars, config.max_hold_ms) == (256, 20_000, 10_000)
    assert (config.verify_sha256, config.warmup, config.threads, config.device) == (False, True, None, "auto")


def test_every_setting_is_read() -> None:
    config = Config.from_environ(
        {
            "WARMSTART_MODEL": "/opt/models/mine",
            "WARMSTART_BACKEND": "torch",
            "WARMSTART_MAX_INPUTS": "8",
            "WARMSTART_MAX_CHARS": "100",
            "WARMSTART_MAX_HOLD_MS": "0",
            "WARMSTART_VERIFY_SHA256": "TRUE",
            "WARMSTART_THREADS": "3",
            "WARMSTART_WARMUP": "off",
            "WARMSTART_DEVICE": "cpu",
        }
    )
    assert config == Config(
        model_dir=Path("/opt/models/mine"),
        backend="torch",
        max_inputs=8,
        max_chars=100,
        max_hold_ms=0,
        verify_sha256=True,
        threads=3,
        warmup=False,
        device="cpu",
    )


def test_empty_values_mean_default() -> None:
    config = Config.from_environ({"WARMSTART_MAX_INPUTS": "", "WARMSTART_WARMUP": " ", "WARMSTART_BACKEND": ""})
    assert (config.max_inputs, config.warmup, config.backend) == (256, True, None)


def test_the_backend_name_is_kept_for_the_registry_to_check() -> None:
    # Names are checked where backends are known (a plugin's too): tests/unit/test_backends.py.
    assert Config.from_environ({"WARMSTART_BACKEND": "tensorrt"}).backend == "tensorrt"


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("WARMSTART_MAX_INPUTS", "ten", "is not an integer"),
        ("WARMSTART_MAX_INPUTS", "1.5", "is not an integer"),
        ("WARMSTART_MAX_INPUTS", "0", "outside [1, 100000]"),
        ("WARMSTART_MAX_CHARS", "-5", "outside"),
        ("WARMSTART_MAX_HOLD_MS", "900001", "outside [0, 900000]"),
        ("WARMSTART_THREADS", "many", "is not an integer"),
    ],
)
def test_bad_integers_name_the_variable(key: str, value: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=key) as info:
        Config.from_environ({key: value})
    assert fragment in str(info.value)


@pytest.mark.parametrize("value", ["maybe", "2", "enabled"])
def test_bad_booleans_list_valid_values(value: str) -> None:
    with pytest.raises(ConfigError, match="valid values: 1, 0, true, false"):
        Config.from_environ({"WARMSTART_VERIFY_SHA256": value})


@pytest.mark.parametrize(("raw", "expected"), [("1", True), ("Yes", True), ("on", True), ("0", False), ("NO", False)])
def test_boolean_spellings(raw: str, expected: bool) -> None:
    assert Config.from_environ({"WARMSTART_WARMUP": raw}).warmup is expected


def test_invalid_device_lists_valid_ones() -> None:
    with pytest.raises(ConfigError, match="auto, cpu, cuda"):
        Config.from_environ({"WARMSTART_DEVICE": "gpu"})


@pytest.mark.parametrize(
    ("init_type", "expected"),
    [("on-demand", False), ("provisioned-concurrency", True), ("snap-start", True), (None, True)],
)
def test_warmup_by_default_only_where_init_is_off_the_request_path(init_type: str | None, expected: bool) -> None:
    env = {"AWS_LAMBDA_INITIALIZATION_TYPE": init_type} if init_type else {}
    assert Config.from_environ(env).warmup is expected
    assert Config.from_environ({**env, "WARMSTART_WARMUP": "1"}).warmup is True


def test_otel_switch_parses_like_every_setting() -> None:
    import opentelemetry.trace  # noqa: F401  (in use: spans unless switched off)

    from handler.observability.trace import otel_tracer

    assert otel_tracer({}) is not None
    assert otel_tracer({"WARMSTART_OTEL": "false"}) is None and otel_tracer({"WARMSTART_OTEL": "no"}) is None
    assert otel_tracer({"WARMSTART_OTEL": "yes"}) is not None
    with pytest.raises(ConfigError, match="WARMSTART_OTEL"):
        otel_tracer({"WARMSTART_OTEL": "sometimes"})
