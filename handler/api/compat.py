"""Compatible APIs: OpenAI's, Cohere's / Jina's rerank and text-embeddings-inference's request and answer
shapes, mapped onto the tasks.

Each route is pure functions around the native task: `request` checks the client's body against its schema
(`handler.api.schemas`, which `GET /openapi.json` is written from) and turns it into a native request,
`response` turns the native answer into the client's shape, and `run` calls the model's task (a route that
is not inference, such as `/tokenize`, calls the task's tokenizer instead). The vectors themselves are
passed through untouched, so they are the native route's, byte for byte. Used by the HTTP host (by path)
and by Lambda HTTP events (Function URL, API Gateway) whose path names a route, except `/embed` and `/`: on
Lambda those paths have always been the native route (the repo's events use them), so they keep the native
answer there.

| path | API | task | native request |
|---|---|---|---|
| `POST /v1/embeddings` | OpenAI | embedding | `{"inputs", "dimensions"?, "encoding_format"?, "model"?}` |
| `POST /embed` | TEI | embedding | `{"inputs", "dimensions"?, "prompt_name"?, "model"?}` |
| `POST /similarity` | TEI | embedding | `{"inputs": [source, *sentences], "prompt_name"?, "model"?}` |
| `POST /rerank` | TEI | rerank | `{"query", "documents", "return_documents", "model"?}` |
| `POST /v1/rerank`, `/v2/rerank` | Cohere, Jina | rerank | `{"query", "documents", "top_n"?, "return_documents"?}` |
| `POST /predict` | TEI | classify | `{"inputs", "top_k"?, "model"?}` |
| `POST /tokenize`, `/decode` | TEI | any text model | its tokenizer |
| `POST /` | TEI | the model's | `/embed` (or `/similarity`), `/rerank` or `/predict`, by the model's task |

`dimensions` (truncate, then renormalize) and `encoding_format: base64` (little-endian float32) are applied
here when the task did not apply them itself, so the answer is the same whichever does.

About one thing (the table above: one small class per route, each its API's request and answer mapping, read
side by side), hence its length.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from handler.api.media import JSON_TYPE, NPY_TYPE, Kind, NotAcceptableError, dump_npy, npy_answer, npy_vectors
from handler.core.errors import InvalidInputError, UnsupportedRequestError
from handler.core.types import JSON
from handler.tasks.text import encoding_format as _encoding_format
from handler.tasks.text import flag as _flag


def _check(body: Any, schema: str) -> Any:
    """`handler.api.schemas.check`, imported on first use: the schemas are ~0.8 ms of import that a Lambda
    function serving only native requests never needs (the HTTP host imports them at startup anyway)."""
    from handler.api import schemas

    return schemas.check(body, schema)


Find = Callable[[str], str | None]  # a model name → the key this instance serves it under, or None
LANGCHAIN_HINT = "LangChain's OpenAIEmbeddings sends token ids unless it is made with check_embedding_ctx_length=False"


class Route(Protocol):
    @property
    def path(self) -> str: ...

    @property
    def task(self) -> str | None:
        """The task the model must have (None: any)."""
        ...

    @property
    def schema(self) -> str:
        """The request's schema in `handler.api.schemas` (validated by `request`)."""
        ...

    @property
    def answer(self) -> str:
        """The 200 answer's schema in `handler.api.schemas`."""
        ...

    @property
    def summary(self) -> str: ...

    @property
    def media(self) -> tuple[Kind, ...]:
        """The media kinds this route answers in, preferred first (`handler.api.media.response_kind`)."""
        ...

    def request(self, payload: JSON, find: Find) -> JSON: ...

    def run(self, task: Any, native: JSON) -> dict[str, Any]:
        """The answer to a native request from the model's task object (inference: `task(native)`)."""
        ...

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        """The native answer in this API's shape; `original` is the client's request as it came (checked)."""
        ...

    def npy(self, body: dict[str, Any], original: JSON) -> bytes:
        """The answer as one .npy array, for a route whose `media` has it (else 406)."""
        ...


class Base:
    """What every route shares: inference runs the task; the answer is the native one unless overridden."""

    path = ""
    task: str | None = None
    schema = ""  # the request's schema in `handler.api.schemas`
    answer = ""  # the 200 answer's schema
    summary = ""
    media: tuple[Kind, ...] = ("json",)

    def request(self, payload: JSON, find: Find) -> JSON:
        return payload

    def run(self, task: Any, native: JSON) -> dict[str, Any]:
        answer: dict[str, Any] = task(native)
        return answer

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        return body

    def npy(self, body: dict[str, Any], original: JSON) -> bytes:
        # Reached through `POST /` picking a JSON-only route (the headers were checked against `/`'s media).
        raise NotAcceptableError(f"POST {self.path} answers {JSON_TYPE} only ({NPY_TYPE}: routes answering arrays)")


