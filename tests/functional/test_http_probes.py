"""What clients probe on an instance serving several models (issue 37 items 4 and 13), through the HTTP
host's app: `GET /v1/models` lists each with its task; `POST /` answers by the body's shape and the model it
reaches, and a body the default model's task cannot answer is a typed 400 naming the served models that can;
a compatible route reaching a model of the wrong task names the served ones of the right task."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from handler.core.config import Config
from handler.runtime.invocation import Runtime
from tests.conftest import MODEL_KEY
from tests.functional.test_http_compat import client_for

LABELS = ["negative", "neutral", "positive"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """A tiny cross-encoder and classifier, packed: kind → (directory, key)."""
    from infra.pack.hf_pack import pack_from  # deferred: packing imports torch
    from tests.tiny_models import make_model_dir

    out: dict[str, tuple[Path, str]] = {}
    for kind, options in {
        "cross-encoder": {"activation": "torch.nn.Sigmoid"},
        "classifier": {"labels": LABELS, "num_labels": 3},
    }.items():
        root = tmp_path_factory.mktemp(kind)
        pack_from(make_model_dir(root, "bert", kind, max_seq_length=32, **options), root / "packed")
        manifest = json.loads((root / "packed" / "manifest.json").read_text())
        out[kind] = (root / "packed", f"{manifest['id']}@{manifest['version']}")
    return out


@pytest.fixture(scope="module")
def client(model_dir: Path, tiny: dict[str, tuple[Path, str]]) -> Iterator[TestClient]:
    extra = ",".join(str(tiny[k][0]) for k in ("cross-encoder", "classifier"))
    env = {"WARMSTART_MODEL": str(model_dir), "WARMSTART_MODELS": extra, "WARMSTART_WARMUP": "0"}
    runtime = Runtime.start(Config.from_environ(env), environ=env, emit=None)
    with client_for(runtime) as c:
        yield c


def test_models_lists_every_served_model_with_its_task(client: TestClient, tiny: dict[str, tuple[Path, str]]) -> None:
    data = client.get("/v1/models").json()["data"]
    assert [(m["key"], m["task"]) for m in data] == [
        (MODEL_KEY, "embedding"),  # the default first
        *sorted([(tiny["classifier"][1], "classify"), (tiny["cross-encoder"][1], "rerank")]),
    ]
    assert all(m["object"] == "model" and m["id"] == m["key"].split("@")[0] for m in data)


def test_post_root_with_classification_parameters_never_answers_vectors(
    client: TestClient, tiny: dict[str, tuple[Path, str]]
) -> None:
    """InferenceClient.text_classification sends `{"inputs", "parameters": {}}`: vectors would crash it."""
    classifier = tiny["classifier"][1]
    for parameters in ({}, {"top_k": 1}):
        r = client.post("/", json={"inputs": "great", "parameters": parameters})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "UnsupportedRequestError"
        first = error["message"].splitlines()[0]
        assert f"{MODEL_KEY} is embedding" in first and classifier in first
        assert f'"model": "{classifier.split("@")[0]}"' in first  # how to reach it
        assert tiny["cross-encoder"][1] not in first  # a reranker cannot answer it
    # Naming the classifier routes there: the Inference API's shape, a list per text.
    r = client.post("/", json={"inputs": "great", "parameters": {}, "model": classifier.split("@")[0]})
    assert r.status_code == 200, r.text
    assert {p["label"] for p in r.json()[0]} == set(LABELS)
    # Without "parameters", TEI's `POST /` on an embedding model is still /embed.
    assert client.post("/", json={"inputs": "great"}).json() == client.post("/embed", json={"inputs": "great"}).json()


def test_post_root_rerank_body_names_the_reranker(client: TestClient, tiny: dict[str, tuple[Path, str]]) -> None:
    reranker = tiny["cross-encoder"][1]
    r = client.post("/", json={"query": "q", "texts": ["a", "b"]})
    assert r.status_code == 400 and reranker in r.json()["error"]["message"]
    r = client.post("/", json={"query": "q", "texts": ["a", "b"], "model": reranker})
    assert r.status_code == 200 and {x["index"] for x in r.json()} == {0, 1}


@pytest.mark.parametrize("path", ["/v2/rerank", "/v1/rerank"])
def test_cohere_rerank_at_an_embedding_default_names_the_served_reranker(
    client: TestClient, tiny: dict[str, tuple[Path, str]], path: str
) -> None:
    reranker = tiny["cross-encoder"][1]
    r = client.post(path, json={"model": "rerank-v3.5", "query": "q", "documents": ["a"]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "UnsupportedRequestError"
    message = r.json()["error"]["message"]
    assert message.startswith(f"POST {path} needs a rerank, multivector or hybrid model; {MODEL_KEY} is embedding")
    assert f"served here that can: {reranker}" in message and tiny["classifier"][1] not in message
    r = client.post("/predict", json={"inputs": "a"})  # the same for every route: the classifier is named
    assert r.status_code == 400 and tiny["classifier"][1] in r.json()["error"]["message"]
