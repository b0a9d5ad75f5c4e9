"""The settings of several models and hot reload: WARMSTART_MODEL as s3://, WARMSTART_MODELS, the budget,
idle unload and the pointer, each validated with an error that says what is valid."""

from __future__ import annotations

import pytest

from handler.core.config import DEFAULT_MODEL_DIRS, Config
from handler.core.errors import ConfigError


def test_defaults_leave_a_single_local_model() -> None:
    config = Config.from_environ({})
    assert config.model_uri is None and config.models == () and config.model_pointer is None
    assert (config.idle_unload_s, config.model_budget_mb, config.pointer_check_s) == (0, 0, 60)


def test_every_model_setting_is_read() -> None:
    config = Config.from_environ(
        {
            "WARMSTART_MODEL": "s3://bucket/models/minilm/0.2.0/",
            "WARMSTART_MODELS": " /opt/models/a , s3://bucket/models/b/1/,",
            "WARMSTART_IDLE_UNLOAD_S": "600",
            "WARMSTART_MODEL_BUDGET_MB": "1024",
            "WARMSTART_MODEL_POINTER": "s3://bucket/models/minilm/CURRENT",
            "WARMSTART_POINTER_CHECK_S": "30",
        }
    )
    assert config.model_uri == "s3://bucket/models/minilm/0.2.0/"
    assert config.model_dir in DEFAULT_MODEL_DIRS  # not used when the model comes from S3
    assert config.models == ("/opt/models/a", "s3://bucket/models/b/1/")
    assert (config.idle_unload_s, config.model_budget_mb, config.pointer_check_s) == (600, 1024, 30)
    assert config.model_pointer == "s3://bucket/models/minilm/CURRENT"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("WARMSTART_MODEL", "gs://bucket/model", "valid: a directory path or s3://bucket/prefix"),
        ("WARMSTART_MODEL", "s3://bucket", "valid: a directory path or s3://bucket/prefix"),
        ("WARMSTART_MODELS", "/a,https://host/model", "valid: a directory path or s3://bucket/prefix"),
        ("WARMSTART_MODEL_POINTER", "/local/CURRENT", "valid: s3://bucket/key"),
        ("WARMSTART_MODEL_POINTER", "s3://bucket/", "valid: a directory path or s3://bucket/prefix"),
        ("WARMSTART_IDLE_UNLOAD_S", "-1", r"outside \[0, 604800\]"),
        ("WARMSTART_MODEL_BUDGET_MB", "lots", "is not an integer"),
        ("WARMSTART_POINTER_CHECK_S", "0", r"outside \[1, 86400\]"),
    ],
)
def test_invalid_values_say_what_is_valid(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config.from_environ({key: value})
