"""`sparse` (SPLADE): {"inputs": ["text", ...], "prompt_name"?, "prompt"?, "top_k"?, "return_tokens"?,
"sparse_format"?} → {"embeddings": [{"indices": [...], "values": [...], "tokens"?: [...]}], "model", "usage"}.

The graph ends in SpladePooling (log1p of the ReLU'd MLM logits, max or sum over the real tokens), one
vocabulary-wide row per text; only its non-zero entries are answered, by ascending token id, as
`SparseEncoder.encode` gives them. `top_k` keeps the k largest (its `max_active_dims`). The default shape is
Qdrant's `SparseVector` (`indices`, `values`); `sparse_format: "milvus"` gives Milvus' `{"<index>": value}`.
TEI's `POST /embed_sparse` (`[[{"index", "value"}, ...]]`) is mapped in `handler.api.compat`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from handler.backends.contract import Backend
from handler.backends.pool import BufferPool
from handler.core.config import Config
from handler.core.manifest import Manifest
from handler.core.types import JSON
from handler.tasks.arrays import finite
from handler.tasks.batch import Prepared
from handler.tasks.embedding import manifest_fields as prompt_fields
from handler.tasks.spec import FLAG, MODEL, NUMBER, POSITIVE, STRING, TEXTS, USAGE, TaskSpec, nullable
from handler.tasks.text import (
    TEXT_ROUTES,
    TextModel,
    check_texts,
    choice,
    flag,
    joined,
    positive_int,
    prompt_for,
    require_object,
)

if TYPE_CHECKING:  # types only: numpy.typing's import dedents docstrings with regexes, at init
    import numpy.typing as npt

SPARSE_FORMATS = ("indices", "milvus")  # Qdrant's SparseVector (and the native shape), Milvus' dict
INPUT_TYPES = ("document", "query")  # "query": a model with an inference-free query encoder uses it
# The prompt each input type takes when the request names none, as encode_query / encode_document pick it.
TYPE_PROMPTS = {"query": ("query",), "document": ("document", "passage", "corpus")}
POOLINGS, ACTIVATIONS = ("max", "sum"), ("relu", "log1p_relu")  # infra.pack.sparse_source's, as packed


class SparseTask(TextModel):
    """Texts → their SPLADE vectors, non-zero entries only."""

    name = "sparse"

    def __init__(self, manifest: Manifest, backend: Backend, config: Config, pool: BufferPool | None = None) -> None:
        super().__init__(manifest, backend, config, pool)
        width = manifest.outputs[0].shape[-1] if manifest.outputs[0].shape else None
        self.dimension = manifest.dimension or (width if isinstance(width, int) else None)
        self.prompts: dict[str, str] = manifest.options.get("prompts", {})
        self.default_prompt: str | None = manifest.options.get("default_prompt_name")
        query = manifest.options["splade"].get("query")
        # An inference-free query encoder: one weight per token id, mapped (a query runs no model).
        self.query_weights = (
            np.load(manifest.path(query["file"]), mmap_mode="r", allow_pickle=False) if query is not None else None
        )

    def _static(self, body: dict[str, Any], texts: list[str]) -> tuple[npt.NDArray[np.float32], int] | None:
        """A query's rows from the static query encoder, as SparseStaticEmbedding computes them (each token
        present, special tokens not added, weighs its own weight once); None where the model runs."""
        if self.query_weights is None or choice(body, "input_type", INPUT_TYPES, "") != "query":
            return None
        rows = np.zeros((len(texts), len(self.query_weights)), np.float32)
        tokens = 0
        for row, text in zip(rows, texts, strict=True):
            ids = np.array([t[0] for t in self.encoder.spans(text, add_special_tokens=False)], np.int64)
            ids = ids[ids < len(row)]
            row[ids] = self.query_weights[ids]
            tokens += len(ids)
        return rows, tokens

    def _options(self, payload: JSON) -> tuple[list[str], int | None, bool, str]:
        body = require_object(payload, "inputs")
        texts = check_texts(body["inputs"], "inputs", self.max_inputs, self.max_chars)
        kind = choice(body, "input_type", INPUT_TYPES, "")
        if kind and body.get("prompt") is None and body.get("prompt_name") is None:
            named = next((n for n in TYPE_PROMPTS[kind] if n in self.prompts), None)
            body = {**body, "prompt_name": named} if named is not None else body
        prompt = prompt_for(body, self.prompts, self.default_prompt, self.max_chars)
        joined(prompt, texts, "the prompt", "inputs", self.max_chars)
        top_k = positive_int(body, "top_k")
        tokens = flag(body, "return_tokens")
        fmt = choice(body, "sparse_format", SPARSE_FORMATS, "indices")
        return ([prompt + t for t in texts] if prompt else texts), top_k, tokens, fmt

    def _answer(
        self, rows: npt.NDArray[np.float32], tokens: int, top_k: int | None, with_tokens: bool, fmt: str
    ) -> dict[str, Any]:
        finite(rows, "vectors")
        return {
            "embeddings": [self._entry(row, top_k, with_tokens, fmt) for row in rows],
            "model": self.model,
            "usage": {"tokens": tokens},
        }

    def _entry(self, row: npt.NDArray[np.float32], top_k: int | None, with_tokens: bool, fmt: str) -> dict[str, Any]:
        indices = np.flatnonzero(row)
        values = row[indices].astype(np.float32)  # a copy: the row is a pooled buffer's
        indices, values = top_terms(indices, values, top_k)
        entry = sparse_entry(indices, values, fmt)
        if with_tokens:
            entry["tokens"] = [self.encoder.token(int(i)) for i in indices]
        return entry

    def __call__(self, payload: JSON) -> dict[str, Any]:
        texts, top_k, with_tokens, fmt = self._options(payload)
        static = self._static(require_object(payload), texts)
        if static is not None:
            return self._answer(*static, top_k, with_tokens, fmt)
        with self.pool.request():
            rows, tokens = self._run(texts)
            return self._answer(rows, tokens, top_k, with_tokens, fmt)

    def prepare(self, payload: JSON) -> Prepared:
        """The request checked and tokenized on its own, for a batch of several (`handler.tasks.batch`)."""
        texts, top_k, with_tokens, fmt = self._options(payload)
        static = self._static(require_object(payload), texts)
        if static is not None:  # nothing for the model to run: answered as it is
            answer = self._answer(*static, top_k, with_tokens, fmt)
            return Prepared([], lambda rows, tokens: answer)
        return Prepared(
            self.encoder.tokenize(texts), lambda rows, tokens: self._answer(rows, tokens, top_k, with_tokens, fmt)
        )

    def warmup(self) -> None:
        # One text and a padded pair: both the batch-1 and the masked path, as the embedding task warms.
        self.run_copy(["warm-up"])
        self.run_copy(["warm-up query", "a slightly longer warm-up passage, so the batch needs padding"])

    def prompt(self, body: dict[str, Any]) -> str:
        return prompt_for(body, self.prompts, self.default_prompt, self.max_chars)


def top_terms(
    indices: npt.NDArray[Any], values: npt.NDArray[np.float32], top_k: int | None
) -> tuple[npt.NDArray[Any], npt.NDArray[np.float32]]:
    """The `top_k` largest weights of terms sorted by id (ties: the lower id), back in id order; all when None."""
    if top_k is not None and top_k < indices.size:
        chosen = np.sort(np.argsort(-values, kind="stable")[:top_k])
        return indices[chosen], values[chosen]
    return indices, values


def sparse_entry(indices: npt.NDArray[Any], values: npt.NDArray[np.float32], fmt: str) -> dict[str, Any]:
    """One text's answer: `indices` + `values` (Qdrant's shape), or Milvus's `sparse` dict (the hybrid task's too)."""
    if fmt == "milvus":
        return {"sparse": {str(i): v for i, v in zip(indices.tolist(), values, strict=True)}}
    return {"indices": indices.tolist(), "values": values}


def manifest_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """`splade` ({"pooling", "activation"}), `prompts` and `default_prompt_name`, checked."""
    splade = raw.get("splade")
    if not isinstance(splade, dict):
        raise ValueError('splade must be an object {"pooling", "activation"}')
    if splade.get("pooling") not in POOLINGS:
        raise ValueError(f"splade pooling {splade.get('pooling')!r}; valid: {', '.join(POOLINGS)}")
    if splade.get("activation") not in ACTIVATIONS:
        raise ValueError(f"splade activation {splade.get('activation')!r}; valid: {', '.join(ACTIVATIONS)}")
    query = splade.get("query")
    if query is not None and not (
        isinstance(query, dict) and query.get("kind") == "static" and isinstance(query.get("file"), str)
    ):
        raise ValueError('splade query must be {"kind": "static", "file": "<weights .npy>"}')
    fields = prompt_fields({k: v for k, v in raw.items() if k != "pooling"})
    return {**fields, "splade": {"pooling": splade["pooling"], "activation": splade["activation"], "query": query}}


SPARSE_VECTOR = {
    "type": "object",
    "description": "the non-zero entries by ascending token id: `indices` + `values` (Qdrant's SparseVector), "
    'or `sparse` (Milvus: {"<index>": value}) with `sparse_format: "milvus"`; `tokens` when asked',
    "properties": {
        "indices": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "values": {"type": "array", "items": NUMBER},
        "sparse": {"type": "object", "additionalProperties": NUMBER},
        "tokens": {"type": "array", "items": STRING},
    },
}

SPEC = TaskSpec(
    name=SparseTask.name,
    factory=SparseTask,
    request={
        "title": "sparse",
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "inputs": TEXTS,
            "model": MODEL,
            "prompt_name": nullable(STRING),
            "prompt": nullable(STRING),
            "top_k": POSITIVE,
            "return_tokens": FLAG,
            "sparse_format": nullable({"enum": list(SPARSE_FORMATS)}),
            "input_type": nullable(
                {
                    "enum": list(INPUT_TYPES),
                    "description": "as encode_query / encode_document: that prompt where none is named; query: "
                    "the model's inference-free query encoder, if any",
                }
            ),
        },
    },
    example={"inputs": "hello"},
    answer={
        "title": "sparse",
        "type": "object",
        "required": ["embeddings", "model", "usage"],
        "properties": {"embeddings": {"type": "array", "items": SPARSE_VECTOR}, "model": STRING, "usage": USAGE},
    },
    fields=manifest_fields,
    routes=("/embed_sparse", *TEXT_ROUTES),
    batches=True,
    # TEI reports a SPLADE model as an embedding model with pooling "splade".
    tei_kind="embedding",
    tei_info=lambda manifest: {"pooling": "splade"},
    tei_info_schema={"type": "object", "required": ["pooling"], "properties": {"pooling": STRING}},
)
