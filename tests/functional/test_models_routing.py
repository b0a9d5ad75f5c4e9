"""Several models in one instance, through `Runtime.handle` with JSON events: routing by `"model"`, the
`models` admin event, refusal of admin events over HTTP, and status."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.core.config import Config
from handler.models.admin import AdminNotAllowedError
from handler.models.registry import UnknownModelError
from handler.runtime.invocation import Runtime
from tests.conftest import MODEL_KEY
from tests.model_versions import write_version

NEG_KEY = "all-minilm-l6-v2@0.2.0-neg"


@pytest.fixture(scope="module")
def negated(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_version(model_dir, tmp_path_factory.mktemp("versions") / "neg", "0.2.0-neg", negate=True)


@pytest.fixture(scope="module")
def runtime(model_dir: Path, negated: Path) -> Iterator[Runtime]:
    env = {"WARMSTART_MODEL": str(model_dir), "WARMSTART_MODELS": str(negated), "WARMSTART_WARMUP": "0"}
    rt = Runtime.start(Config.from_environ(env), environ=env, emit=None)
    yield rt


def test_both_versions_are_loaded_at_init(runtime: Runtime) -> None:
    assert runtime.init_report["models"] == [NEG_KEY]
    reply = runtime.handle({"warmstart": "models"})
    assert reply["default"] == MODEL_KEY
    loaded = {m["key"]: m for m in reply["loaded"]}
    assert set(loaded) == {MODEL_KEY, NEG_KEY}
    assert loaded[MODEL_KEY]["default"] and not loaded[NEG_KEY]["default"]
    assert all(m["refs"] == 0 and m["weights_mb"] > 80 for m in loaded.values())


def test_requests_are_routed_by_their_model_field(runtime: Runtime) -> None:
    texts = ["routing by key", "a second sentence"]
    default = runtime.handle({"inputs": texts})
    named_default = runtime.handle({"inputs": texts, "model": MODEL_KEY})
    negated = runtime.handle({"inputs": texts, "model": NEG_KEY})
    assert (default["model"], named_default["model"], negated["model"]) == (MODEL_KEY, MODEL_KEY, NEG_KEY)
    with pytest.raises(UnknownModelError, match="ambiguous"):  # two versions of this id: name one
        runtime.handle({"inputs": texts, "model": "all-minilm-l6-v2"})
    np.testing.assert_allclose(default["embeddings"], named_default["embeddings"], atol=1e-6)
    np.testing.assert_allclose(np.negative(default["embeddings"]), negated["embeddings"], atol=1e-5)


def test_an_unknown_model_is_a_typed_error_and_a_404_over_http(
    runtime: Runtime, load_event: Callable[[str], Any]
) -> None:
    with pytest.raises(UnknownModelError, match=f"loaded: {MODEL_KEY}, {NEG_KEY}"):
        runtime.handle({"inputs": ["x"], "model": "other@1"})
    event = load_event("http_api_v2.json")
    event["body"] = json.dumps({"inputs": ["x"], "model": "other@1"})
    response = runtime.handle(event)
    assert response["statusCode"] == 404
    assert json.loads(response["body"])["error"]["type"] == "UnknownModelError"
    assert runtime.handle({"inputs": ["still serving"]})["model"] == MODEL_KEY


@pytest.mark.parametrize("action", ["reload", "models"])
def test_admin_events_are_refused_through_http_sources(
    runtime: Runtime, load_event: Callable[[str], Any], action: str
) -> None:
    body = json.dumps({"warmstart": action, "model": "/tmp/anything"})
    for name in ("http_api_v2.json", "apigw_v1.json", "alb.json", "function_url.json"):
        event = load_event(name)
        event["body"] = body
        event.pop("isBase64Encoded", None)
        response = runtime.handle(event)
        assert response["statusCode"] == 403, name
        assert json.loads(response["body"])["error"]["type"] == "AdminNotAllowedError"
    status, raw = runtime.handle_body(body.encode())
    assert status == 403 and json.loads(raw)["error"]["type"] == AdminNotAllowedError.__name__
    assert runtime.registry.default_key == MODEL_KEY


def test_status_lists_models_and_the_last_reload(runtime: Runtime) -> None:
    status = runtime.handle({"warmstart": "status"})
    assert status["model"] == MODEL_KEY
    assert {m["key"] for m in status["models"]["loaded"]} == {MODEL_KEY, NEG_KEY}
    assert status["reload"] == {"running": None, "last": None, "pointer": None}


def test_the_http_body_path_routes_too(runtime: Runtime) -> None:
    status, raw = runtime.handle_body(json.dumps({"inputs": ["x"], "model": NEG_KEY}).encode())
    assert status == 200 and json.loads(raw)["model"] == NEG_KEY


def test_a_reload_to_a_version_loaded_side_by_side_promotes_it(runtime: Runtime, negated: Path) -> None:
    # Last in this module: it changes the shared runtime's default.
    reply = runtime.handle({"warmstart": "reload", "model": str(negated)})
    assert (reply["old"], reply["new"], reply["default"], reply["verified_files"]) == (MODEL_KEY, NEG_KEY, NEG_KEY, 3)
    assert "session" not in reply["phases_ms"]  # nothing loaded: the resident version was re-checked, then swapped
    assert runtime.handle({"inputs": ["x"]})["model"] == NEG_KEY
    models = runtime.handle({"warmstart": "models"})
    assert [m["key"] for m in models["loaded"]] == [NEG_KEY] and models["available"] == []
    with pytest.raises(UnknownModelError):
        runtime.handle({"inputs": ["x"], "model": MODEL_KEY})
