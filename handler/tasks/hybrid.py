"""`hybrid` (bge-m3): dense, sparse and multi-vector answers from one model run, each chosen per request.

FlagEmbedding's shape: {"inputs", "return_dense"? (default true), "return_sparse"?, "return_colbert_vecs"?}
→ {"dense_vecs"?: [[...]], "lexical_weights"?: [{"indices", "values"}], "colbert_vecs"?: [[[...], ...]],
"model", "usage"}, as `BGEM3FlagModel.encode` computes them: the CLS vector, unit length; each token's
relu(sparse_linear) weight, the largest per token id, the special tokens (cls, eos, pad, unk) dropped; the
tokens after CLS through colbert_linear, unit length, padding dropped.

The other tasks' shapes, for the routes every client already uses: {"inputs"} → {"embeddings": dense vectors}
(`/v1/embeddings`, `/embed`); with `sparse_format` → {"embeddings": sparse entries} (`/embed_sparse`, as the
sparse task answers); with `input_type` → {"embeddings": per-token vectors} (the multivector task's); and the
multivector task's rerank, {"query", "documents", "top_n"?, "return_documents"?} → the rerank answer, each score
FlagEmbedding's `colbert_score` (for each query vector its best dot product with the document's, averaged).
The embedding task's `prompt_name` and `dimensions`, which those routes pass on, are refused (UNSERVED says why).

The graph's one output is per token [hidden, unit length | lexical weight | multi-vector, unit length]
(`infra.pack.hybrid_source`); this module slices it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from handler.backends.contract import Backend
from handler.backends.pool import BufferPool
from handler.core.config import Config
from handler.core.errors import InvalidInputError
from handler.core.manifest import Manifest
from handler.core.types import JSON
from handler.tasks.arrays import finite
from handler.tasks.batch import Prepared, run_prepared
from handler.tasks.multivector import maxsim
from handler.tasks.scored import RERANK_RESULT
from handler.tasks.scoring import rank
from handler.tasks.sparse import sparse_entry, top_terms
from handler.tasks.spec import FLAG, MODEL, NUMBER, POSITIVE, STRING, TEXTS, USAGE, TaskSpec, nullable
from handler.tasks.text import (
    TEXT_ROUTES,
    TextModel,
    check_text,
    check_texts,
    choice,
    flag,
    positive_int,
    require_object,
)

if TYPE_CHECKING:  # types only: numpy.typing's import dedents docstrings with regexes, at init
    import numpy.typing as npt

OUTPUTS = ("return_dense", "return_sparse", "return_colbert_vecs")  # FlagEmbedding's encode flags
SPARSE_FORMATS = ("indices", "milvus")  # as the sparse task: Qdrant's SparseVector, Milvus' dict
INPUT_TYPES = ("document", "query")  # the multivector task's field: bge-m3 encodes both alike
# The embedding task's fields the compatibility routes pass on: refused, not ignored (an answer that looks right)
UNSERVED = {
    "prompt_name": "bge-m3 has no prompts (FlagEmbedding encodes queries and documents alike)",
    "dimensions": "bge-m3's dense vector is not Matryoshka-trained: its first components are no embedding",
}


class HybridTask(TextModel):
    name = "hybrid"

    def __init__(self, manifest: Manifest, backend: Backend, config: Config, pool: BufferPool | None = None) -> None:
        super().__init__(manifest, backend, config, pool)
        hybrid = manifest.options["hybrid"]
        self.dimension = int(manifest.dimension or 0)
        self.colbert_dim = int(hybrid["colbert_dim"])
        self.unused = np.asarray(hybrid["unused_ids"], dtype=np.int64)

    def prepare(self, payload: JSON) -> Prepared:
        """The request checked and tokenized on its own, for a batch of several (`handler.tasks.batch`)."""
        if isinstance(payload, dict) and "query" in payload and "inputs" not in payload:
            return self._prepare_rerank(payload)
        body = require_object(payload, "inputs")
        texts = check_texts(body["inputs"], "inputs", self.max_inputs, self.max_chars)
        for field, why in UNSERVED.items():
            if body.get(field) is not None:
                raise InvalidInputError(f'"{field}" is not served by a hybrid model: {why}; leave it out')
        flagged = any(body.get(k) is not None for k in OUTPUTS)
        fmt = choice(body, "sparse_format", SPARSE_FORMATS, "")
        kind = choice(body, "input_type", INPUT_TYPES, "")
        top_k = positive_int(body, "top_k")
        if flagged:
            wanted = [k for k in OUTPUTS if flag(body, k, k == "return_dense")]
            if not wanted:
                raise InvalidInputError(f"nothing asked: set one of {', '.join(OUTPUTS)} to true")
        elif fmt and kind:
            raise InvalidInputError("sparse_format and input_type each pick the answer's shape: give one")
        encodings = self.encoder.tokenize(texts)
        # Each row's real length; the ids, for the lexical weights.
        lengths = [int(sum(e.attention_mask)) for e in encodings]
        ids = [np.asarray(e.ids[:n], dtype=np.int64) for e, n in zip(encodings, lengths, strict=True)]

        def finish(out: npt.NDArray[Any], tokens: int) -> dict[str, Any]:
            finite(out, "outputs")
            answer: dict[str, Any] = {}
            if not flagged:
                key = "sparse" if fmt else "colbert" if kind else "dense"
                answer["embeddings"] = self._output(key, out, ids, lengths, top_k, fmt or "indices")
            else:
                for k, key in zip(OUTPUTS, ("dense", "sparse", "colbert"), strict=True):
                    if k in wanted:
                        got = self._output(key, out, ids, lengths, top_k, fmt or "indices")
                        answer[{"dense": "dense_vecs", "sparse": "lexical_weights"}.get(key, "colbert_vecs")] = got
            return {**answer, "model": self.model, "usage": {"tokens": tokens}}

        return Prepared(encodings, finish)

    def _prepare_rerank(self, body: dict[str, Any]) -> Prepared:
        query = check_text(body["query"], "query", self.max_chars)
        docs = require_object(body, "documents")["documents"]
        if not isinstance(docs, list) or not docs:
            raise InvalidInputError('"documents" must be a non-empty list of strings')
        docs = check_texts(
            [d["text"] if isinstance(d, dict) and "text" in d else d for d in docs],
            "documents",
            self.max_inputs,
            self.max_chars,
        )
        top_n = positive_int(body, "top_n")  # more than there are documents: all of them
        with_docs = flag(body, "return_documents")
        encodings = self.encoder.tokenize([query, *docs])
        lengths = [int(sum(e.attention_mask)) for e in encodings]

        def finish(out: npt.NDArray[Any], tokens: int) -> dict[str, Any]:
            finite(out, "outputs")
            q, *vectors = self._output("colbert", out, [], lengths, None, "")
            scores = np.array([colbert_score(q, d) for d in vectors], dtype=np.float32)
            results: list[dict[str, Any]] = []
            for i in rank(scores, top_n).tolist():
                item: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
                if with_docs:
                    item["document"] = {"text": docs[i]}
                results.append(item)
            return {"results": results, "model": self.model, "usage": {"tokens": tokens}}

        return Prepared(encodings, finish)

    def _output(
        self,
        key: str,
        out: npt.NDArray[Any],
        ids: list[npt.NDArray[np.int64]],
        lengths: list[int],
        top_k: int | None,
        fmt: str,
    ) -> list[Any]:
        h = self.dimension
        if key == "dense":  # the CLS row's hidden state, unit length in the graph
            return list(np.asarray(out[:, 0, :h], dtype=np.float32))
        if key == "colbert":  # the tokens after CLS (its eos included, as FlagEmbedding keeps it)
            return [np.asarray(out[r, 1:n, h + 1 :], dtype=np.float32) for r, n in enumerate(lengths)]
        rows = zip(ids, lengths, strict=True)
        return [self._weights(row_ids, out[r, :n, h], top_k, fmt) for r, (row_ids, n) in enumerate(rows)]

    def _weights(
        self, ids: npt.NDArray[np.int64], weights: npt.NDArray[Any], top_k: int | None, fmt: str
    ) -> dict[str, Any]:
        """Each token id's largest weight, by ascending id; special tokens and zero weights dropped."""
        unique, where = np.unique(ids, return_inverse=True)
        best = np.zeros(len(unique), dtype=np.float32)
        np.maximum.at(best, where, np.asarray(weights, dtype=np.float32))
        keep = (best > 0) & ~np.isin(unique, self.unused)
        indices, values = top_terms(unique[keep], best[keep], top_k)
        return sparse_entry(indices, values, fmt)

    def __call__(self, payload: JSON) -> dict[str, Any]:
        (answer,) = run_prepared(self, [self.prepare(payload)], self.batch_tokens)
        if isinstance(answer, Exception):
            raise answer
        result: dict[str, Any] = answer
        return result

    def warmup(self) -> None:
        # One text and a padded pair, all three outputs: the shapes a first request takes.
        self({"inputs": ["warm-up"], "return_sparse": True, "return_colbert_vecs": True})
        self({"inputs": ["warm-up query", "a slightly longer warm-up passage, so the batch needs padding"]})


