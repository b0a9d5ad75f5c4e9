"""Compatible routes validate once: each route's refusals (data: `refusals`) first, as UnsupportedRequestError
saying what to send instead, then its schema (structure, InvalidInputError), then nothing more by hand; the
native request is built from what passed. No model is needed: `Route.request` is pure."""

from __future__ import annotations

from typing import Any

import pytest

from handler.api import compat
from handler.api.compat import NATIVE, ROUTES, Base
from handler.api.refusals import Items, OneText, Refuse, TextParts, TokenIds
from handler.core.errors import InvalidInputError, UnsupportedRequestError


def find(name: str) -> str | None:
    return {"served": "served@2"}.get(name)


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/embeddings", {"input": [[101, 102]]}, "input[0]: token ids and text pairs are not taken here"),
        ("/v1/embeddings", {"input": 7}, "check_embedding_ctx_length=False"),  # LangChain's hint
        ("/embed", {"inputs": ["a", [1, 2]]}, "inputs[1]: token ids"),
        ("/embed", {"inputs": "a", "normalize": False}, '"normalize": false is not served'),
        ("/embed", {"inputs": "a", "truncation_direction": "Left"}, '"truncation_direction": only "Right"'),
        ("/embed", {"inputs": "a", "truncation_direction": 5}, '"truncation_direction": only "Right"'),
        (
            "/similarity",
            {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": {"truncation_direction": "left"}},
            '"parameters.truncation_direction": only "Right"',
        ),
        ("/rerank", {"query": "q", "texts": ["a"], "raw_scores": True}, "activated ones"),
        ("/predict", {"inputs": [["a", "b"]]}, "inputs[0]: token ids and text pairs"),
        ("/predict", {"inputs": "a", "raw_scores": True}, "scores are probabilities"),
        ("/tokenize", {"inputs": [3]}, "inputs[0]: token ids"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "max_tokens_per_doc": 10}, '"max_tokens_per_doc": not'),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "rank_fields": ["title"]}, '"rank_fields": not served'),
    ],
)
def test_refusals_say_what_is_not_served(path: str, body: dict[str, Any], message: str) -> None:
    with pytest.raises(UnsupportedRequestError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ROUTES[path].request(body, find)


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/embed", {"inputs": "a", "normalize": 0}, '"normalize"'),  # not false: a type fault, the schema's
        ("/embed", {"inputs": "a", "truncate": "yes"}, '"truncate" must be true or false'),
        ("/predict", {"inputs": 5}, '"inputs" must be'),  # `/predict` reads token ids in lists only
        ("/rerank", {"texts": ["a"]}, "query is required"),
        ("/v1/embeddings", [], "request must be an object"),
        ("/v1/embeddings", {"input": "a", "dimensions": 0}, '"dimensions" must be at least 1'),
        ("/decode", {"ids": [[-1]]}, '"ids" must be a list of an integer'),
    ],
)
def test_structure_is_the_schemas(path: str, body: Any, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        ROUTES[path].request(body, find)


def test_a_valid_body_becomes_the_native_request() -> None:
    openai = {"input": "a", "dimensions": 8, "encoding_format": "base64", "model": "served", "user": "u"}
    assert ROUTES["/v1/embeddings"].request(openai, find) == {
        "inputs": ["a"],
        "dimensions": 8,
        "encoding_format": "base64",
        "model": "served@2",
    }
    predict = {"inputs": "a", "parameters": {"top_k": 2, "function_to_apply": None}, "raw_scores": False}
    assert ROUTES["/predict"].request(predict, find) == {"inputs": ["a"], "top_k": 2}
    similarity = {"inputs": {"source_sentence": "a", "sentences": ["b", "c"]}, "parameters": {"prompt_name": "q"}}
    assert ROUTES["/similarity"].request(similarity, find) == {"inputs": ["a", "b", "c"], "prompt_name": "q"}
    assert ROUTES["/decode"].request({"ids": [1, 2], "model": "other"}, find) == {
        "ids": [[1, 2]],
        "skip_special_tokens": True,
    }
    # The native route passes the body to the task untouched: the task validates its own request.
    assert NATIVE.request({"inputs": 3}, find) == {"inputs": 3}


def test_every_compatible_route_validates_through_the_one_path() -> None:
    """No route checks a body by hand: each declares its refusals and schema and maps a valid body (`native`)."""
    for route in ROUTES.values():
        if route is NATIVE:
            continue
        assert type(route).request is Base.request, f"{route.path} validates by hand"
        assert all(
            isinstance(r, Refuse | TokenIds | TextParts | OneText | Items) for r in getattr(route, "refusals", ())
        )
    assert not hasattr(compat, "_encoder")  # no route reaches into a task's tokenizer


def test_the_root_route_picks_by_the_tasks_own_routes() -> None:
    served = {"m@1": "tensor", "e@1": "embedding", "c@1": "classify"}
    pick = compat.ROOT.pick
    assert pick({"inputs": "a"}, "embedding", "e@1", served).path == "/embed"
    assert (
        pick({"inputs": {"source_sentence": "a", "sentences": ["b"]}}, "embedding", "e@1", served).path == "/similarity"
    )
    assert pick({"query": "q", "texts": ["a"]}, "rerank", "r@1", served).path == "/rerank"
    assert pick({"inputs": "a"}, "classify", "c@1", served).path == "/predict"
    with pytest.raises(
        UnsupportedRequestError, match=r"m@1 is tensor; served here that can: e@1 \(send \"model\": \"e\"\)"
    ):
        pick({"inputs": {}}, "tensor", "m@1", served)
    # The Inference API's text-classification body (`parameters`, `{}` included) is never answered with vectors.
    with pytest.raises(
        UnsupportedRequestError, match="/predict's request; e@1 is embedding; served here that can: c@1"
    ):
        pick({"inputs": "a", "parameters": {}}, "embedding", "e@1", served)
    with pytest.raises(UnsupportedRequestError, match="/rerank's request; e@1 is embedding; no model served here can"):
        pick({"query": "q", "texts": ["a"]}, "embedding", "e@1", served)


def test_a_route_the_task_does_not_serve_names_the_tasks_that_do() -> None:
    ROUTES["/embed"].check("embedding", "m@1")  # served: no error
    with pytest.raises(UnsupportedRequestError, match="POST /predict needs a classify model; m@1 is embedding"):
        ROUTES["/predict"].check("embedding", "m@1")
    with pytest.raises(
        UnsupportedRequestError,
        match="needs a embedding, rerank, classify, image-text, multivector, sparse or hybrid model; m@1 is tensor",
    ):
        ROUTES["/tokenize"].check("tensor", "m@1")
    NATIVE.check("tensor", "m@1")  # every task serves its native request
