"""Host detection and what follows from it: payload limit, drain time, port; SageMaker's model directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from handler.core import config as config_module
from handler.core.config import Config
from handler.core.errors import ConfigError
from handler.http_host import settings as settings_module
from handler.http_host.settings import DEFAULT_DRAIN_S, MB, HostSettings, detect_host


@pytest.mark.parametrize(
    ("env", "serve", "host", "limit"),
    [
        ({}, False, "generic", 6 * MB),
        ({}, True, "sagemaker", 6 * MB),
        ({"SAGEMAKER_BIND_TO_PORT": "9000"}, False, "sagemaker", 6 * MB),
        ({"WARMSTART_HOST": "sagemaker-serverless"}, True, "sagemaker-serverless", 4 * MB),
        ({"K_SERVICE": "embed"}, False, "cloud-run", 32 * MB),
        ({"K_SERVICE": "embed", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}, False, "knative", 32 * MB),
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, False, "kubernetes", 32 * MB),
        ({"AWS_LAMBDA_RUNTIME_API": "127.0.0.1:9001"}, False, "lambda", 6 * MB),
        ({"K_SERVICE": "embed", "WARMSTART_MAX_PAYLOAD_BYTES": "1000"}, False, "cloud-run", 1000),
    ],
)
def test_host_and_payload_limit(env: dict[str, str], serve: bool, host: str, limit: int) -> None:
    settings = HostSettings.from_environ(env, serve=serve)
    assert (settings.name, settings.payload_limit) == (host, limit)


def test_drain_below_every_kill_deadline_and_configurable() -> None:
    assert HostSettings.from_environ({}).drain_s == DEFAULT_DRAIN_S < 10  # Cloud Run kills at 10 s
    assert HostSettings.from_environ({"WARMSTART_DRAIN_S": "25"}).drain_s == 25
    with pytest.raises(ConfigError, match="WARMSTART_DRAIN_S"):
        HostSettings.from_environ({"WARMSTART_DRAIN_S": "-1"})


@pytest.mark.parametrize(
    ("env", "port"),
    [({}, 8080), ({"PORT": "9000"}, 9000), ({"PORT": "9000", "SAGEMAKER_BIND_TO_PORT": "9100"}, 9100)],
)
def test_port(env: dict[str, str], port: int) -> None:
    assert HostSettings.from_environ(env).port == port


def test_unknown_host_lists_valid_ones() -> None:
    with pytest.raises(ConfigError, match="valid values: lambda, sagemaker, sagemaker-serverless"):
        detect_host({"WARMSTART_HOST": "fly"})


def test_sagemaker_model_dir_used_when_it_holds_a_packed_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ml = tmp_path / "opt-ml-model"
    ml.mkdir()
    monkeypatch.setattr(config_module, "SAGEMAKER_MODEL_DIR", ml)
    assert Config.from_environ({}).model_dir != ml  # empty: the embedded default
    (ml / "manifest.json").write_text(json.dumps({}))
    assert Config.from_environ({}).model_dir == ml
    assert Config.from_environ({"WARMSTART_MODEL": "/models/x"}).model_dir == Path("/models/x")  # a setting wins


def test_http_limits_default_and_strict() -> None:
    """Header and body times and the connection cap: defaults, overrides, and refusals of what is not one."""
    settings = HostSettings.from_environ({})
    assert (settings.header_timeout_s, settings.body_timeout_s) == (10, 60)
    assert 1 <= settings.max_connections <= settings_module.max_connections()
    env = {"WARMSTART_HTTP_HEADER_TIMEOUT_S": "2", "WARMSTART_HTTP_BODY_TIMEOUT_S": "5"}
    env["WARMSTART_HTTP_MAX_CONNECTIONS"] = "7"
    assert (HostSettings.from_environ(env).header_timeout_s, HostSettings.from_environ(env).max_connections) == (2, 7)
    for key, bad in [
        ("WARMSTART_HTTP_HEADER_TIMEOUT_S", "0"),
        ("WARMSTART_HTTP_BODY_TIMEOUT_S", "1.5"),
        ("WARMSTART_HTTP_MAX_CONNECTIONS", "ten"),
        ("WARMSTART_HTTP_MAX_CONNECTIONS", str(settings_module.max_connections() + 1)),  # past the file limit
    ]:
        with pytest.raises(ConfigError, match=key):
            HostSettings.from_environ({key: bad})


def test_connection_cap_stays_below_the_file_limit() -> None:
    assert settings_module.max_connections(512) == 224  # half of what the process does not keep
    assert settings_module.max_connections(1 << 20) == settings_module.DEFAULT_MAX_CONNECTIONS
    assert settings_module.max_connections(10) == 1
    assert settings_module.accept_backlog(224) == 56 and settings_module.accept_backlog(1000) == 250


def test_body_rate_and_health_reserve_settings() -> None:
    default = HostSettings.from_environ({})
    assert (default.body_grace_s, default.body_min_rate, default.health_reserve) == (5, 1024, 16)
    env = {
        "WARMSTART_HTTP_BODY_GRACE_S": "2",
        "WARMSTART_HTTP_BODY_MIN_RATE": "0",
        "WARMSTART_HTTP_HEALTH_RESERVE": "0",
    }
    custom = HostSettings.from_environ(env)
    assert (custom.body_grace_s, custom.body_min_rate, custom.health_reserve) == (2, 0, 0)
    for key in ("WARMSTART_HTTP_BODY_GRACE_S", "WARMSTART_HTTP_BODY_MIN_RATE", "WARMSTART_HTTP_HEALTH_RESERVE"):
        with pytest.raises(ConfigError, match=key):
            HostSettings.from_environ({key: "-1"})


def test_the_body_budget_is_four_payload_limits_unless_set() -> None:
    assert HostSettings.from_environ({"WARMSTART_HOST": "knative"}).body_budget == 4 * 32 * 1024 * 1024
    assert HostSettings.from_environ({"WARMSTART_MAX_PAYLOAD_BYTES": "1000"}).body_budget == 4000
    assert HostSettings.from_environ({"WARMSTART_HTTP_BODY_BUDGET_BYTES": "5"}).body_budget == 5
    with pytest.raises(ConfigError, match="WARMSTART_HTTP_BODY_BUDGET_BYTES"):
        HostSettings.from_environ({"WARMSTART_HTTP_BODY_BUDGET_BYTES": "0"})
