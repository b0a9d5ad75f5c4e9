"""Compatible APIs: OpenAI's, Cohere's / Jina's rerank and text-embeddings-inference's request and answer
shapes, mapped onto the tasks.

Each route is two pure functions around the native task: `request` turns the client's body into a native
request (validating what only that API has), `response` turns the native answer into the client's shape.
The vectors themselves are passed through untouched, so they are the native route's, byte for byte. Used
by the HTTP host (by path) and by Lambda HTTP events (Function URL, API Gateway) whose path names a route,
except `/embed`: on Lambda that path has always been the native route (the repo's events use it), so it
keeps the native answer there.

| path | API | task | native request |
|---|---|---|---|
| `POST /v1/embeddings` | OpenAI | embedding | `{"inputs", "dimensions"?, "encoding_format"?, "model"?}` |
| `POST /embed` | TEI | embedding | `{"inputs", "dimensions"?, "prompt_name"?}` |
| `POST /rerank` | TEI | rerank | `{"query", "documents", "return_documents"}` |
| `POST /v1/rerank`, `/v2/rerank` | Cohere, Jina | rerank | `{"query", "documents", "top_n"?, "return_documents"?}` |
| `POST /predict` | TEI | classify | `{"inputs"}` |

`dimensions` (truncate, then renormalize) and `encoding_format: base64` (little-endian float32) are applied
here when the task did not apply them itself, so the answer is the same whichever does.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from handler.core.errors import InvalidInputError, UnsupportedRequestError
from handler.core.types import JSON
from handler.tasks.text import encoding_format as _encoding_format
from handler.tasks.text import flag as _flag

Find = Callable[[str], str | None]  # a model name → the key this instance serves it under, or None


class Route(Protocol):
    @property
    def path(self) -> str: ...

    @property
    def task(self) -> str | None:
        """The task the model must have (None: any)."""
        ...

    def request(self, payload: JSON, find: Find) -> JSON: ...

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        """The native answer in this API's shape; `original` is the client's request as it came (checked)."""
        ...


def _object(payload: JSON, required: str) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise InvalidInputError(f'request must be a JSON object with "{required}", got {type(payload).__name__}')
    if required not in payload:
        raise InvalidInputError(f'request has no "{required}" field')
    return payload


def _texts(value: Any, field: str) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts:
        raise InvalidInputError(f'"{field}" must be a string or a non-empty list of strings')
    for i, text in enumerate(texts):
        if isinstance(text, list | int):
            raise UnsupportedRequestError(f"{field}[{i}]: token ids and text pairs are not taken here; send text")
        if not isinstance(text, str):
            raise InvalidInputError(f"{field}[{i}] must be a string, got {type(text).__name__}")
    return texts


def _dimensions(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f'"dimensions" must be a positive integer, got {value!r}')
    return value


def shape_vectors(vectors: list[Any], dimensions: int | None, encoding: str) -> list[Any]:
    """Apply `dimensions` and `encoding_format` to vectors the task returned as floats; a vector the task
    already shaped (a base64 string, or no longer than `dimensions`) is passed through as it is."""
    out: list[Any] = []
    for vector in vectors:
        if isinstance(vector, str):  # the task encoded it already
            out.append(vector)
            continue
        if dimensions is not None and len(vector) < dimensions:
            raise InvalidInputError(f'"dimensions" is {dimensions}; this model\'s vectors have {len(vector)}')
        if dimensions is not None and len(vector) > dimensions:
            cut = np.asarray(vector[:dimensions], dtype=np.float32)
            norm = float(np.linalg.norm(cut))
            vector = (cut / norm if norm > 0 else cut).astype(np.float32).tolist()
        if encoding == "base64":
            out.append(base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii"))
        else:
            out.append(vector)
    return out


class Native:
    path = "/invocations"
    task: str | None = None

    def request(self, payload: JSON, find: Find) -> JSON:
        return payload

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        return body


class OpenAIEmbeddings:
    """`POST /v1/embeddings`: `{"input", "model"?, "encoding_format"?, "dimensions"?, "user"?}` →
    `{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}`.

    `"model"` names a model this instance serves (`id` or `id@version`) or, as OpenAI clients always send
    one, anything else, which means the default model: it never collides with our routing field."""

    path = "/v1/embeddings"
    task = "embedding"

    def request(self, payload: JSON, find: Find) -> JSON:
        body = _object(payload, "input")
        encoding = _encoding_format(body)  # null: float; any other value outside float | base64 is refused
        native: dict[str, Any] = {"inputs": _texts(body["input"], "input")}
        dimensions = _dimensions(body.get("dimensions"))
        if dimensions is not None:
            native["dimensions"] = dimensions
        if encoding == "base64":
            native["encoding_format"] = "base64"
        return {**native, **_model(body, find)}

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        assert isinstance(original, dict)
        encoding = _encoding_format(original)
        vectors = shape_vectors(body["embeddings"], original.get("dimensions"), encoding)
        tokens = int((body.get("usage") or {}).get("tokens", 0))
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
            "model": body.get("model"),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }


class TeiEmbed:
    """`POST /embed`: `{"inputs", "normalize"?, "truncate"?, "prompt_name"?, "dimensions"?}` → `[[...], ...]`.
    Inputs longer than the model's window are always truncated (as sentence-transformers does)."""

    path = "/embed"
    task = "embedding"

    def request(self, payload: JSON, find: Find) -> JSON:
        body = _object(payload, "inputs")
        if not _flag(body, "normalize", True):
            raise UnsupportedRequestError('"normalize": false is not served: this model\'s vectors are normalized')
        if body.get("truncation_direction", "Right") not in ("Right", "right"):
            raise UnsupportedRequestError('"truncation_direction": only "Right" (the end of a text is dropped)')
        _flag(body, "truncate", False)
        native: dict[str, Any] = {"inputs": _texts(body["inputs"], "inputs")}
        dimensions = _dimensions(body.get("dimensions"))
        if dimensions is not None:
            native["dimensions"] = dimensions
        if body.get("prompt_name") is not None:
            native["prompt_name"] = body["prompt_name"]
        return native

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        assert isinstance(original, dict)
        return shape_vectors(body["embeddings"], original.get("dimensions"), "float")