def _object(payload: JSON, required: str) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise InvalidInputError(f'request must be a JSON object with "{required}", got {type(payload).__name__}')
    if required not in payload:
        raise InvalidInputError(f'request has no "{required}" field')
    return payload


def _refuse_token_ids(value: Any, field: str, hint: str = "") -> None:
    """Token ids (a list of ints, or lists of them) and text pairs are recognised, and refused with what to send."""
    texts = value if isinstance(value, list) else [value]
    for i, text in enumerate(texts):
        if isinstance(text, list | int) and not isinstance(text, bool):
            raise UnsupportedRequestError(
                f"{field}[{i}]: token ids and text pairs are not taken here; send text" + (f" ({hint})" if hint else "")
            )


def _texts(value: Any, field: str) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts:
        raise InvalidInputError(f'"{field}" must be a string or a non-empty list of strings')
    _refuse_token_ids(texts, field)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInputError(f"{field}[{i}] must be a string, got {type(text).__name__}")
    return texts


def _dimensions(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f'"dimensions" must be a positive integer, got {value!r}')
    return value


def _tei_options(body: dict[str, Any]) -> None:
    """TEI's `truncate` / `truncation_direction`: long texts always lose their end here."""
    if body.get("truncation_direction") not in (None, "Right", "right"):
        raise UnsupportedRequestError('"truncation_direction": only "Right" (the end of a text is dropped)')
    _flag(body, "truncate", False)


