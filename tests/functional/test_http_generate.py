"""OpenAI's completion routes through the HTTP host's app and through Lambda HTTP events: answers and
server-sent chunks in OpenAI's shapes, the native request the task is given, typed refusals, `GET /v1/models`.
The task: a stand-in `generate` task (tests/fixtures/generate_standin.py): its answer is "echo: " and the prompt."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from handler.runtime.invocation import Runtime
from tests.conftest import http_v2_event
from tests.fixtures.generate_standin import StandinGenerate, standin_runtime
from tests.functional.test_http_compat import client_for

USER = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def base(new_runtime: Callable[..., Runtime]) -> Runtime:
    return new_runtime()


@pytest.fixture
def task() -> StandinGenerate:
    return StandinGenerate()


@pytest.fixture
def runtime(base: Runtime, task: StandinGenerate) -> Runtime:
    return standin_runtime(base, task)


@pytest.fixture
def client(runtime: Runtime) -> Iterator[TestClient]:
    with client_for(runtime) as c:
        yield c


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


def test_chat_answer(client: TestClient, task: StandinGenerate) -> None:
    r = client.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": USER, "max_tokens": 10})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "echo: hello there"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    assert task.requests == [{"messages": USER, "max_tokens": 10}]  # "gpt-4o" is not served: the default model


def test_chat_stream_is_openais_chunks(client: TestClient) -> None:
    body = {"messages": USER, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 2}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks = events(r.text)
    assert chunks[-1] == "[DONE]"
    chunks = chunks[:-1]
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
    assert [c["choices"][0]["delta"] for c in chunks[:-1]] == [
        {"role": "assistant", "content": ""},
        {"content": "echo:"},
        {"content": " hello"},
        {},
    ]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 2,
        "total_tokens": 4,
    }


def test_completions_answer_and_stream(client: TestClient, task: StandinGenerate) -> None:
    r = client.post("/v1/completions", json={"prompt": ["a b c"], "stop": " b"})
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "text_completion" and r.json()["choices"][0]["text"] == "echo: a"
    r = client.post("/v1/completions", json={"prompt": "a b c", "stream": True})
    chunks = events(r.text)
    assert chunks[-1] == "[DONE]" and {c["object"] for c in chunks[:-1]} == {"text_completion"}
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == "echo: a b c"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and "usage" not in chunks[-2]
    assert task.requests == [{"prompt": "a b c", "stop": " b"}, {"prompt": "a b c"}]


@pytest.mark.parametrize("stream", [False, True])
def test_refusals_are_typed_400s_naming_the_field(client: TestClient, task: StandinGenerate, stream: bool) -> None:
    r = client.post("/v1/chat/completions", json={"messages": USER, "n": 2, "stream": stream})
    assert r.status_code == 400 and r.headers["content-type"] == "application/json"
    assert r.json()["error"]["type"] == "UnsupportedRequestError" and '"n"' in r.json()["error"]["message"]
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 0, "stream": stream})
    assert r.status_code == 400 and r.json()["error"]["type"] == "InvalidInputError"
    assert task.requests == []  # refused before the task


def test_an_embedding_model_does_not_serve_chat(base: Runtime) -> None:
    with client_for(base) as client:
        r = client.post("/v1/chat/completions", json={"messages": USER})
        assert r.status_code == 400 and "needs a generate model" in r.json()["error"]["message"]  # TIGHTEN


def test_models_lists_what_is_served(client: TestClient, runtime: Runtime) -> None:
    r = client.get("/v1/models")
    assert r.status_code == 200
    (model,) = r.json()["data"]
    key = runtime.registry.default_key
    assert r.json()["object"] == "list"
    assert model == {
        "id": key.split("@")[0],
        "object": "model",
        "created": model["created"],
        "owned_by": "warmstart",
        "key": key,
        "task": runtime.manifest.task,
    }
    assert isinstance(model["created"], int) and model["created"] > 1_600_000_000


# -- Lambda HTTP events (Function URL, API Gateway): one buffered answer


def test_a_function_url_event_gets_the_chat_answer(runtime: Runtime) -> None:
    answer = runtime.handle(http_v2_event("/v1/chat/completions", {"messages": USER}), None)
    assert answer["statusCode"] == 200 and answer["headers"]["content-type"] == "application/json"
    body = json.loads(answer["body"])
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"] == "echo: hello there"


def test_a_function_url_stream_is_the_whole_event_stream_in_one_body(runtime: Runtime, task: StandinGenerate) -> None:
    body = {"messages": USER, "stream": True, "stream_options": {"include_usage": True}}
    answer = runtime.handle(http_v2_event("/v1/chat/completions", body), None)
    assert answer["statusCode"] == 200 and answer["headers"]["content-type"] == "text/event-stream"
    chunks = events(answer["body"])
    assert chunks[-1] == "[DONE]" and len({c["id"] for c in chunks[:-1]}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-2]) == "echo: hello there"
    assert chunks[-2]["usage"]["completion_tokens"] == 3 and task.closed == 1
    refused = runtime.handle(http_v2_event("/v1/completions", {"prompt": "x", "echo": True, "stream": True}), None)
    assert refused["statusCode"] == 400 and '"echo"' in json.loads(refused["body"])["error"]["message"]


def test_a_function_url_get_of_the_model_list(runtime: Runtime) -> None:
    event = http_v2_event("/v1/models", None)
    event["requestContext"]["http"]["method"] = "GET"
    del event["body"]
    answer = runtime.handle(event, None)
    assert answer["statusCode"] == 200 and json.loads(answer["body"])["data"][0]["owned_by"] == "warmstart"
    event["rawPath"] = "/other"  # any other GET is still refused
    assert runtime.handle(event, None)["statusCode"] == 405
