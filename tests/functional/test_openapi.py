"""`GET /openapi.json` says what every route answers: the document is valid OpenAPI 3.1, every path in it is
exercised here with a valid request (200, the answer validated against the operation's 200 schema by
`jsonschema`) and a bad one (not 2xx, validated against the Error schema), and the host's small validator
(`handler.api.schemas.check`) agrees with `jsonschema` on which requests the schemas accept.

Embedding routes run the real default model; rerank and classify routes a fake task of that kind (their
answers' shapes are the routes' mapping; the real tasks' answers are checked by tests/integration/test_clients.py);
the OpenAI completion routes the real `generate` task over the fake engine (tests/fixtures/fake_engine.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import pytest
from openapi_spec_validator import validate as validate_spec
from starlette.testclient import TestClient

from handler.api import schemas
from handler.core.errors import InvalidInputError
from handler.runtime.invocation import Runtime
from tests.fixtures.fake_engine import register
from tests.functional.test_http_compat import FakeTask, client_for, fake_runtime
from tests.functional.test_http_generate import fake_generate_runtime

TEXTS = ["the quick brown fox", "jumps over the lazy dog"]


def rerank_answer(p: dict[str, Any]) -> dict[str, Any]:
    results = [{"index": i, "relevance_score": 1 / (i + 1)} for i in range(len(p["documents"]))]
    if p.get("return_documents"):
        for r in results:
            r["document"] = {"text": "x"}
    return {"results": results[: p.get("top_n") or None], "usage": {"tokens": 3}}


def classify_answer(p: dict[str, Any]) -> dict[str, Any]:
    return {"predictions": [[{"label": "pos", "score": 0.75}, {"label": "neg", "score": 0.25}] for _ in p["inputs"]]}


def vectors_answer(p: dict[str, Any]) -> dict[str, Any]:
    return {"embeddings": [[0.6, 0.8] for _ in p["inputs"]], "usage": {"tokens": 2}}


def sparse_answer(p: dict[str, Any]) -> dict[str, Any]:
    return {"embeddings": [{"indices": [3, 7], "values": [0.5, 1.25]} for _ in p["inputs"]], "usage": {"tokens": 3}}


# path → method → (model kind, a valid request, a bad request); every path in the document must be here.
EXAMPLES: dict[str, dict[str, tuple[str, Any, Any]]] = {
    "/": {
        "get": ("embedding", None, None),
        "post": ("embedding", {"inputs": TEXTS}, {"inputs": 3}),
    },
    "/invocations": {"post": ("embedding", {"inputs": TEXTS}, {"inputs": []})},
    "/v1/embeddings": {"post": ("embedding", {"input": TEXTS, "model": "x", "dimensions": 8}, {"input": [[1]]})},
    "/embeddings": {"post": ("image-text", {"input": "a", "modality": "text"}, {"input": ["x"], "modality": "audio"})},
    "/embed": {"post": ("embedding", {"inputs": TEXTS[0], "normalize": True}, {"inputs": "x", "normalize": False})},
    "/embed_sparse": {"post": ("sparse", {"inputs": TEXTS, "truncate": True}, {"inputs": []})},
    "/similarity": {
        "post": ("embedding", {"inputs": {"source_sentence": "a", "sentences": TEXTS}}, {"inputs": {"sentences": []}})
    },
    "/tokenize": {"post": ("embedding", {"inputs": TEXTS}, {"inputs": [True]})},
    "/decode": {"post": ("embedding", {"ids": [[101, 7592, 102], [2088]]}, {"ids": [-1]})},
    "/rerank": {"post": ("rerank", {"query": "q", "texts": TEXTS, "return_text": True}, {"query": "q"})},
    "/v1/rerank": {"post": ("rerank", {"query": "q", "documents": TEXTS, "top_n": 1}, {"query": 1, "documents": []})},
    "/v2/rerank": {
        "post": ("rerank", {"query": "q", "documents": [{"text": "a"}], "return_documents": True}, {"documents": "a"})
    },
    "/v2/embed": {
        "post": (
            "embedding",
            {"texts": TEXTS, "model": "x", "input_type": "search_query", "embedding_types": ["float", "base64"]},
            {"texts": [], "input_type": "search"},
        )
    },
    "/predict": {"post": ("classify", {"inputs": "great", "parameters": {"top_k": 2}}, {"inputs": {}})},
    "/v1/chat/completions": {
        "post": (
            "generate",
            {"messages": [{"role": "user", "content": "hi"}], "model": "x", "max_tokens": 4, "stream": False},
            {"messages": [{"role": "user", "content": "hi"}], "n": 2},
        )
    },
    "/v1/completions": {"post": ("generate", {"prompt": "once", "max_tokens": 3, "stop": ["x"]}, {"prompt": []})},
    "/v1/models": {"get": ("generate", None, None)},
    "/ping": {"get": ("embedding", None, None)},
    "/health": {"get": ("embedding", None, None)},
    "/healthz": {"get": ("embedding", None, None)},
    "/info": {"get": ("embedding", None, None)},
    "/status": {"get": ("embedding", None, None)},
    "/metrics": {"get": ("embedding", None, None)},
    "/openapi.json": {"get": ("embedding", None, None)},
    "/docs": {"get": ("embedding", None, None)},
}


@pytest.fixture(scope="module")
def clients(
    new_runtime: Callable[..., Runtime], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, TestClient]]:
    runtime = new_runtime()
    with pytest.MonkeyPatch.context() as mp:  # the `generate` task over the fake engine (no model)
        register(mp)
        generate = fake_generate_runtime(tmp_path_factory.mktemp("generate"))
    made = {
        "embedding": client_for(runtime),
        "rerank": client_for(fake_runtime(runtime, FakeTask("rerank", rerank_answer))),
        "classify": client_for(fake_runtime(runtime, FakeTask("classify", classify_answer))),
        "image-text": client_for(fake_runtime(runtime, FakeTask("image-text", vectors_answer))),
        "sparse": client_for(fake_runtime(runtime, FakeTask("sparse", sparse_answer))),
        "generate": client_for(generate),
    }
    for c in made.values():
        c.__enter__()
    yield made
    for c in made.values():
        c.__exit__(None, None, None)


@pytest.fixture(scope="module")
def document(clients: dict[str, TestClient]) -> dict[str, Any]:
    r = clients["embedding"].get("/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc: dict[str, Any] = r.json()
    return doc


def validator(document: dict[str, Any], schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({**schema, "components": document["components"]})


def test_the_document_is_valid_openapi_and_names_every_route(document: dict[str, Any]) -> None:
    validate_spec(document)
    assert document["openapi"] == "3.1.0"
    assert {p: set(ops) for p, ops in document["paths"].items()} == {p: set(ops) for p, ops in EXAMPLES.items()}
    for schema in document["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)


def test_the_docs_page_shows_every_operation_and_loads_nothing(
    clients: dict[str, TestClient], document: dict[str, Any]
) -> None:
    r = clients["embedding"].get("/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"].startswith("default-src 'none'")
    page = r.text
    for path, ops in document["paths"].items():
        for method in ops:
            anchor = f"{method}-{path.strip('/').replace('/', '-') or 'root'}"
            assert f'<section id="{anchor}"><h2><span class="m">{method}</span> <code>{path}</code></h2>' in page
            assert f'href="#{anchor}"' in page  # in the list of routes
    for name in document["components"]["schemas"]:
        assert f'<section id="schema-{name}">' in page
    assert 'href="#schema-CohereEmbedRequest"' in page  # a request body links to its schema
    # Offline: no script, nothing fetched from elsewhere (a CDN's assets), every link on the page itself.
    assert "<script" not in page.lower() and "src=" not in page.lower() and "<link" not in page.lower()
    assert set(re.findall(r'href="([^"]*)"', page)) - {"/openapi.json"} <= {
        f"#{a}" for a in re.findall(r'id="([^"]+)"', page)
    }


@pytest.mark.parametrize(("path", "method"), [(p, m) for p, ops in EXAMPLES.items() for m in ops])
def test_every_route_answers_as_the_document_says(
    clients: dict[str, TestClient], document: dict[str, Any], path: str, method: str
) -> None:
    kind, good, bad = EXAMPLES[path][method]
    client = clients[kind]
    operation = document["paths"][path][method]
    if good is not None:
        request_schema = operation["requestBody"]["content"]["application/json"]["schema"]
        validator(document, request_schema).validate(good)  # the example is what the document accepts
    r = client.request(method.upper(), path, json=good)
    assert r.status_code == 200, r.text
    content = operation["responses"]["200"]["content"]
    media = next(iter(content))
    assert r.headers["content-type"].split(";")[0] == media.split(";")[0]
    if media == "application/json":
        validator(document, content[media]["schema"]).validate(r.json())
    error_schema = operation["responses"]["default"]["content"]["application/json"]["schema"]
    if bad is not None:
        r = client.request(method.upper(), path, json=bad)
        assert 400 <= r.status_code < 500, r.text
        validator(document, error_schema).validate(r.json())
    r = client.request("DELETE", path)  # a method the route does not take: an error, in the Error shape
    assert r.status_code == 405
    validator(document, error_schema).validate(r.json())


@pytest.mark.parametrize(
    ("path", "chunk"), [("/v1/chat/completions", "ChatCompletionChunk"), ("/v1/completions", "CompletionChunk")]
)
def test_a_stream_is_the_chunks_the_document_names(
    clients: dict[str, TestClient], document: dict[str, Any], path: str, chunk: str
) -> None:
    content = document["paths"][path]["post"]["responses"]["200"]["content"]
    assert set(content) == {"application/json", "text/event-stream"}
    assert chunk in content["text/event-stream"]["schema"]["description"]
    body = {"messages": [{"role": "user", "content": "a b"}]} if "chat" in path else {"prompt": "a b"}
    r = clients["generate"].post(path, json={**body, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    data = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
    assert data[-1] == "[DONE]" and len(data) > 3
    for item in data[:-1]:
        validator(document, schemas.ref(chunk)).validate(json.loads(item))


REQUESTS: dict[str, list[Any]] = {
    "OpenAIEmbeddingsRequest": [
        {"input": "a"},
        {"input": ["a", "b"], "model": None, "encoding_format": "base64", "dimensions": 3, "user": "u"},
        {"input": []},
        {"input": 1},
        {"input": "a", "dimensions": 0},
        {"input": "a", "dimensions": True},
        {"input": "a", "encoding_format": "int8"},
        {"model": "x"},
        [],
        "a",
    ],
    "EmbedRequest": [
        {"inputs": "a", "normalize": True, "truncate": None, "truncation_direction": "right"},
        {"inputs": "a", "normalize": False},
        {"inputs": "a", "truncation_direction": "Left"},
        {"inputs": ["a", 1]},
    ],
    "EmbedSparseRequest": [{"inputs": ["a"], "prompt_name": None}, {"inputs": 1}, {"truncate": True}],
    "SimilarityRequest": [
        {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": {"prompt_name": None}},
        {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": []},
        {"inputs": {"source_sentence": 1, "sentences": ["b"]}},
        {"inputs": ["a"]},
    ],
    "RerankRequest": [
        {"query": "q", "texts": ["a"], "raw_scores": False},
        {"query": "q", "texts": ["a"], "raw_scores": True},
        {"query": "q", "texts": []},
        {"query": None, "texts": ["a"]},
    ],
    "CohereRerankRequest": [
        {"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1, "return_documents": None},
        {"query": "q", "documents": [{"title": "b"}]},
        {"query": "q", "documents": ["a"], "max_tokens_per_doc": 3},
        {"query": "q", "documents": ["a"], "top_n": -1},
    ],
    "PredictRequest": [
        {"inputs": ["a", "b"], "parameters": {"top_k": 1, "function_to_apply": "softmax"}},
        {"inputs": "a", "parameters": {"function_to_apply": "none"}},
        {"inputs": [["a", "b"]]},
        {"inputs": "a", "parameters": {"top_k": 0}},
    ],
    "ChatCompletionRequest": [
        {"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}]}], "stream": True},
        {"messages": [{"role": "user", "content": "a"}], "stream_options": {"include_usage": None}, "top_k": -1},
        {"messages": [{"role": "user", "content": "a"}], "response_format": {"type": "json_schema"}},
        {"messages": [{"role": "user", "content": "a"}], "stop": ["a", "b", "c", "d", "e"]},
        {"messages": [{"role": "tool", "content": "a"}]},
        {"messages": [{"role": "user", "content": None}]},
        {"messages": []},
        {"messages": [{"role": "user", "content": "a"}], "temperature": -1},
    ],
    "CompletionRequest": [
        {"prompt": "a", "max_tokens": 2, "seed": 1, "top_p": 0.5},
        {"prompt": ["a"], "echo": False},
        {"prompt": ["a", "b"]},
        {"prompt": "a", "stream": 1},
        {"prompt": "a", "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
    ],
    "TokenizeRequest": [{"inputs": ["a"], "add_special_tokens": False}, {"inputs": "a", "add_special_tokens": 1}],
    "DecodeRequest": [
        {"ids": [1, 2]},
        {"ids": [[1], [2, 3]], "skip_special_tokens": False},
        {"ids": [[]]},
        {"ids": [1, [2]]},
        {"ids": [[1], 2]},
        {"ids": [[-1]]},
        {"ids": "1"},
    ],
}


def test_integral_floats_are_the_one_deliberate_difference(document: dict[str, Any]) -> None:
    """JSON Schema counts 2.0 as an integer; the host, as its tasks always have, refuses it (a count sent as a
    float is most likely a client's bug). Every other verdict is the same (below)."""
    body = {"input": "a", "dimensions": 2.0}
    assert validator(document, schemas.ref("OpenAIEmbeddingsRequest")).is_valid(body)
    with pytest.raises(InvalidInputError, match="dimensions"):
        schemas.check(body, "OpenAIEmbeddingsRequest")


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_the_hosts_validator_agrees_with_jsonschema(document: dict[str, Any], name: str) -> None:
    full = validator(document, schemas.ref(name))
    for body in REQUESTS[name]:
        accepted = full.is_valid(body)
        try:
            schemas.check(body, name)
            ours = True
        except InvalidInputError:
            ours = False
        assert ours == accepted, (name, body)