def model_field(body: Any, find: Find) -> dict[str, str]:
    """The native routing field for a client's `"model"`: a model this instance serves (`id` or `id@version`),
    else nothing (clients always send one; an unknown name means the default model)."""
    name = body.get("model") if isinstance(body, dict) else None
    if isinstance(name, str) and name:
        key = find(name.split("@", 1)[0])
        if key is not None:
            return {"model": name if "@" in name else key}
    return {}


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
            vector = (cut / norm if norm > 0 else cut).astype(np.float32)  # float32: the edge writes it
        if encoding == "base64":
            out.append(base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii"))
        else:
            out.append(vector)
    return out


class Native(Base):
    path = "/invocations"
    schema = "NativeRequest"
    answer = "NativeResponse"
    summary = "The native request and answer of the served model's task (SageMaker's inference route)"
    media: tuple[Kind, ...] = ("json", "npy")

    def npy(self, body: dict[str, Any], original: JSON) -> bytes:
        return npy_answer(body)  # an embedding model's vectors, a tensor model's one output; else 406


class OpenAIEmbeddings(Base):
    """`POST /v1/embeddings`: `{"input", "model"?, "encoding_format"?, "dimensions"?, "user"?}` →
    `{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}`.

    `"model"` names a model this instance serves (`id` or `id@version`) or, as OpenAI clients always send
    one, anything else, which means the default model: it never collides with our routing field."""

    path = "/v1/embeddings"
    task = "embedding"
    schema = "OpenAIEmbeddingsRequest"
    answer = "OpenAIEmbeddingsResponse"
    summary = "OpenAI's embeddings API"
    media: tuple[Kind, ...] = ("json", "npy")

    def request(self, payload: JSON, find: Find) -> JSON:
        body = _object(payload, "input")
        _refuse_token_ids(body["input"], "input", LANGCHAIN_HINT)
        _check(body, self.schema)
        encoding = _encoding_format(body)  # null: float
        native: dict[str, Any] = {"inputs": _texts(body["input"], "input")}
        dimensions = _dimensions(body.get("dimensions"))
        if dimensions is not None:
            native["dimensions"] = dimensions
        if encoding == "base64":
            native["encoding_format"] = "base64"
        return {**native, **model_field(body, find)}

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

    def npy(self, body: dict[str, Any], original: JSON) -> bytes:
        assert isinstance(original, dict)
        return npy_vectors(shape_vectors(body["embeddings"], original.get("dimensions"), "float"))


class TeiEmbed(Base):
    """`POST /embed`: `{"inputs", "normalize"?, "truncate"?, "prompt_name"?, "dimensions"?, "model"?}` →
    `[[...], ...]`. Inputs longer than the model's window are always truncated (as sentence-transformers does)."""

    path = "/embed"
    task = "embedding"
    schema = "EmbedRequest"
    answer = "EmbedResponse"
    summary = "text-embeddings-inference's embeddings"
    media: tuple[Kind, ...] = ("json", "npy")

    def request(self, payload: JSON, find: Find) -> JSON:
        body = _object(payload, "inputs")
        _refuse_token_ids(body["inputs"], "inputs")
        if not _flag(body, "normalize", True):
            raise UnsupportedRequestError('"normalize": false is not served: this model\'s vectors are normalized')
        _tei_options(body)
        _check(body, self.schema)
        native: dict[str, Any] = {"inputs": _texts(body["inputs"], "inputs")}
        dimensions = _dimensions(body.get("dimensions"))
        if dimensions is not None:
            native["dimensions"] = dimensions
        if body.get("prompt_name") is not None:
            native["prompt_name"] = body["prompt_name"]
        return {**native, **model_field(body, find)}

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        assert isinstance(original, dict)
        return shape_vectors(body["embeddings"], original.get("dimensions"), "float")

    def npy(self, body: dict[str, Any], original: JSON) -> bytes:
        assert isinstance(original, dict)
        return npy_vectors(shape_vectors(body["embeddings"], original.get("dimensions"), "float"))


class TeiSimilarity(Base):
    """`POST /similarity`: `{"inputs": {"source_sentence", "sentences"}, "parameters"?: {"prompt_name"?,
    "truncate"?, "truncation_direction"?}}` → `[cosine, ...]`, one per sentence (InferenceClient's
    `sentence_similarity` and the Inference API's shape)."""

    path = "/similarity"
    task = "embedding"
    schema = "SimilarityRequest"
    answer = "SimilarityResponse"
    summary = "text-embeddings-inference's sentence similarity: cosine of each sentence's vector with the source's"
    media: tuple[Kind, ...] = ("json", "npy")

    def request(self, payload: JSON, find: Find) -> JSON:
        body = _object(payload, "inputs")
        parameters = body.get("parameters")
        if isinstance(parameters, dict):
            _tei_options(parameters)
        _check(body, self.schema)
        inputs = body["inputs"]
        native: dict[str, Any] = {"inputs": [inputs["source_sentence"], *inputs["sentences"]]}
        if isinstance(parameters, dict) and parameters.get("prompt_name") is not None:
            native["prompt_name"] = parameters["prompt_name"]
        return {**native, **model_field(body, find)}

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        return self.scores(body)  # float32, written at its shortest by the edge's encoder

    def npy(self, body: dict[str, Any], original: JSON) -> bytes:
        return dump_npy(self.scores(body))  # the route's answer, the scores: not the vectors behind them

    @staticmethod
    def scores(body: dict[str, Any]) -> np.ndarray[Any, Any]:
        vectors = np.asarray(body["embeddings"], dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1)
        norms[norms == 0] = 1.0
        unit = vectors / norms[:, None]
        scores: np.ndarray[Any, Any] = (unit[1:] @ unit[0]).astype(np.float32)
        return scores


class TeiRerank(Base):
    """`POST /rerank`: `{"query", "texts", "return_text"?, "raw_scores"?, "truncate"?, "model"?}` →
    `[{"index", "score", "text"?}, ...]`, highest score first."""

    path = "/rerank"
    task = "rerank"
    schema = "RerankRequest"
    answer = "RerankResponse"
    summary = "text-embeddings-inference's rerank"

    def request(self, payload: JSON, find: Find) -> JSON:
        body = _object(payload, "texts")
        if not isinstance(body.get("query"), str):
            raise InvalidInputError('"query" must be a string')
        if _flag(body, "raw_scores", False):
            raise UnsupportedRequestError('"raw_scores": true is not served: scores are the model\'s activated ones')
        _tei_options(body)
        _check(body, self.schema)
        texts = _texts(body["texts"], "texts")
        native = {"query": body["query"], "documents": texts, "return_documents": _flag(body, "return_text", False)}
        return {**native, **model_field(body, find)}

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


class Rerank(Base):
    """`POST /v1/rerank` (Jina, vLLM, Cohere v1) and `/v2/rerank` (Cohere v2): `{"query", "documents": ["..." |
    {"text"}], "top_n"?, "return_documents"?, "model"?}` → `{"model", "results": [{"index", "relevance_score",
    "document"?: {"text"}}], "usage": {"total_tokens"}}`, highest score first: the native answer's own shape."""

    task = "rerank"
    schema = "CohereRerankRequest"
    answer = "CohereRerankResponse"

    def __init__(self, path: str) -> None:
        self.path = path
        self.summary = f"the rerank API Cohere ({path[1:3]}), Jina and vLLM share"

    def request(self, payload: JSON, find: Find) -> JSON:
        body = _object(payload, "documents")
        if not isinstance(body.get("query"), str):
            raise InvalidInputError('"query" must be a string')
        if body.get("max_tokens_per_doc") is not None or body.get("rank_fields") is not None:
            raise UnsupportedRequestError(
                '"max_tokens_per_doc" and "rank_fields" are not served: documents are truncated at the model\'s '
                'own limit, and are text (or {"text"} objects)'
            )
        _check(body, self.schema)
        native: dict[str, Any] = {"query": body["query"], "documents": body["documents"]}
        if body.get("top_n") is not None:
            native["top_n"] = body["top_n"]
        native["return_documents"] = _flag(body, "return_documents", False)
        return {**native, **model_field(body, find)}

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        tokens = int((body.get("usage") or {}).get("tokens", 0))
        return {"model": body.get("model"), "results": body["results"], "usage": {"total_tokens": tokens}}


class TeiPredict(Base):
    """`POST /predict`: `{"inputs": "text" | ["text", ...], "raw_scores"?, "truncate"?, "parameters"?,
    "model"?}` → `[{"label", "score"}, ...]` for one text, `[[...], ...]` for a list. Text pairs are not
    taken: a list of two strings is two texts here (TEI would read it as one pair).

    `"parameters"` (`top_k`, `function_to_apply`) is the Inference API's, which `InferenceClient.
    text_classification` sends: a request with it is answered in that API's shape, a list per text, one text
    included (TEI ignores the field and answers one list, which that client reads as its first label only)."""

    path = "/predict"
    task = "classify"
    schema = "PredictRequest"
    answer = "PredictResponse"
    summary = "text-embeddings-inference's classification (and the Inference API's, with `parameters`)"

    def request(self, payload: JSON, find: Find) -> JSON:
        body = _object(payload, "inputs")
        _refuse_token_ids(body["inputs"] if isinstance(body["inputs"], list) else [], "inputs")
        if _flag(body, "raw_scores", False):
            raise UnsupportedRequestError('"raw_scores": true is not served: scores are probabilities')
        _tei_options(body)
        _check(body, self.schema)
        native: dict[str, Any] = {"inputs": _texts(body["inputs"], "inputs")}
        parameters = body.get("parameters") or {}
        if parameters.get("top_k") is not None:
            native["top_k"] = parameters["top_k"]
        if parameters.get("function_to_apply") is not None:
            native["function_to_apply"] = parameters["function_to_apply"]
        return {**native, **model_field(body, find)}

    def run(self, task: Any, native: JSON) -> dict[str, Any]:
        assert isinstance(native, dict)
        wanted = native.pop("function_to_apply", None)
        own = "sigmoid" if getattr(task, "multi_label", False) else "softmax"
        if wanted is not None and wanted != own:
            raise UnsupportedRequestError(
                f'"function_to_apply": {wanted!r} is not served; this model\'s scores are its {own}'
            )
        return super().run(task, native)

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        assert isinstance(original, dict)
        predictions: list[Any] = body["predictions"]
        one = isinstance(original["inputs"], str) and original.get("parameters") is None
        return predictions[0] if one else predictions


def _encoder(task: Any) -> Any:
    """The model's tokenizer (`tokenizers.Tokenizer`), or a 400 for a model without one."""
    encoder = getattr(task, "encoder", None)
    if encoder is None:
        raise UnsupportedRequestError(f"this route needs a text model; {task.model} is {task.name}")
    return encoder._tok


class TeiTokenize(Base):
    """`POST /tokenize`: `{"inputs", "add_special_tokens"?, "prompt_name"?}` → per text, its tokens
    `[{"id", "text", "special", "start", "stop"}]` as the model sees them (truncated at its length). `start` and
    `stop` are character offsets into the text (null for special tokens), `text` that slice of it."""

    path = "/tokenize"
    schema = "TokenizeRequest"
    answer = "TokenizeResponse"
    summary = "text-embeddings-inference's tokenize: the tokens the model sees"

    def request(self, payload: JSON, find: Find) -> JSON:
        body = _object(payload, "inputs")
        _refuse_token_ids(body["inputs"], "inputs")
        _check(body, self.schema)
        native: dict[str, Any] = {
            "inputs": _texts(body["inputs"], "inputs"),
            "add_special_tokens": _flag(body, "add_special_tokens", True),
        }
        if body.get("prompt_name") is not None:
            native["prompt_name"] = body["prompt_name"]
        return {**native, **model_field(body, find)}

    def run(self, task: Any, native: JSON) -> dict[str, Any]:
        from handler.tasks.text import check_texts, prompt_for

        assert isinstance(native, dict)
        tok = _encoder(task)
        texts = check_texts(native["inputs"], "inputs", task.max_inputs, task.max_chars)
        # The prompt the embedding task would put in front (prompt_name's, or the model's default).
        prompt = prompt_for(native, getattr(task, "prompts", None) or {}, getattr(task, "default_prompt", None))
        out = []
        for text in texts:
            # One at a time: the shared tokenizer pads a batch to its longest.
            full = prompt + text
            encoding = tok.encode(full, add_special_tokens=native["add_special_tokens"])
            tokens = []
            for token_id, token, (start, stop), special in zip(
                encoding.ids, encoding.tokens, encoding.offsets, encoding.special_tokens_mask, strict=True
            ):
                if special:
                    tokens.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
                else:
                    tokens.append(
                        {"id": token_id, "text": full[start:stop], "special": False, "start": start, "stop": stop}
                    )
            out.append(tokens)
        return {"tokens": out, "model": task.model}

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        tokens: list[Any] = body["tokens"]
        return tokens


class TeiDecode(Base):
    """`POST /decode`: `{"ids": [id, ...] | [[id, ...], ...], "skip_special_tokens"?}` → `["text", ...]`."""

    path = "/decode"
    schema = "DecodeRequest"
    answer = "DecodeResponse"
    summary = "text-embeddings-inference's decode: token ids back to text"

    def request(self, payload: JSON, find: Find) -> JSON:
        body = _check(_object(payload, "ids"), self.schema)
        ids = body["ids"]
        batch = ids if ids and isinstance(ids[0], list) else [ids]
        native = {"ids": batch, "skip_special_tokens": _flag(body, "skip_special_tokens", True)}
        return {**native, **model_field(body, find)}

    def run(self, task: Any, native: JSON) -> dict[str, Any]:
        assert isinstance(native, dict)
        tok = _encoder(task)
        if len(native["ids"]) > task.max_inputs:
            raise InvalidInputError(f"{len(native['ids'])} id lists; at most {task.max_inputs} (WARMSTART_MAX_INPUTS)")
        size = tok.get_vocab_size(with_added_tokens=True)
        for i, ids in enumerate(native["ids"]):
            bad = next((x for x in ids if x >= size), None)
            if bad is not None:
                raise InvalidInputError(f"ids[{i}]: {bad} is not a token id of this model (0 to {size - 1})")
        texts: list[str] = tok.decode_batch(native["ids"], skip_special_tokens=native["skip_special_tokens"])
        return {"texts": texts, "model": task.model}

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        texts: list[Any] = body["texts"]
        return texts


class Root(Base):
    """`POST /`: text-embeddings-inference's default route, answered as the model's task's own route answers:
    an embedding model as `/embed` (or `/similarity` for `{"inputs": {"source_sentence", "sentences"}}`, as
    TEI does with `TASK=sentence-similarity`), a reranker as `/rerank`, a classifier as `/predict`."""

    path = "/"
    schema = "RootRequest"
    answer = "RootResponse"
    summary = "text-embeddings-inference's default route: the model's task's route (embed, similarity, rerank, predict)"
    media: tuple[Kind, ...] = ("json", "npy")  # the route it picks says, for the model's task (`npy`)

    def pick(self, payload: JSON, task: str) -> Route:
        if task == "embedding":
            inputs = payload.get("inputs") if isinstance(payload, dict) else None
            return ROUTES["/similarity"] if isinstance(inputs, dict) else ROUTES["/embed"]
        by_task = {"rerank": "/rerank", "classify": "/predict"}
        if task not in by_task:
            raise UnsupportedRequestError(f"POST / serves embedding, rerank and classify models; this one is {task}")
        return ROUTES[by_task[task]]


NATIVE = Native()
ROOT = Root()
ROUTES: dict[str, Route] = {
    r.path: r
    for r in (
        NATIVE,
        OpenAIEmbeddings(),
        TeiEmbed(),
        TeiSimilarity(),
        TeiRerank(),
        TeiPredict(),
        TeiTokenize(),
        TeiDecode(),
        Rerank("/v1/rerank"),
        Rerank("/v2/rerank"),
        ROOT,
    )
}
# Lambda HTTP events reach the native task on any path (as before); only these paths are mapped. `/embed`
# and `/` are not: they were the native route's paths on Lambda before TEI's routes existed.
LAMBDA_PATHS = frozenset(p for p in ROUTES if p not in (NATIVE.path, TeiEmbed.path, ROOT.path))
