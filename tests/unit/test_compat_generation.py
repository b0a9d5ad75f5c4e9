"""OpenAI's completion routes (`/v1/chat/completions`, `/v1/completions`) as pure functions: what each field
becomes in the native request, what is refused (a typed 400 naming the field), and the answer and stream chunks
in OpenAI's shapes. No model: `Route.request`, `response` and `pieces` are pure."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from handler.api import schemas
from handler.api.compat import ROUTES, Generation, model_list
from handler.core.errors import InvalidInputError, UnsupportedRequestError

CHAT, TEXT = ROUTES["/v1/chat/completions"], ROUTES["/v1/completions"]
USER = [{"role": "user", "content": "hi"}]
USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def find(name: str) -> str | None:
    return {"served": "served@2"}.get(name)


def pieces(*texts: str, finish: str = "stop") -> Iterator[dict[str, Any]]:
    for i, text in enumerate(texts):
        yield {"text": text, "token_ids": [i]}
    yield {"text": "", "token_ids": [], "finish_reason": finish, "usage": USAGE}


def valid(name: str, value: Any) -> None:
    """`value` against schema `name` by jsonschema (the document's own validator), and by the host's."""
    jsonschema.Draft202012Validator({**schemas.SCHEMAS[name], "components": {"schemas": schemas.SCHEMAS}}).validate(
        value
    )
    assert not schemas.errors(value, schemas.SCHEMAS[name])


def test_chat_fields_map_to_the_native_request() -> None:
    body = {
        "model": "served",
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "system", "content": "sys", "name": "x"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "ok"},
        ],
        "max_completion_tokens": 7,
        "max_tokens": 99,  # the newer name wins
        "temperature": 0,
        "top_p": 0.5,
        "top_k": -1,  # vLLM's "every token"
        "seed": 3,
        "stop": ["\n", "END"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "response_format": {"type": "json_object"},
        "chat_template_kwargs": {"enable_thinking": False},
        "n": 1,
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "logprobs": False,
        "logit_bias": {},
        "tools": [],
        "tool_choice": "none",
        "user": "u",
    }
    assert CHAT.request(body, find) == {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "ok"},
        ],
        "chat_template_kwargs": {"enable_thinking": False},
        "max_tokens": 7,
        "temperature": 0,
        "top_p": 0.5,
        "top_k": 0,
        "seed": 3,
        "stop": ["\n", "END"],
        "response_format": {"type": "json_object"},
        "model": "served@2",
    }
    assert CHAT.request({"messages": USER, "max_tokens": 4, "top_k": 5}, find) == {
        "messages": USER,
        "max_tokens": 4,
        "top_k": 5,
    }


def test_completion_fields_map_to_the_native_request() -> None:
    assert TEXT.request({"prompt": "once", "max_tokens": 3, "stop": "x", "model": "gpt-3.5"}, find) == {
        "prompt": "once",
        "max_tokens": 3,
        "stop": "x",
    }
    assert TEXT.request({"prompt": ["one"], "echo": False, "best_of": 1, "suffix": None}, find) == {"prompt": "one"}


@pytest.mark.parametrize(
    ("route", "body", "message"),
    [
        (CHAT, {"messages": USER, "n": 2}, '"n": only 1 is served'),
        (CHAT, {"messages": USER, "logprobs": True}, '"logprobs": true is not served'),
        (CHAT, {"messages": USER, "top_logprobs": 2}, '"top_logprobs": not served'),
        (CHAT, {"messages": USER, "tools": [{"type": "function"}]}, '"tools": tool calls are not served'),
        (CHAT, {"messages": USER, "tool_choice": "required"}, '"tool_choice": tool calls'),
        (CHAT, {"messages": USER, "logit_bias": {"5": 1}}, '"logit_bias": token biases'),
        (CHAT, {"messages": USER, "presence_penalty": 0.5}, '"presence_penalty": only 0'),
        (CHAT, {"messages": USER, "frequency_penalty": -1}, '"frequency_penalty": only 0'),
        (
            CHAT,
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}]},
            'messages[0].content[1]: "image_url" parts are not served',
        ),
        (TEXT, {"prompt": ["a", "b"]}, '"prompt": a list of 2 texts is not served'),
        (TEXT, {"prompt": [1, 2, 3]}, "prompt[0]: token ids"),
        (TEXT, {"prompt": "a", "best_of": 3}, '"best_of": only 1'),
        (TEXT, {"prompt": "a", "echo": True}, '"echo": true is not served'),
        (TEXT, {"prompt": "a", "suffix": "end"}, '"suffix": not served'),
        (TEXT, {"prompt": "a", "logprobs": 0}, '"logprobs": not served'),
        (TEXT, {"prompt": "a", "n": 3}, '"n": only 1'),
    ],
)
def test_refusals_name_the_field(route: Generation, body: dict[str, Any], message: str) -> None:
    with pytest.raises(UnsupportedRequestError, match=message.replace("[", r"\[").replace("]", r"\]")):
        route.request(body, find)


@pytest.mark.parametrize(
    ("route", "body", "message"),
    [
        (CHAT, {}, "messages is required"),
        (CHAT, {"messages": []}, '"messages" must have at least 1'),
        (CHAT, {"messages": [{"role": "tool", "content": "x"}]}, "\"messages\\[0\\].role\" is 'tool'; valid: system"),
        (CHAT, {"messages": [{"role": "user"}]}, "messages\\[0\\].content is required"),
        (CHAT, {"messages": USER, "max_tokens": 0}, '"max_tokens" must be at least 1'),
        (CHAT, {"messages": USER, "stop": ["a", "b", "c", "d", "e"]}, '"stop"'),
        (CHAT, {"messages": USER, "stream": "yes"}, '"stream"'),
        (CHAT, {"messages": USER, "response_format": {"type": "xml"}}, '"response_format.type"'),
        (CHAT, {"messages": USER, "top_k": -2}, '"top_k"'),
        (TEXT, {"prompt": {"a": 1}}, '"prompt" must be'),
        (TEXT, {}, "prompt is required"),
    ],
)
def test_structure_is_the_schema(route: Generation, body: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        route.request(body, find)


def test_answers_are_openais_objects() -> None:
    answer = {"text": "hello", "finish_reason": "length", "usage": USAGE, "model": "m@1"}
    chat = CHAT.response(answer, {"messages": USER})
    assert isinstance(chat, dict) and chat["id"].startswith("chatcmpl-") and isinstance(chat["created"], int)
    assert {k: v for k, v in chat.items() if k not in ("id", "created")} == {
        "object": "chat.completion",
        "model": "m@1",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hello"},
                "logprobs": None,
                "finish_reason": "length",
            }
        ],
        "usage": USAGE,
    }
    valid("ChatCompletionResponse", chat)
    text = TEXT.response(answer, {"prompt": "x"})
    assert isinstance(text, dict) and text["id"].startswith("cmpl-") and text["object"] == "text_completion"
    assert text["choices"] == [{"index": 0, "text": "hello", "logprobs": None, "finish_reason": "length"}]
    valid("CompletionResponse", text)


def test_chat_chunks_open_with_the_role_and_end_with_the_finish_reason_and_usage() -> None:
    chunks = list(CHAT.pieces(pieces("He", "llo"), {"stream_options": {"include_usage": True}}, "m@1"))
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
    assert chunks[0]["id"].startswith("chatcmpl-")
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and {c["model"] for c in chunks} == {"m@1"}
    assert [c["choices"] for c in chunks] == [
        [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}],
        [{"index": 0, "delta": {"content": "He"}, "logprobs": None, "finish_reason": None}],
        [{"index": 0, "delta": {"content": "llo"}, "logprobs": None, "finish_reason": None}],
        [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
        [],
    ]
    assert [c["usage"] for c in chunks] == [None, None, None, None, USAGE]
    for chunk in chunks:
        valid("ChatCompletionChunk", chunk)


def test_without_include_usage_no_usage_chunk() -> None:
    chunks = list(CHAT.pieces(pieces("a"), {"stream": True}, "m@1"))
    assert len(chunks) == 3 and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in c for c in chunks)


def test_completion_chunks() -> None:
    chunks = list(TEXT.pieces(pieces("a", " b", finish="length"), {"stream_options": {"include_usage": True}}, "m"))
    assert [c["choices"] for c in chunks] == [
        [{"index": 0, "text": "a", "logprobs": None, "finish_reason": None}],
        [{"index": 0, "text": " b", "logprobs": None, "finish_reason": None}],
        [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}],
        [],
    ]
    assert chunks[0]["id"].startswith("cmpl-") and chunks[-1]["usage"] == USAGE
    for chunk in chunks:
        valid("CompletionChunk", chunk)


def test_no_chunk_before_the_tasks_first_piece_and_closing_the_chunks_closes_the_pieces() -> None:
    made: list[str] = []

    def failing() -> Iterator[dict[str, Any]]:
        made.append("started")
        raise InvalidInputError("bad request")
        yield {}

    chunks = CHAT.pieces(failing(), {}, "m")
    with pytest.raises(InvalidInputError):  # the role chunk waits for the first piece: the error comes first
        next(chunks)
    closed: list[bool] = []

    def endless() -> Iterator[dict[str, Any]]:
        try:
            while True:
                yield {"text": "x", "token_ids": [1]}
        finally:
            closed.append(True)

    stream = CHAT.pieces(endless(), {}, "m")
    assert next(stream)["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    next(stream)
    stream.close()
    assert closed == [True]


def test_the_model_list() -> None:
    listed = model_list([("a@2", "generate"), ("b@1", None), ("a@1", None)], 1700000000)
    assert listed == {
        "object": "list",
        "data": [
            {
                "id": "a",
                "object": "model",
                "created": 1700000000,
                "owned_by": "warmstart",
                "key": "a@2",
                "task": "generate",
            },
            {"id": "b", "object": "model", "created": 1700000000, "owned_by": "warmstart", "key": "b@1", "task": None},
        ],
    }
    valid("ModelList", listed)