def colbert_score(query: npt.NDArray[np.float32], document: npt.NDArray[np.float32]) -> float:
    """FlagEmbedding's `colbert_score`: for each query vector its largest dot product with a document vector,
    summed, over the query's vector count. No vector on either side (a one-token text) scores 0."""
    return maxsim(query, document) / len(query) if len(query) else 0.0


def manifest_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """`hybrid` ({"colbert_dim", "unused_ids"}, written by `pack --from`), checked."""
    hybrid = raw.get("hybrid")
    if not isinstance(hybrid, dict):
        raise ValueError('a hybrid model needs "hybrid": {"colbert_dim", "unused_ids"} (pack --from writes it)')
    dim, unused = hybrid.get("colbert_dim"), hybrid.get("unused_ids")
    if not (isinstance(dim, int) and not isinstance(dim, bool) and dim > 0):
        raise ValueError(f"hybrid.colbert_dim {dim!r}; expected a positive integer")
    if not (isinstance(unused, list) and all(isinstance(i, int) and i >= 0 for i in unused)):
        raise ValueError(f"hybrid.unused_ids {unused!r}; expected token ids")
    if not isinstance(raw.get("dimension"), int):
        raise ValueError("a hybrid model needs its dense width, `dimension`")
    return {"hybrid": {"colbert_dim": dim, "unused_ids": list(unused)}}


