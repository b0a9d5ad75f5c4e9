"""OpenAI's completion routes through the HTTP host's app and through Lambda HTTP events, on the real `generate`
task over the fake engine (tests/fixtures/fake_engine.py: deterministic tokens, no model): answers and
server-sent chunks in OpenAI's shapes, each equal to the native route's answer to the same request; the native
request the engine is given; typed refusals; `GET /v1/models`."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from handler.core.config import Config
from handler.runtime.invocation import Runtime
from tests.conftest import http_v2_event
from tests.fixtures.fake_engine import FakeEngine, fake_generate_pack, register
from tests.functional.test_http_compat import client_for

USER = [{"role": "user", "content": "hello there"}]
GREEDY = {"temperature": 0, "max_tokens": 6}


def fake_generate_runtime(root: Path) -> Runtime:
    """A runtime serving a `generate` pack over the fake engine (registered while the caller's monkeypatch is)."""
    return Runtime.start(Config(model_dir=fake_generate_pack(root), backend=None, warmup=False), environ={}, emit=None)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    with pytest.MonkeyPatch.context() as mp:
        register(mp)
        yield fake_generate_runtime(tmp_path_factory.mktemp("generate"))


@pytest.fixture
def engine(runtime: Runtime) -> FakeEngine:
    engine = runtime.backend
    assert isinstance(engine, FakeEngine)
    engine.requests.clear()
    return engine


@pytest.fixture(scope="module")
def client(runtime: Runtime) -> Iterator[TestClient]:
    with client_for(runtime) as c:
        yield c


def native(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/invocations", json=body)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def events(text: str) -> list[Any]:
    """The `data:` of each server-sent event: JSON, or the final "[DONE]"."""
    out: list[Any] = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
        else:
            assert block == "", block
    return out


def test_chat_answer_is_the_native_answer(client: TestClient, engine: FakeEngine) -> None:
    want = native(client, {"messages": USER, **GREEDY})
    r = client.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": USER, **GREEDY})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "fake-lm@1" and isinstance(body["created"], int)
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": want["text"]},
            "logprobs": None,
            "finish_reason": want["finish_reason"],
        }
    ]
    assert body["usage"] == want["usage"] and want["usage"]["completion_tokens"] == 6
    unseeded = [{k: v for k, v in r.items() if k != "seed"} for r in engine.requests]  # drawn per request
    assert unseeded[0] == unseeded[1]  # the same request reached the engine both ways


def test_fields_reach_the_engine(client: TestClient, engine: FakeEngine) -> None:
    body = {
        "messages": [{"role": "developer", "content": "be brief"}, *USER],
        "max_completion_tokens": 3,
        "temperature": 0.7,
        "top_p": 0.5,
        "top_k": -1,
        "seed": 11,
        "n": 1,
        "presence_penalty": 0,
    }
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    want = {"messages": [{"role": "system", "content": "be brief"}, *USER], "max_tokens": 3, "temperature": 0.7}
    assert native(client, {**want, "top_p": 0.5, "top_k": 0, "seed": 11})["usage"]["completion_tokens"] == 3
    first, second = engine.requests
    assert first == second and first["seed"] == 11 and first["top_k"] == 0 and first["max_tokens"] == 3


def test_chat_stream_is_openais_chunks_of_the_native_answer(client: TestClient) -> None:
    want = native(client, {"messages": USER, **GREEDY})
    body = {"messages": USER, **GREEDY, "stream": True, "stream_options": {"include_usage": True}}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks = events(r.text)
    assert chunks[-1] == "[DONE]"
    chunks = chunks[:-1]
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and {c["model"] for c in chunks} == {"fake-lm@1"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-2]) == want["text"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-2])
    assert chunks[-2]["choices"][0]["delta"] == {} and chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == want["usage"]
    assert {c["usage"] for c in chunks[:-1]} == {None}


def test_completions_answer_and_stream(client: TestClient) -> None:
    want = native(client, {"prompt": "once upon", **GREEDY})
    r = client.post("/v1/completions", json={"prompt": ["once upon"], **GREEDY})
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "text_completion" and r.json()["id"].startswith("cmpl-")
    assert r.json()["choices"] == [
        {"index": 0, "text": want["text"], "logprobs": None, "finish_reason": want["finish_reason"]}
    ]
    r = client.post("/v1/completions", json={"prompt": "once upon", **GREEDY, "stream": True})
    chunks = events(r.text)
    assert chunks[-1] == "[DONE]" and {c["object"] for c in chunks[:-1]} == {"text_completion"}
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == want["text"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and "usage" not in chunks[-2]


@pytest.mark.parametrize("stream", [False, True])
def test_refusals_are_typed_400s_naming_the_field(client: TestClient, engine: FakeEngine, stream: bool) -> None:
    r = client.post("/v1/chat/completions", json={"messages": USER, "n": 2, "stream": stream})
    assert r.status_code == 400 and r.headers["content-type"] == "application/json"
    assert r.json()["error"]["type"] == "UnsupportedRequestError" and '"n"' in r.json()["error"]["message"]
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 0, "stream": stream})
    assert r.status_code == 400 and r.json()["error"]["type"] == "InvalidInputError"
    # The task's own check (before its first piece): a typed JSON answer, not an event stream.
    r = client.post("/v1/chat/completions", json={"messages": USER, "temperature": 5, "stream": stream})
    assert r.status_code == 400 and r.headers["content-type"] == "application/json"
    assert "temperature" in r.json()["error"]["message"]
    assert engine.requests == []  # refused before the engine


