"""Host detection and what follows from it: payload limit, drain time, port; SageMaker's model directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from handler.core import config as config_module
from handler.core.config import Config
from handler.core.errors import ConfigError
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
