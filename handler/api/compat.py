"""Compatible APIs: OpenAI's, Cohere's / Jina's rerank and text-embeddings-inference's request and answer
shapes, mapped onto the tasks.

Each route is pure functions around the native task: `request` validates the client's body once (`validate`:
the route's `refusals`, declared as data, then its schema in `handler.api.schemas`, which `GET /openapi.json` is
written from) and maps what passed to a native request (`native`), whose texts the task alone checks; `response`
turns the native answer into the client's shape, and `run` calls the model's task (a route that is not
inference, such as `/tokenize`, calls the task's public tokenizer methods instead). No route names a task: the
served model's task declares the routes it serves (`TaskSpec.routes`), and `check` reads that. The vectors
themselves are passed through untouched, so they are the native route's, byte for byte. Used by the HTTP host (by path)
and by Lambda HTTP events (Function URL, API Gateway) whose path names a route, except `/embed` and `/`: on
Lambda those paths have always been the native route (the repo's events use them), so they keep the native
answer there.

| path | API | served by (the built-in tasks' `routes`) | native request |
|---|---|---|---|
| `POST /v1/embeddings` | OpenAI | embedding, hybrid | `{"inputs", "dimensions"?, "encoding_format"?, "model"?}` |
| `POST /embeddings` | Infinity | image-text | `{"inputs", "modality"?, "encoding_format"?, "model"?}` |
| `POST /embed` | TEI | embedding, hybrid | `{"inputs", "dimensions"?, "prompt_name"?, "model"?}` |
| `POST /embed_sparse` | TEI | sparse, hybrid | `{"inputs", "sparse_format", "prompt_name"?, "model"?}` |
| `POST /similarity` | TEI | embedding | `{"inputs": [source, *sentences], "prompt_name"?, "model"?}` |
| `POST /rerank` | TEI | rerank | `{"query", "documents", "return_documents", "model"?}` |
| `POST /v1/rerank`, `/v2/rerank` | Cohere, Jina | rerank | `{"query", "documents", "top_n"?, "return_documents"?}` |
| `POST /v2/embed` | Cohere | embedding | `{"inputs", "dimensions"?, "prompt_name"?}` (`input_type`'s prompt) |
| `POST /predict` | TEI | classify | `{"inputs", "top_k"?, "model"?}` |
| `POST /tokenize`, `/decode` | TEI | any text model | its tokenizer |
| `POST /` | TEI | the model's | `/embed` (or `/similarity`), `/rerank` or `/predict`, by the model's task |
| `POST /v1/chat/completions` | OpenAI, vLLM's extras | generate | `{"messages", ...sampling}` |
| `POST /v1/completions` | OpenAI, vLLM's `top_k` | generate | `{"prompt", ...sampling}` |

`dimensions` (truncate, then renormalize) and `encoding_format: base64` (little-endian float32) are applied
here when the task did not apply them itself, so the answer is the same whichever does.

About one thing (the table above: one small class per route, each its API's request and answer mapping, read
side by side), hence its length.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from handler.api.media import JSON_TYPE, NPY_TYPE, Kind, NotAcceptableError, dump_npy, npy_answer, npy_vectors
from handler.api.refusals import Items, OneText, Refusal, Refuse, TextParts, TokenIds, validate
from handler.api.sse import DONE, event
from handler.core.errors import InvalidInputError, UnsupportedRequestError
from handler.core.types import JSON
from handler.tasks import catalog
from handler.tasks.streaming import collect, streams

if TYPE_CHECKING:  # types only: numpy is imported where an embedding answer is shaped (a genai start never)
    import numpy as np

Find = Callable[[str], str | None]  # a model name → the key this instance serves it under, or None
LANGCHAIN_HINT = "LangChain's OpenAIEmbeddings sends token ids unless it is made with check_embedding_ctx_length=False"


# TEI's `truncation_direction`: long texts always lose their end here.
RIGHT_ONLY = Refuse("truncation_direction", 'only "Right" (the end of a text is dropped)', allowed=("Right", "right"))


def _given(body: dict[str, Any], *keys: str) -> dict[str, Any]:
    """The fields among `keys` that the client set (not absent, not null), as they are."""
    return {k: body[k] for k in keys if body.get(k) is not None}


def _on(body: dict[str, Any], key: str, default: Any) -> Any:
    value = body.get(key)
    return default if value is None else value


def _texts(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


# ------------------------------------------------------------------------------------------------- routes


class Route(Protocol):
    @property
    def path(self) -> str: ...

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

    def check(self, task: str, key: str) -> None:
        """UnsupportedRequestError unless a model of `task` (served as `key`) serves this route."""
        ...

    def request(self, payload: JSON, find: Find) -> JSON: ...

    def takes(self, payload: JSON) -> bool: ...

    def run(self, task: Any, native: JSON) -> dict[str, Any]:
        """The answer to a native request from the model's task object (inference: `task(native)`)."""
        ...

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        """The native answer in this API's shape; `original` is the client's request as it came (checked)."""
        ...

    def npy(self, body: dict[str, Any], original: JSON) -> bytes:
        """The answer as one .npy array, for a route whose `media` has it (else 406)."""
        ...