class TeiRerank:
    """`POST /rerank`: `{"query", "texts", "return_text"?, "raw_scores"?, "truncate"?}` →
    `[{"index", "score", "text"?}, ...]`, highest score first."""

    path = "/rerank"
    task = "rerank"

    def request(self, payload: JSON, find: Find) -> JSON:
        body = _object(payload, "texts")
        if not isinstance(body.get("query"), str):
            raise InvalidInputError('"query" must be a string')
        if _flag(body, "raw_scores", False):
            raise UnsupportedRequestError('"raw_scores": true is not served: scores are the model\'s activated ones')
        _flag(body, "truncate", False)
        texts = _texts(body["texts"], "texts")
        return {"query": body["query"], "documents": texts, "return_documents": _flag(body, "return_text", False)}

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        assert isinstance(original, dict)
        texts = _texts(original["texts"], "texts")
        return_text = _flag(original, "return_text", False)
        out = []
        for result in body["results"]:
            item: dict[str, Any] = {"index": result["index"], "score": result["relevance_score"]}
            if return_text:
                item["text"] = texts[result["index"]]
            out.append(item)
        return out


def _model(body: dict[str, Any], find: Find) -> dict[str, str]:
    """The native routing field for a client's `"model"`: a model this instance serves (`id` or `id@version`),
    else nothing (clients always send one; an unknown name means the default model)."""
    name = body.get("model")
    if isinstance(name, str) and name:
        key = find(name.split("@", 1)[0])
        if key is not None:
            return {"model": name if "@" in name else key}
    return {}


class Rerank:
    """`POST /v1/rerank` (Jina, vLLM, Cohere v1) and `/v2/rerank` (Cohere v2): `{"query", "documents": ["..." |
    {"text"}], "top_n"?, "return_documents"?, "model"?}` → `{"model", "results": [{"index", "relevance_score",
    "document"?: {"text"}}], "usage": {"total_tokens"}}`, highest score first: the native answer's own shape."""

    task = "rerank"

    def __init__(self, path: str) -> None:
        self.path = path

    def request(self, payload: JSON, find: Find) -> JSON:
        body = _object(payload, "documents")
        if not isinstance(body.get("query"), str):
            raise InvalidInputError('"query" must be a string')
        if body.get("max_tokens_per_doc") is not None or body.get("rank_fields") is not None:
            raise UnsupportedRequestError(
                '"max_tokens_per_doc" and "rank_fields" are not served: documents are truncated at the model\'s '
                'own limit, and are text (or {"text"} objects)'
            )
        native: dict[str, Any] = {"query": body["query"], "documents": body["documents"]}
        if body.get("top_n") is not None:
            native["top_n"] = body["top_n"]
        native["return_documents"] = _flag(body, "return_documents", False)
        return {**native, **_model(body, find)}

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        tokens = int((body.get("usage") or {}).get("tokens", 0))
        return {"model": body.get("model"), "results": body["results"], "usage": {"total_tokens": tokens}}


class TeiPredict:
    """`POST /predict`: `{"inputs": "text" | ["text", ...], "raw_scores"?, "truncate"?}` →
    `[{"label", "score"}, ...]` for one text, `[[...], ...]` for a list. Text pairs are not taken: a list
    of two strings is two texts here (TEI would read it as one pair)."""

    path = "/predict"
    task = "classify"

    def request(self, payload: JSON, find: Find) -> JSON:
        body = _object(payload, "inputs")
        if _flag(body, "raw_scores", False):
            raise UnsupportedRequestError('"raw_scores": true is not served: scores are probabilities')
        _flag(body, "truncate", False)
        return {"inputs": _texts(body["inputs"], "inputs")}

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        assert isinstance(original, dict)
        predictions: list[Any] = body["predictions"]
        return predictions[0] if isinstance(original["inputs"], str) else predictions


NATIVE = Native()
ROUTES: dict[str, Route] = {
    r.path: r
    for r in (
        NATIVE,
        OpenAIEmbeddings(),
        TeiEmbed(),
        TeiRerank(),
        TeiPredict(),
        Rerank("/v1/rerank"),
        Rerank("/v2/rerank"),
    )
}
# Lambda HTTP events reach the native task on any path (as before); only these paths are mapped. `/embed`
# is not: it was the native route's path on Lambda before TEI's routes existed.
LAMBDA_PATHS = frozenset(p for p in ROUTES if p not in (NATIVE.path, TeiEmbed.path))
