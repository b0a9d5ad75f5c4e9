"""The official clients of OpenAI's completion APIs against a real `python -m handler` serving a tiny packed qwen3
(random weights, built by onnxruntime-genai's model builder: tests/fixtures/genai_pack.py) on the genai backend.
Greedy (temperature 0): every client's answer is the native route's (`POST /invocations`) for the same request,
text and usage, streamed or not.

- openai: `chat.completions.create` (stream off; on, with `stream_options.include_usage`; `response_format`
  json_schema; a typed 400), `completions.create` (stream off and on), `models.list()`;
- huggingface_hub: `InferenceClient(base_url).chat_completion` (stream off and on);
- langchain-openai: `ChatOpenAI(base_url).invoke` and `.stream`;
- openai again, through the local Lambda's own Function URL (`infra.local`, BUFFERED) serving the same pack: the
  chat answer, a stream (buffered: the whole stream's events in one body) and the model list.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.genai_pack import cached_genai_pack
from tests.integration.test_clients import Host, hub_client, start_host, stop, wait_ready

__all__ = ["hub_client"]  # a fixture, imported for the tests here

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"),
]

MODEL = "qwen3-tiny"
KEY = f"{MODEL}@1"
MESSAGES = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Say hello."}]
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 8}


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pack = cached_genai_pack(tmp_path_factory.mktemp("genai"), "qwen3")
    assert json.loads((pack / "manifest.json").read_text())["id"] == MODEL
    return pack


@pytest.fixture(scope="module")
def host(pack: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    host = start_host(tmp_path_factory.mktemp("host") / "host.log", WARMSTART_MODEL=str(pack))
    try:
        wait_ready(host)
        yield host
    finally:
        stop(host)


@pytest.fixture(scope="module")
def chat_native(host: Host) -> dict[str, Any]:
    answer = host.native({"messages": MESSAGES, **GREEDY})
    assert answer["usage"]["completion_tokens"] == 8 and answer["model"] == KEY
    return answer


def openai_client(host: Host) -> Any:
    import openai

    return openai.OpenAI(base_url=host.url + "/v1", api_key="unused", max_retries=0)


def test_openai_chat(host: Host, chat_native: dict[str, Any]) -> None:
    answer = openai_client(host).chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY)
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-") and answer.model == KEY
    (choice,) = answer.choices
    assert choice.message.role == "assistant" and choice.message.content == chat_native["text"]
    assert choice.finish_reason == chat_native["finish_reason"] == "length"
    assert (
        answer.usage is not None
        and answer.usage.model_dump(include={"prompt_tokens", "completion_tokens", "total_tokens"})
        == chat_native["usage"]
    )


def test_openai_chat_stream_with_usage(host: Host, chat_native: dict[str, Any]) -> None:
    stream = openai_client(host).chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **GREEDY
    )
    chunks = list(stream)
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat_native["text"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == chat_native["usage"]["total_tokens"]
    assert all(c.usage is None for c in chunks[:-1])


def test_openai_chat_json_schema(host: Host) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    answer = openai_client(host).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        temperature=0,
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}},
    )
    content = answer.choices[0].message.content
    assert content is not None and json.loads(content)["answer"] in ("yes", "no")  # a random model, constrained
    assert answer.choices[0].finish_reason == "stop"


def test_openai_refusals_are_bad_requests(host: Host) -> None:
    import openai

    with pytest.raises(openai.BadRequestError, match='"n": only 1 is served'):
        openai_client(host).chat.completions.create(model=MODEL, messages=MESSAGES, n=2)
    with pytest.raises(openai.BadRequestError, match='"tools": tool calls are not served'):
        openai_client(host).chat.completions.create(
            model=MODEL, messages=MESSAGES, tools=[{"type": "function", "function": {"name": "f"}}]
        )


def test_openai_completions(host: Host) -> None:
    native = host.native({"prompt": "Once upon a time", **GREEDY})
    client = openai_client(host)
    answer = client.completions.create(model=MODEL, prompt="Once upon a time", **GREEDY)
    assert answer.object == "text_completion" and answer.choices[0].text == native["text"]
    assert answer.usage is not None and answer.usage.completion_tokens == native["usage"]["completion_tokens"]
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon a time", stream=True, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks) == native["text"]
    assert chunks[-1].choices[0].finish_reason == "length"


def test_openai_models_list(host: Host) -> None:
    models = openai_client(host).models.list()
    assert [m.id for m in models] == [MODEL]
    (model,) = models.data
    assert (
        model.object == "model"
        and model.owned_by == "warmstart"
        and model.model_extra == {"key": KEY, "task": "generate"}
    )


def test_huggingface_inference_client_chat(host: Host, chat_native: dict[str, Any], hub_client: Any) -> None:
    # `hub_client`: InferenceClient with HF_HUB_OFFLINE lifted (an earlier test's tiny models set it, which
    # blocks every request of the client, a local URL's too).
    client = hub_client(base_url=host.url)
    answer = client.chat_completion(MESSAGES, model=MODEL, **GREEDY)
    assert answer.choices[0].message.content == chat_native["text"]
    chunks = list(client.chat_completion(MESSAGES, model=MODEL, stream=True, **GREEDY))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat_native["text"]


def test_langchain_chat_openai(host: Host, chat_native: dict[str, Any]) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=host.url + "/v1", api_key="unused", model=MODEL, max_retries=0, **GREEDY)  # type: ignore[arg-type]
    pairs = [(m["role"], m["content"]) for m in MESSAGES]
    answer = llm.invoke(pairs)
    assert answer.content == chat_native["text"]
    assert answer.usage_metadata is not None and answer.usage_metadata["output_tokens"] == 8
    streamed = "".join(str(chunk.content) for chunk in llm.stream(pairs))
    assert streamed == chat_native["text"]


def test_openai_chat_through_a_function_url_on_the_local_lambda(pack: Path, chat_native: dict[str, Any]) -> None:
    """The local Lambda's own Function URL (BUFFERED, awslambdaric's handler): a stream there is the whole stream's
    events in one body."""
    import openai

    from tests.fixtures.local_support import running

    env = {"WARMSTART_MODEL": str(pack), "WARMSTART_WARMUP": "0"}
    with running(handler="handler.app.lambda_handler", environment=env) as (local, _lam):
        client = openai.OpenAI(base_url=f"{local.endpoint}/lambda-url/warmstart/v1", api_key="unused", max_retries=0)
        try:
            answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY)
            assert answer.choices[0].message.content == chat_native["text"] and answer.model == KEY
            chunks = list(
                client.chat.completions.create(
                    model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **GREEDY
                )
            )
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat_native["text"]
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
            assert [m.id for m in client.models.list()] == [MODEL]
            with pytest.raises(openai.BadRequestError, match='"echo"'):
                client.completions.create(model=MODEL, prompt="x", echo=True)
        finally:
            client.close()


def test_streamed_generation_on_the_local_lambda(pack: Path, chat_native: dict[str, Any]) -> None:
    """End to end as on AWS: the local Lambda runs `python -m handler` (the shim's own streaming Runtime API
    loop) over the tiny qwen3; an OpenAI client streams from its Function URL in RESPONSE_STREAM mode, and boto3's
    `invoke_with_response_stream` reads the native request's server-sent events as PayloadChunk events. Both give
    the HTTP host's greedy answer, and the stream arrives in more than one piece."""
    import openai

    from tests.fixtures.local_support import running

    env = {"WARMSTART_MODEL": str(pack), "WARMSTART_WARMUP": "0"}
    with running(command=("python", "-m", "handler"), invoke_mode="RESPONSE_STREAM", environment=env) as (
        local,
        lam,
    ):
        url = f"{local.endpoint}/lambda-url/warmstart/v1"
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        try:
            chunks = list(
                client.chat.completions.create(
                    model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **GREEDY
                )
            )
            answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY)
        finally:
            client.close()
        deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert "".join(deltas) == chat_native["text"] and len(deltas) > 1
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
        assert answer.choices[0].message.content == chat_native["text"]

        body = json.dumps({"messages": MESSAGES, "stream": True, **GREEDY})
        events = lam.invoke_with_response_stream(FunctionName="warmstart", Payload=body)["EventStream"]
        payload, complete = [], None
        for item in events:
            if "PayloadChunk" in item:
                payload.append(item["PayloadChunk"]["Payload"])
            elif "InvokeComplete" in item:
                complete = item["InvokeComplete"]
        assert complete is not None and not complete.get("ErrorCode")
        lines = b"".join(payload).decode().split("\n\n")
        assert lines[-2] == "data: [DONE]"
        pieces = [json.loads(line.removeprefix("data: ")) for line in lines[:-2]]
        assert "".join(p["text"] for p in pieces) == chat_native["text"]
        assert pieces[-1]["finish_reason"] == "length" and pieces[-1]["usage"]["completion_tokens"] == 8
