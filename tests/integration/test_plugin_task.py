"""The toy plugin's task: `toy-scores`, a `warmstart.tasks` entry point of tests/fixtures/toy_plugin (its spec a
handler.tasks.spec.TaskSpec), served on the same plugin's `toy` backend: a pip-installed package adds a task and a
backend with nothing in handler/ edited. Through a Lambda event on the local Lambda, the HTTP host, and
`/openapi.json`, which carries the task's request schema; its manifest field is checked at init."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.core.manifest import FORMAT, FORMAT_VERSION
from tests.fixtures.local_support import invoke, running
from tests.integration.test_plugins import ROOT, X, env_for, expected, get, post, serving, site, weights

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
REAL = "handler.app.lambda_handler"
OFFSET = 10
__all__ = ["site"]  # the installed plugin: a module fixture, shared with test_plugins.py


def scores_model(root: Path, **fields: Any) -> Path:
    """A packed model for the plugin's task on the plugin's backend."""
    root.mkdir()
    w, b = weights()
    np.savez(root / "toy.npz", w=w, b=b)
    data = (root / "toy.npz").read_bytes()
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "id": "toy-scores",
        "version": "1",
        "task": "toy-scores",
        "toy_offset": OFFSET,
        "default_backend": "toy",
        "backends": {"toy": {"weights": "toy.npz", "files": ["toy.npz"]}},
        "inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 4]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": ["batch", 3]}],
        "files": {"toy.npz": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}},
    } | fields
    (root / "manifest.json").write_text(json.dumps({k: v for k, v in manifest.items() if v is not None}))
    return root


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scores_model(tmp_path_factory.mktemp("scores") / "model")


def want() -> list[float]:
    return (expected("tanh").sum(axis=1) + OFFSET).tolist()


def test_a_plugin_task_on_a_plugin_backend_serves_a_lambda_event(site: Path, model: Path) -> None:
    environment = {"WARMSTART_MODEL": str(model), "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}
    with running(handler=REAL, environment=environment) as (_, client):
        result, body, _ = invoke(client, {"rows": X})
        assert "FunctionError" not in result, body
        assert body["model"] == "toy-scores@1"
        np.testing.assert_allclose(body["scores"], want(), rtol=1e-6)
        result, error, _ = invoke(client, {"rows": [[1.0, 2.0]]})
        assert result["FunctionError"] == "Unhandled" and error["errorType"] == "InvalidInputError", error


@pytest.fixture(scope="module")
def http_host(site: Path, model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with serving(env_for(site, model), tmp_path_factory.mktemp("host") / "host.log") as port:
        yield port


def test_a_plugin_task_serves_the_http_host(http_host: int) -> None:
    status, body = post(http_host, "/invocations", {"rows": X})
    assert status == 200, body
    np.testing.assert_allclose(body["scores"], want(), rtol=1e-6)
    status, body = post(http_host, "/invocations", {"rows": "x"})
    assert status == 400 and body["error"]["type"] == "InvalidInputError"


def test_the_openapi_document_carries_the_plugin_tasks_schemas(http_host: int) -> None:
    status, document = get(http_host, "/openapi.json")
    assert status == 200
    schemas = document["components"]["schemas"]
    request = next(s for s in schemas["NativeRequest"]["anyOf"] if s.get("title") == "toy-scores")
    assert request["required"] == ["rows"]
    assert "toy-scores" in [s.get("title") for s in schemas["NativeResponse"]["anyOf"]]


def test_a_plugin_tasks_manifest_field_is_checked_at_init(site: Path, tmp_path: Path) -> None:
    bad = scores_model(tmp_path / "bad", toy_offset=None)
    env = env_for(site, bad)
    proc = subprocess.run(
        [sys.executable, "-c", "import handler.app"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert "a toy-scores model needs 'toy_offset', an integer; got None" in proc.stderr