def test_an_embedding_model_does_not_serve_chat(new_runtime: Callable[..., Runtime]) -> None:
    with client_for(new_runtime()) as client:
        r = client.post("/v1/chat/completions", json={"messages": USER})
        assert r.status_code == 400
        assert r.json()["error"]["message"].startswith("POST /v1/chat/completions needs a generate model")


def test_models_lists_what_is_served(client: TestClient) -> None:
    r = client.get("/v1/models")
    assert r.status_code == 200
    assert r.json() == {
        "object": "list",
        "data": [
            {
                "id": "fake-lm",
                "object": "model",
                "created": r.json()["data"][0]["created"],
                "owned_by": "warmstart",
                "key": "fake-lm@1",
                "task": "generate",
            }
        ],
    }
    assert r.json()["data"][0]["created"] > 1_600_000_000


# -- Lambda HTTP events (Function URL, API Gateway): one buffered answer


def test_a_function_url_event_gets_the_chat_answer(runtime: Runtime) -> None:
    want = runtime.handle({"messages": USER, **GREEDY}, None)
    answer = runtime.handle(http_v2_event("/v1/chat/completions", {"messages": USER, **GREEDY}), None)
    assert answer["statusCode"] == 200 and answer["headers"]["content-type"] == "application/json"
    body = json.loads(answer["body"])
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"] == want["text"]


def test_a_function_url_stream_is_the_whole_event_stream_in_one_body(runtime: Runtime, engine: FakeEngine) -> None:
    want = runtime.handle({"messages": USER, **GREEDY}, None)
    body = {"messages": USER, **GREEDY, "stream": True, "stream_options": {"include_usage": True}}
    answer = runtime.handle(http_v2_event("/v1/chat/completions", body), None)
    assert answer["statusCode"] == 200 and answer["headers"]["content-type"] == "text/event-stream"
    chunks = events(answer["body"])
    assert chunks[-1] == "[DONE]" and len({c["id"] for c in chunks[:-1]}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-2]) == want["text"]
    assert chunks[-2]["usage"] == want["usage"]
    refused = runtime.handle(http_v2_event("/v1/completions", {"prompt": "x", "echo": True, "stream": True}), None)
    assert refused["statusCode"] == 400 and '"echo"' in json.loads(refused["body"])["error"]["message"]


def test_a_function_url_get_of_the_model_list(runtime: Runtime) -> None:
    event = http_v2_event("/v1/models", None)
    event["requestContext"]["http"]["method"] = "GET"
    del event["body"]
    answer = runtime.handle(event, None)
    assert answer["statusCode"] == 200 and json.loads(answer["body"])["data"][0]["key"] == "fake-lm@1"
    event["rawPath"] = "/other"  # any other GET is still refused
    assert runtime.handle(event, None)["statusCode"] == 405


def test_a_consumer_that_leaves_stops_the_engine(runtime: Runtime, engine: FakeEngine) -> None:
    """The host closes the stream when its client leaves: the route's chunks, the task's stream and the engine's
    generation stop with it (its `finally`), after the tokens already made."""
    from handler.api.compat import ROUTES

    body = {"messages": USER, "max_tokens": 50, "temperature": 0, "stream": True}
    closed, made = engine.closed, len(engine.made)
    stream = runtime.handle_http_stream(json.dumps(body).encode(), ROUTES["/v1/chat/completions"])
    first, second = next(stream), next(stream)
    assert isinstance(first, dict) and first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert isinstance(second, dict) and second["id"] == first["id"] and second["choices"][0]["delta"]["content"]
    stream.close()
    assert engine.closed == closed + 1 and len(engine.made) - made < 50


def test_a_generate_model_beside_an_embedding_default_streams(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host streams a completion route for the model the request names, not only for a streaming default."""
    register(monkeypatch)
    pack = fake_generate_pack(tmp_path)
    config = Config(model_dir=model_dir, backend=None, warmup=False, models=(str(pack),))
    runtime = Runtime.start(config, environ={}, emit=None)
    assert runtime.manifest.task == "embedding"
    with client_for(runtime) as client:
        body = {"model": "fake-lm", "messages": USER, **GREEDY}
        want = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
        r = client.post("/v1/chat/completions", json={**body, "stream": True})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        chunks = events(r.text)
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == want
        assert {c["model"] for c in chunks[:-1]} == {"fake-lm@1"}
        listed = client.get("/v1/models").json()["data"]
        assert [(m["id"], m["task"]) for m in listed] == [("all-minilm-l6-v2", "embedding"), ("fake-lm", "generate")]
        r = client.post("/v1/chat/completions", json={"messages": USER, "stream": True})  # the default: embedding
        assert r.status_code == 400 and "needs a generate model" in r.json()["error"]["message"]
