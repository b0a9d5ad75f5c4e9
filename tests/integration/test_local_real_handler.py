"""The real function (handler.app.lambda_handler) through the local Lambda: needs the packed default model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # the fixtures live under tests/, which is not an installed package
    sys.path.insert(0, ROOT)

from infra.cli.demo import init_report  # noqa: E402
from tests.fixtures.local_support import invoke, report, running  # noqa: E402

pytestmark = pytest.mark.integration
REAL = "handler.app.lambda_handler"


@pytest.mark.skipif(
    not Path(ROOT, "models", "default", "manifest.json").exists(),
    reason="models/default is not packed (warmstart pack --default)",
)
def test_real_handler_cold_warm_bad_input_and_bad_model() -> None:
    with running(handler=REAL) as (local, client):
        result, body, log = invoke(client, {"inputs": ["a local Lambda that behaves like the real one"]})
        assert "FunctionError" not in result, body
        assert len(body["embeddings"]) == 1 and len(body["embeddings"][0]) == 384
        assert body["model"].startswith("all-minilm-l6-v2@")
        assert "Init Duration" in report(log)
        cold = next(i for i in local.history if i.cold)
        init = init_report(bytes(cold.log))
        assert init is not None and init["phases_ms"]
        _, ping, _ = invoke(client, {"warmer": True})
        assert ping["warm"] is True and ping["cold"] is False
        result, body, _ = invoke(client, {"inputs": 42})  # bad input: a typed error, the instance lives on
        assert result["FunctionError"] == "Unhandled"
        assert body["errorType"] == "InvalidInputError"
        _, again, _ = invoke(client, {"inputs": ["still serving"]})
        assert len(again["embeddings"][0]) == 384
        assert local.pool.spawned == 1
    with running(handler=REAL, environment={"WARMSTART_MODEL": "/nonexistent/model"}) as (_local, client):
        result, body, log = invoke(client, {"inputs": ["x"]})
        assert result["FunctionError"] == "Unhandled"
        assert body["errorType"] == "ModelLoadError", body