VECTORS = {"type": "array", "items": {"type": "array", "items": NUMBER}}
SPARSE = {
    "type": "object",
    "description": "non-zero weights by ascending token id: `indices` + `values`, or `sparse` (Milvus)",
    "properties": {
        "indices": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "values": {"type": "array", "items": NUMBER},
        "sparse": {"type": "object", "additionalProperties": NUMBER},
    },
}
SPEC = TaskSpec(
    name=HybridTask.name,
    factory=HybridTask,
    request={
        "title": "hybrid",
        "anyOf": [
            {
                "type": "object",
                "required": ["inputs"],
                "properties": {
                    "inputs": TEXTS,
                    "model": MODEL,
                    "return_dense": FLAG,
                    "return_sparse": FLAG,
                    "return_colbert_vecs": FLAG,
                    "top_k": POSITIVE,
                    "sparse_format": nullable({"enum": list(SPARSE_FORMATS)}),
                    "input_type": nullable({"enum": list(INPUT_TYPES)}),
                },
            },
            {
                "type": "object",
                "required": ["query", "documents"],
                "properties": {
                    "query": STRING,
                    "documents": {"type": "array"},
                    "top_n": POSITIVE,
                    "return_documents": FLAG,
                    "model": MODEL,
                },
            },
        ],
    },
    example={"inputs": "hello", "return_dense": True, "return_sparse": True, "return_colbert_vecs": True},
    answer={
        "title": "hybrid",
        "type": "object",
        "required": ["model", "usage"],  # and the outputs asked for, or `embeddings`, or `results`
        "properties": {
            "dense_vecs": VECTORS,
            "lexical_weights": {"type": "array", "items": SPARSE},
            "colbert_vecs": {"type": "array", "items": VECTORS},
            "embeddings": {"type": "array", "items": {"anyOf": [{"type": "array"}, SPARSE]}},
            "results": {"type": "array", "items": RERANK_RESULT},
            "model": STRING,
            "usage": USAGE,
        },
    },
    fields=manifest_fields,
    routes=("/v1/embeddings", "/embed", "/embed_sparse", "/rerank", "/v1/rerank", "/v2/rerank", *TEXT_ROUTES),
    batches=True,
    tei_kind="embedding",
    tei_info=lambda manifest: {"pooling": "cls"},
    tei_info_schema={"type": "object", "required": ["pooling"], "properties": {"pooling": STRING}},
)