Pieces = Generator[dict[str, Any], None, None]


def chunks(route: Route, pieces: Pieces, original: JSON, model: str) -> Pieces:
    """A stream's pieces as the route streams them: its API's chunks, else the native ones. A route whose stream
    is its API's own (OpenAI's chunks) has `pieces(pieces, original, model) -> chunks` (`model`: the served
    model's key); the stream paths (`Runtime.handle_http_stream`, a Lambda HTTP event's buffered stream) apply
    it. (Looked up, not declared in `Route`: a Protocol class costs Lambda's init time to build.)"""
    mapping = getattr(route, "pieces", None)
    if mapping is None:
        return pieces
    mapped: Pieces = mapping(pieces, original, model)
    return mapped


def event_stream(route: Route, pieces: list[dict[str, Any]], original: JSON, model: str) -> str:
    """A whole stream as one body of server-sent events in the route's chunks, then `[DONE]` (a Lambda HTTP
    event's answer to `"stream": true`: Function URLs in BUFFERED mode, API Gateway)."""
    events = chunks(route, (p for p in pieces), original, model)
    return (b"".join(map(event, events)) + DONE).decode()


class Base:
    """What every route shares: the body validated once (`refusals`, then `schema`) and mapped to the native
    request (`native`); inference runs the task; the answer is the native one unless overridden."""

    path = ""
    schema = ""  # the request's schema in `handler.api.schemas`
    answer = ""  # the 200 answer's schema
    summary = ""
    media: tuple[Kind, ...] = ("json",)
    refusals: tuple[Refusal, ...] = ()

    def check(self, task: str, key: str) -> None:
        # The served model's task says which routes it serves (`TaskSpec.routes`); no route names a task.
        if self.path not in catalog.spec(task).routes:
            names = catalog.having(lambda spec: self.path in spec.routes)
            wanted = (", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)) or "another"
            raise UnsupportedRequestError(f"POST {self.path} needs a {wanted} model; {key} is {task}")

    def request(self, payload: JSON, find: Find) -> JSON:
        body = validate(payload, self.schema, self.refusals)
        return {**self.native(body), **model_field(body, find)}

    def native(self, body: dict[str, Any]) -> dict[str, Any]:
        """The validated body as the native request (the model's routing field is added by `request`)."""
        return body

    def takes(self, payload: JSON) -> bool:
        """Whether `POST /` should answer `payload` as this route (of the routes the model's task serves)."""
        return True

    def run(self, task: Any, native: JSON) -> dict[str, Any]:
        answer: dict[str, Any] = task(native)
        return answer

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        return body

    def npy(self, body: dict[str, Any], original: JSON) -> bytes:
        # Reached through `POST /` picking a JSON-only route (the headers were checked against `/`'s media).
        raise NotAcceptableError(f"POST {self.path} answers {JSON_TYPE} only ({NPY_TYPE}: routes answering arrays)")


def model_field(body: Any, find: Find) -> dict[str, str]:
    """The native routing field for a client's `"model"`: a model this instance serves (`id` or `id@version`),
    else nothing (clients always send one; an unknown name means the default model)."""
    name = body.get("model") if isinstance(body, dict) else None
    if isinstance(name, str) and name:
        key = find(name.split("@", 1)[0])
        if key is not None:
            return {"model": name if "@" in name else key}
    return {}


def served_that_can(able: list[str]) -> str:
    """The end of a refusal for a model of the wrong task: the served models that would answer, and how to
    reach one (the `"model"` field: cohere's, OpenAI's, huggingface_hub's `model=`)."""
    if not able:
        return "; no model served here can"
    return f'; served here that can: {", ".join(able)} (send "model": "{able[0].split("@", 1)[0]}")'


def check_served(check: Callable[[str, str], None], task: str, key: str, served: Callable[[], dict[str, str]]) -> None:
    """A route's `check` of the model `key` (of `task`) a request reached; its refusal names the models this
    instance serves (`served()`: key → task, read only then) whose task the route serves."""
    try:
        check(task, key)
    except UnsupportedRequestError as e:
        able = []
        for other, other_task in served().items():
            try:
                check(other_task, other)
            except UnsupportedRequestError:
                continue
            able.append(other)
        raise UnsupportedRequestError(f"{e}{served_that_can(able)}") from None


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
            import numpy as np  # deferred: see the TYPE_CHECKING import

            cut = np.asarray(vector[:dimensions], dtype=np.float32)
            norm = float(np.linalg.norm(cut))
            vector = (cut / norm if norm > 0 else cut).astype(np.float32)  # float32: the edge writes it
        if encoding == "base64":
            import numpy as np  # deferred: see the TYPE_CHECKING import

            out.append(base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii"))
        else:
            out.append(vector)
    return out


class Vectors(Base):
    """An embedding route answering the vectors themselves: as JSON (`response`) or as one .npy array."""

    media: tuple[Kind, ...] = ("json", "npy")

    def npy(self, body: dict[str, Any], original: JSON) -> bytes:
        assert isinstance(original, dict)
        return npy_vectors(shape_vectors(body["embeddings"], original.get("dimensions"), "float"))


class Native(Base):
    path = "/invocations"
    schema = "NativeRequest"
    answer = "NativeResponse"
    summary = "The native request and answer of the served model's task (SageMaker's inference route)"
    media: tuple[Kind, ...] = ("json", "npy")

    def check(self, task: str, key: str) -> None:
        pass  # every task serves its native request

    def request(self, payload: JSON, find: Find) -> JSON:
        return payload  # the task validates it: its schema (the task's spec's) documents it

    def npy(self, body: dict[str, Any], original: JSON) -> bytes:
        return npy_answer(body)  # a vectors answer's vectors, a one-output answer's array; else 406


class OpenAIEmbeddings(Vectors):
    """`POST /v1/embeddings`: `{"input", "model"?, "encoding_format"?, "dimensions"?, "user"?}` →
    `{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}`.

    `"model"` names a model this instance serves (`id` or `id@version`) or, as OpenAI clients always send
    one, anything else, which means the default model: it never collides with our routing field."""

    path = "/v1/embeddings"
    schema = "OpenAIEmbeddingsRequest"
    answer = "OpenAIEmbeddingsResponse"
    summary = "OpenAI's embeddings API"
    refusals = (TokenIds("input", LANGCHAIN_HINT),)

    def native(self, body: dict[str, Any]) -> dict[str, Any]:
        native = {"inputs": _texts(body["input"]), **_given(body, "dimensions")}
        if body.get("encoding_format") == "base64":
            native["encoding_format"] = "base64"
        return native

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        assert isinstance(original, dict)
        encoding = _on(original, "encoding_format", "float")
        vectors = shape_vectors(body["embeddings"], original.get("dimensions"), encoding)
        tokens = int((body.get("usage") or {}).get("tokens", 0))
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
            "model": body.get("model"),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }


class InfinityEmbeddings(OpenAIEmbeddings):
    """`POST /embeddings`: Infinity's OpenAI-shaped embeddings with `"modality": "text" | "image"` (images as
    base64 strings or data URLs, never fetched) → OpenAI's answer; served by image-text models."""

    path = "/embeddings"
    schema = "InfinityEmbeddingsRequest"
    summary = "Infinity's embeddings: texts, or images with modality image, in one space"

    def native(self, body: dict[str, Any]) -> dict[str, Any]:
        return {**super().native(body), **_given(body, "modality")}


class TeiEmbed(Vectors):
    """`POST /embed`: `{"inputs", "normalize"?, "truncate"?, "prompt_name"?, "dimensions"?, "model"?}` →
    `[[...], ...]`. Inputs longer than the model's window are always truncated (as sentence-transformers does)."""

    path = "/embed"
    schema = "EmbedRequest"
    answer = "EmbedResponse"
    summary = "text-embeddings-inference's embeddings"
    refusals = (
        TokenIds("inputs"),
        Refuse("normalize", "false is not served: this model's vectors are normalized", values=(False,)),
        RIGHT_ONLY,
    )

    def native(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"inputs": _texts(body["inputs"]), **_given(body, "dimensions", "prompt_name")}

    def takes(self, payload: JSON) -> bool:
        # `"parameters"` is the Inference API's text-classification shape (InferenceClient sends it, `{}`
        # included): vectors would crash that client, so `POST /` answers it only as `/predict`.
        keys = payload if isinstance(payload, dict) else {}
        return not self._pair(payload) and "parameters" not in keys and "query" not in keys

    @staticmethod
    def _pair(payload: JSON) -> bool:
        return isinstance(payload, dict) and isinstance(payload.get("inputs"), dict)

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        assert isinstance(original, dict)
        return shape_vectors(body["embeddings"], original.get("dimensions"), "float")


class TeiEmbedSparse(Base):
    """`POST /embed_sparse`: `{"inputs", "truncate"?, "prompt_name"?, "model"?}` → `[[{"index", "value"}, ...]]`,
    each input's non-zero entries (a sparse model's)."""

    path = "/embed_sparse"
    schema = "EmbedSparseRequest"
    answer = "EmbedSparseResponse"
    summary = "text-embeddings-inference's sparse embeddings (SPLADE)"
    refusals = (TokenIds("inputs"), RIGHT_ONLY)

    def native(self, body: dict[str, Any]) -> dict[str, Any]:
        # sparse_format: the sparse answer (a hybrid model, bge-m3, answers dense vectors without it)
        return {"inputs": _texts(body["inputs"]), "sparse_format": "indices", **_given(body, "prompt_name")}

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        return [
            [{"index": i, "value": v} for i, v in zip(e["indices"], e["values"], strict=True)]
            for e in body["embeddings"]
        ]


class TeiSimilarity(Base):
    """`POST /similarity`: `{"inputs": {"source_sentence", "sentences"}, "parameters"?: {"prompt_name"?,
    "truncate"?, "truncation_direction"?}}` → `[cosine, ...]`, one per sentence (InferenceClient's
    `sentence_similarity` and the Inference API's shape)."""

    path = "/similarity"
    schema = "SimilarityRequest"
    answer = "SimilarityResponse"
    summary = "text-embeddings-inference's sentence similarity: cosine of each sentence's vector with the source's"
    media: tuple[Kind, ...] = ("json", "npy")
    refusals = (Refuse(f"parameters.{RIGHT_ONLY.field}", RIGHT_ONLY.message, allowed=RIGHT_ONLY.allowed),)

    def native(self, body: dict[str, Any]) -> dict[str, Any]:
        inputs = body["inputs"]
        return {
            "inputs": [inputs["source_sentence"], *inputs["sentences"]],
            **_given(body.get("parameters") or {}, "prompt_name"),
        }

    def takes(self, payload: JSON) -> bool:
        return TeiEmbed._pair(payload)  # TEI's `TASK=sentence-similarity` shape

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        return self.scores(body)  # float32, written at its shortest by the edge's encoder

    def npy(self, body: dict[str, Any], original: JSON) -> bytes:
        return dump_npy(self.scores(body))  # the route's answer, the scores: not the vectors behind them

    @staticmethod
    def scores(body: dict[str, Any]) -> np.ndarray[Any, Any]:
        import numpy as np  # deferred: see the TYPE_CHECKING import

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
    schema = "RerankRequest"
    answer = "RerankResponse"
    summary = "text-embeddings-inference's rerank"
    refusals = (
        Refuse("raw_scores", "true is not served: scores are the model's activated ones", values=(True,)),
        RIGHT_ONLY,
    )

    def native(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"query": body["query"], "documents": body["texts"], "return_documents": _on(body, "return_text", False)}

    def takes(self, payload: JSON) -> bool:
        return isinstance(payload, dict) and "query" in payload

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        assert isinstance(original, dict)
        texts, return_text = original["texts"], _on(original, "return_text", False)
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

    schema = "CohereRerankRequest"
    answer = "CohereRerankResponse"
    refusals = tuple(
        Refuse(name, f"not served: {why}", allowed=())
        for name, why in (
            ("max_tokens_per_doc", "documents are truncated at the model's own limit"),
            ("rank_fields", 'documents are text (or {"text"} objects)'),
        )
    )

    def __init__(self, path: str) -> None:
        self.path = path
        self.summary = f"the rerank API Cohere ({path[1:3]}), Jina and vLLM share"

    def native(self, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "query": body["query"],
            "documents": body["documents"],
            **_given(body, "top_n"),
            "return_documents": _on(body, "return_documents", False),
        }

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        tokens = int((body.get("usage") or {}).get("tokens", 0))
        return {"model": body.get("model"), "results": body["results"], "usage": {"total_tokens": tokens}}


# Cohere's `input_type` → the prompt names that serve it in a model's prompts, the first it has wins
# (sentence-transformers configs say "query" / "document" or "passage"; nomic's say "search_query", ...).
COHERE_PROMPTS: dict[str, tuple[str, ...]] = {
    "search_query": ("search_query", "query"),
    "search_document": ("search_document", "document", "passage"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}


class CohereEmbed(Base):
    """`POST /v2/embed` (Cohere's `ClientV2.embed`): `{"texts", "model", "input_type", "embedding_types"?,
    "output_dimension"?, "truncate"?}` → `{"id", "response_type", "embeddings": {"float"?: [...],
    "base64"?: [...]}, "texts", "meta"}`. `input_type` becomes the model's prompt of that name where it has one
    (`COHERE_PROMPTS`; none: the model's default, as sentence-transformers does); base64 is little-endian
    float32, as OpenAI's. int8/uint8/binary/ubinary are refused: the vectors are float32."""

    path = "/v2/embed"
    schema = "CohereEmbedRequest"
    answer = "CohereEmbedResponse"
    summary = "Cohere's embed v2: float and base64 vectors; input_type as the model's prompt where it has one"
    refusals = (
        Items("embedding_types", ("float", "base64"), "the vectors are float32"),
        Refuse("input_type", '"image" is not served: texts only', values=("image",)),
        Refuse("truncate", 'only "END" is served (the end of a long text is dropped)', allowed=("END",)),
        Refuse("max_tokens", "not served: texts are cut at the model's own limit", allowed=()),
        Refuse("images", "not served: send texts", allowed=()),
        Refuse("inputs", "not served: send texts", allowed=()),
    )

    def native(self, body: dict[str, Any]) -> dict[str, Any]:
        native = {"inputs": body["texts"], **_given(body, "input_type")}
        if body.get("output_dimension") is not None:
            native["dimensions"] = body["output_dimension"]
        return native

    def run(self, task: Any, native: JSON) -> dict[str, Any]:
        # The model's prompts are known only here, with its task (EmbeddingTask's public `prompts`).
        assert isinstance(native, dict)
        prompts = getattr(task, "prompts", {})
        wanted = COHERE_PROMPTS.get(native.pop("input_type", None) or "", ())
        name = next((n for n in wanted if n in prompts), None)
        return super().run(task, {**native, "prompt_name": name} if name else native)

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        assert isinstance(original, dict)
        types = dict.fromkeys(_on(original, "embedding_types", ["float"]))  # as asked, each once
        dims = original.get("output_dimension")
        tokens = int((body.get("usage") or {}).get("tokens", 0))
        return {
            "id": str(uuid.uuid4()),
            "response_type": "embeddings_by_type",
            "embeddings": {t: shape_vectors(body["embeddings"], dims, t) for t in types},
            "texts": original["texts"],
            "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}},
        }


class TeiPredict(Base):
    """`POST /predict`: `{"inputs": "text" | ["text", ...], "raw_scores"?, "truncate"?, "parameters"?,
    "model"?}` → `[{"label", "score"}, ...]` for one text, `[[...], ...]` for a list. Text pairs are not
    taken: a list of two strings is two texts here (TEI would read it as one pair).

    `"parameters"` (`top_k`, `function_to_apply`) is the Inference API's, which `InferenceClient.
    text_classification` sends: a request with it is answered in that API's shape, a list per text, one text
    included (TEI ignores the field and answers one list, which that client reads as its first label only)."""

    path = "/predict"
    schema = "PredictRequest"
    answer = "PredictResponse"
    summary = "text-embeddings-inference's classification (and the Inference API's, with `parameters`)"
    refusals = (
        TokenIds("inputs", lists_only=True),
        Refuse("raw_scores", "true is not served: scores are probabilities", values=(True,)),
        RIGHT_ONLY,
    )

    def native(self, body: dict[str, Any]) -> dict[str, Any]:
        parameters = body.get("parameters") or {}
        return {"inputs": _texts(body["inputs"]), **_given(parameters, "top_k", "function_to_apply")}

    def takes(self, payload: JSON) -> bool:
        return not TeiEmbed._pair(payload) and not (isinstance(payload, dict) and "query" in payload)

    def run(self, task: Any, native: JSON) -> dict[str, Any]:
        assert isinstance(native, dict)
        wanted = native.pop("function_to_apply", None)
        own = "sigmoid" if getattr(task, "multi_label", False) else "softmax"  # ClassifyTask's public attribute
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


class TeiTokenize(Base):
    """`POST /tokenize`: `{"inputs", "add_special_tokens"?, "prompt_name"?}` → per text, its tokens
    `[{"id", "text", "special", "start", "stop"}]` as the model sees them (truncated at its length). `start` and
    `stop` are character offsets into the text (null for special tokens), `text` that slice of it."""

    path = "/tokenize"
    schema = "TokenizeRequest"
    answer = "TokenizeResponse"
    summary = "text-embeddings-inference's tokenize: the tokens the model sees"
    refusals = (TokenIds("inputs"),)

    def native(self, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "inputs": _texts(body["inputs"]),
            "add_special_tokens": _on(body, "add_special_tokens", True),
            **_given(body, "prompt_name"),
        }

    def run(self, task: Any, native: JSON) -> dict[str, Any]:
        from handler.tasks.text import check_texts  # deferred: only this route reads texts outside a task

        assert isinstance(native, dict)
        texts = check_texts(native["inputs"], "inputs", task.max_inputs, task.max_chars)
        prompt = task.prompt(native)  # what the task would put in front (prompt_name's, or its default)
        out = []
        for text in texts:
            full = prompt + text
            out.append(
                [
                    {"id": i, "text": token, "special": True, "start": None, "stop": None}
                    if special
                    else {"id": i, "text": full[start:stop], "special": False, "start": start, "stop": stop}
                    for i, token, (start, stop), special in task.tokens(full, native["add_special_tokens"])
                ]
            )
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

    def native(self, body: dict[str, Any]) -> dict[str, Any]:
        ids = body["ids"]
        return {
            "ids": ids if ids and isinstance(ids[0], list) else [ids],
            "skip_special_tokens": _on(body, "skip_special_tokens", True),
        }

    def run(self, task: Any, native: JSON) -> dict[str, Any]:
        assert isinstance(native, dict)
        return {"texts": task.decode(native["ids"], native["skip_special_tokens"]), "model": task.model}

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        texts: list[Any] = body["texts"]
        return texts


class Root(Base):
    """`POST /`: text-embeddings-inference's default route, answered as the model's task's own route answers:
    the first of `CHOICES` that the model's task serves and that takes the body (an embedding model: `/embed`,
    or `/similarity` for `{"inputs": {"source_sentence", "sentences"}}`, as TEI does with
    `TASK=sentence-similarity`; a reranker: `/rerank`; a classifier: `/predict`)."""

    path = "/"
    schema = "RootRequest"
    answer = "RootResponse"
    summary = "text-embeddings-inference's default route: the model's task's route (embed, similarity, rerank, predict)"
    media: tuple[Kind, ...] = ("json", "npy")  # the route it picks says, for the model's task (`npy`)
    CHOICES = ("/similarity", "/embed", "/rerank", "/predict")

    def pick(self, payload: JSON, task: str, key: str, served: dict[str, str]) -> Route:
        """The route answering `payload` for the model `key` (of `task`) the request reached; `served`: every
        model of this instance, key → task, named in the refusal when another one could answer."""
        route = self.route(payload, task)
        if route is not None:
            return route
        able = [k for k, t in served.items() if k != key and self.route(payload, t) is not None]
        wanted = " or ".join(p for p in self.CHOICES if ROUTES[p].takes(payload))
        raise UnsupportedRequestError(
            f"POST / with this body is {wanted}'s request; {key} is {task}{served_that_can(able)}"
        )

    def route(self, payload: JSON, task: str) -> Route | None:
        """The first of `CHOICES` that a `task` model serves and that takes `payload`, or None."""
        routes = catalog.spec(task).routes
        return next((ROUTES[p] for p in self.CHOICES if p in routes and ROUTES[p].takes(payload)), None)


# ------------------------------------------------------------------------------------------------- generation

# What both completion APIs recognise and do not serve (a value that changes nothing is taken: `n: 1`, 0 penalties).
GENERATION_REFUSALS: tuple[Refusal, ...] = (
    Refuse("n", "only 1 is served (one choice per request)", allowed=(1,)),
    Refuse("presence_penalty", "only 0 is served (no penalties)", allowed=(0, 0.0)),
    Refuse("frequency_penalty", "only 0 is served (no penalties)", allowed=(0, 0.0)),
    Refuse("repetition_penalty", "only 1 is served (no penalties)", allowed=(1, 1.0)),
    Refuse("logit_bias", "token biases are not served", allowed=({},)),
)
CHAT_REFUSALS: tuple[Refusal, ...] = (
    *GENERATION_REFUSALS,
    TextParts("messages"),
    Refuse("logprobs", "true is not served (no log probabilities)", allowed=(False,)),
    Refuse("top_logprobs", "not served (no log probabilities)", allowed=(0,)),
    Refuse("tools", "tool calls are not served", allowed=([],)),
    Refuse("tool_choice", 'tool calls are not served (only "none" or "auto" without tools)', allowed=("none", "auto")),
    Refuse("functions", "function calls are not served", allowed=([],)),
    Refuse("function_call", 'function calls are not served (only "none" or "auto")', allowed=("none", "auto")),
)
COMPLETION_REFUSALS: tuple[Refusal, ...] = (
    *GENERATION_REFUSALS,
    TokenIds("prompt"),
    OneText("prompt", "send one prompt per request"),
    Refuse("best_of", "only 1 is served (one choice per request)", allowed=(1,)),
    Refuse("echo", "true is not served (the prompt is not echoed)", allowed=(False,)),
    Refuse("logprobs", "not served (no log probabilities)", allowed=()),
    Refuse("suffix", "not served (no insertion)", allowed=("",)),
)
# The native request's sampling fields, taken as the client sent them (the task checks their ranges).
SAMPLING = ("temperature", "top_p", "seed", "stop", "response_format")


def _now() -> int:
    return int(time.time())


def _usage(answer: dict[str, Any]) -> dict[str, int]:
    usage = answer.get("usage") or {}
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class Generation(Base):
    """OpenAI's completion APIs on the `generate` task: the client's fields mapped to the native request (vLLM's
    `top_k`, -1 meaning none, and `chat_template_kwargs` too), the gathered answer as OpenAI's object, and a
    stream's pieces as its chunks (`pieces`), one id and `created` for all of a stream's chunks. `max_tokens`
    left out means the native default (what the context has room for, within WARMSTART_MAX_TOKENS), as vLLM
    does, not OpenAI's 16 for `/v1/completions`."""

    object_name = ""  # the answer's `object`; its stream's chunks are `chunk_object`
    chunk_object = ""
    prefix = ""  # of the answer's id
    max_fields: tuple[str, ...] = ("max_tokens",)  # the first one set is the native `max_tokens`

    def native(self, body: dict[str, Any]) -> dict[str, Any]:
        native = {**self.prompt(body), **_given(body, *SAMPLING)}
        for name in self.max_fields:
            if body.get(name) is not None:
                native["max_tokens"] = body[name]
                break
        top_k = body.get("top_k")
        if top_k is not None:
            native["top_k"] = 0 if top_k == -1 else top_k  # vLLM's -1: every token
        return native

    def prompt(self, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def run(self, task: Any, native: JSON) -> dict[str, Any]:
        # One answer: the pieces gathered as the task gathers them (a Lambda event; an HTTP request not streamed).
        if streams(task):
            return collect(task, task.stream(native))
        return super().run(task, native)

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        choice = {"index": 0, **self.whole(body["text"]), "logprobs": None, "finish_reason": body["finish_reason"]}
        return {
            "id": self.prefix + uuid.uuid4().hex,
            "object": self.object_name,
            "created": _now(),
            "model": body.get("model"),
            "choices": [choice],
            "usage": _usage(body),
        }

    def whole(self, text: str) -> dict[str, Any]:
        """The answer's text in a choice."""
        raise NotImplementedError

    def delta(self, text: str) -> dict[str, Any]:
        """A text delta in a stream chunk's choice."""
        raise NotImplementedError

    def opening(self) -> list[dict[str, Any]]:
        """The choices' fields of the chunks that open a stream, before its first text."""
        return []

    def closing(self) -> dict[str, Any]:
        """The choice's fields of the chunk that carries `finish_reason`."""
        return self.delta("")

    def pieces(self, pieces: Iterator[dict[str, Any]], original: JSON, model: str) -> Pieces:
        ident, created = self.prefix + uuid.uuid4().hex, _now()
        options = original.get("stream_options") if isinstance(original, dict) else None
        with_usage = isinstance(options, dict) and options.get("include_usage") is True
        extra = {"usage": None} if with_usage else {}  # as OpenAI: null on every chunk but the usage one

        def chunk(choices: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
            body = {"id": ident, "object": self.chunk_object, "created": created, "model": model, "choices": choices}
            return {**body, **extra, **fields}

        def choice(fields: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
            return [{"index": 0, **fields, "logprobs": None, "finish_reason": finish}]

        try:
            opened = False
            for piece in pieces:
                if not opened:  # only once the task made its first piece: an error before it is a typed answer
                    opened = True
                    for fields in self.opening():
                        yield chunk(choice(fields))
                if piece.get("text"):
                    yield chunk(choice(self.delta(piece["text"])))
                if piece.get("finish_reason") is not None:
                    yield chunk(choice(self.closing(), piece["finish_reason"]))
                    if with_usage:
                        yield chunk([], usage=_usage(piece))
        finally:
            close = getattr(pieces, "close", None)
            if close is not None:
                close()  # the task's stream stops with its consumer


class ChatCompletions(Generation):
    """`POST /v1/chat/completions`: `{"messages": [{"role", "content": str | [{"type": "text", "text"}]}],
    "model"?, "max_completion_tokens"? | "max_tokens"?, "temperature"?, "top_p"?, "top_k"?, "seed"?, "stop"?,
    "response_format"?, "chat_template_kwargs"?, "stream"?, "stream_options"?}` → `chat.completion` (streamed:
    `chat.completion.chunk`s, the first with the assistant's role, the last with `finish_reason`, then, with
    `stream_options.include_usage`, one with `usage` and no choices). `developer` messages are system ones."""

    path = "/v1/chat/completions"
    schema = "ChatCompletionRequest"
    answer = "ChatCompletionResponse"
    summary = "OpenAI's chat completions (`stream`: server-sent `chat.completion.chunk` events)"
    refusals = CHAT_REFUSALS
    object_name, chunk_object, prefix = "chat.completion", "chat.completion.chunk", "chatcmpl-"
    max_fields = ("max_completion_tokens", "max_tokens")

    def prompt(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = []
        for message in body["messages"]:
            role, content = message["role"], message["content"]
            if isinstance(content, list):
                content = [{"type": "text", "text": part["text"]} for part in content]
            messages.append({"role": "system" if role == "developer" else role, "content": content})
        return {"messages": messages, **_given(body, "chat_template_kwargs")}

    def whole(self, text: str) -> dict[str, Any]:
        return {"message": {"role": "assistant", "content": text}}

    def delta(self, text: str) -> dict[str, Any]:
        return {"delta": {"content": text}}

    def opening(self) -> list[dict[str, Any]]:
        return [{"delta": {"role": "assistant", "content": ""}}]

    def closing(self) -> dict[str, Any]:
        return {"delta": {}}


class Completions(Generation):
    """`POST /v1/completions`: `{"prompt": str | [str], "model"?, "max_tokens"?, "temperature"?, "top_p"?,
    "top_k"?, "seed"?, "stop"?, "response_format"?, "stream"?, "stream_options"?}` → `text_completion` (streamed:
    `text_completion` chunks, the last with `finish_reason`; then the usage one when asked). The prompt is raw
    text: no chat template."""

    path = "/v1/completions"
    schema = "CompletionRequest"
    answer = "CompletionResponse"
    summary = "OpenAI's (legacy) completions (`stream`: server-sent `text_completion` events)"
    refusals = COMPLETION_REFUSALS
    object_name, chunk_object, prefix = "text_completion", "text_completion", "cmpl-"

    def prompt(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body["prompt"]
        return {"prompt": prompt[0] if isinstance(prompt, list) else prompt}

    def whole(self, text: str) -> dict[str, Any]:
        return {"text": text}

    def delta(self, text: str) -> dict[str, Any]:
        return {"text": text}


def model_list(models: list[tuple[str, str]], created: int) -> dict[str, Any]:
    """`GET /v1/models`: OpenAI's list of the served models, loaded or on demand, from (key `id@version`,
    task) pairs. `id` is the bare id (what a client sends as `model`, whichever version is served), the
    full key and the task are extra fields (clients keep what they do not know)."""
    data: dict[str, dict[str, Any]] = {}
    for key, task in models:
        name = key.split("@", 1)[0]
        data.setdefault(
            name, {"id": name, "object": "model", "created": created, "owned_by": "warmstart", "key": key, "task": task}
        )
    return {"object": "list", "data": list(data.values())}


NATIVE = Native()
ROOT = Root()
ROUTES: dict[str, Route] = {
    r.path: r
    for r in (
        NATIVE,
        OpenAIEmbeddings(),
        InfinityEmbeddings(),
        TeiEmbed(),
        TeiEmbedSparse(),
        TeiSimilarity(),
        TeiRerank(),
        TeiPredict(),
        TeiTokenize(),
        TeiDecode(),
        Rerank("/v1/rerank"),
        Rerank("/v2/rerank"),
        CohereEmbed(),
        ChatCompletions(),
        Completions(),
        ROOT,
    )
}
MODELS_PATH = "/v1/models"  # OpenAI's `GET`, answered without a task (`model_list`)
# Lambda HTTP events reach the native task on any path (as before); only these paths are mapped. `/embed`
# and `/` are not: they were the native route's paths on Lambda before TEI's routes existed.
LAMBDA_PATHS = frozenset(p for p in ROUTES if p not in (NATIVE.path, TeiEmbed.path, ROOT.path))
