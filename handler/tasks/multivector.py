"""`multivector`: ColBERT-style late interaction (a PyLate model packed by `pack --from`).

Vectors: {"inputs": ["text", ...], "input_type"?: "document" | "query", "encoding_format"?}
         → {"embeddings": [[[...], ...], ...] (one unit vector per kept token, per input) | ["<base64>"], "model",
         "usage"}.
Rerank:  {"query", "documents", "top_n"?, "return_documents"?} → the rerank answer (`handler.tasks.scored`), each
         score the MaxSim of the query's and the document's token vectors (for each query token its best
         dot product over the document's tokens, summed), computed here after the model run.

Texts are tokenized as PyLate's `ColBERT.tokenize` does: truncated one short of the query (document) length, the
marker token put after the first, a query padded to its length with the expansion (mask) token when the model
expands queries (attended to or not, as it says). The graph gives every position's projected, unit-length
vector; this module keeps a query's every position (expanded) or its real ones, and a document's real tokens
that are not on the skip-list (punctuation), as `ColBERT.encode` does.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from handler.backends.contract import Backend
from handler.backends.pool import BufferPool
from handler.core.config import Config
from handler.core.errors import InvalidInputError, TooManyInputsError
from handler.core.manifest import Manifest
from handler.core.types import JSON
from handler.tasks.arrays import finite
from handler.tasks.batch import Prepared, run_prepared
from handler.tasks.scored import RERANK_RESULT
from handler.tasks.scoring import rank
from handler.tasks.spec import FLAG, MODEL, NUMBER, POSITIVE, STRING, TEXTS, USAGE, TaskSpec, nullable
from handler.tasks.text import (
    TEXT_ROUTES,
    TextModel,
    check_text,
    check_texts,
    choice,
    encoding_format,
    flag,
    positive_int,
    require_object,
)
from handler.tasks.tokens import Kept, shared_encoder, usable_shortcut

if TYPE_CHECKING:  # types only: numpy.typing's import dedents docstrings with regexes, at init
    import numpy.typing as npt

INPUT_TYPES = ("document", "query")


class Rows:
    """One request's rows for the model (`Kept` encodings, padded to its longest) and, per row, the positions
    whose vectors it keeps."""

    __slots__ = ("encodings", "keep")

    def __init__(self) -> None:
        self.encodings: list[Kept] = []
        self.keep: list[npt.NDArray[np.intp]] = []


class MultiVectorTask(TextModel):
    name = "multivector"

    def __init__(self, manifest: Manifest, backend: Backend, config: Config, pool: BufferPool | None = None) -> None:
        super().__init__(manifest, backend, config, pool)  # its encoder: documents' truncation (the manifest's)
        late = manifest.options["late_interaction"]
        self.query_prefix: int | None = late["query_prefix_id"]
        self.document_prefix: int | None = late["document_prefix_id"]
        self.query_length: int = late["query_length"]
        self.expansion: bool = late["query_expansion"]
        self.attend: bool = late["attend_to_expansion"]
        self.expansion_id: int = late["expansion_id"] if late["expansion_id"] is not None else self.encoder.pad_id
        self.skip = np.asarray(late["skip_ids"], dtype=np.int64)
        tok = manifest.tokenizer
        name = tok.get("file", "tokenizer.json")
        entry = manifest.files.get(name)
        vocab, _ = usable_shortcut(manifest.root, tok, manifest.files)
        shortcut = (vocab, tok["shortcut"]["settings"]) if vocab and config.tokenizer_shortcut else None
        # Queries are cut shorter than documents: a second encoder, the same tokenizer file (shared by key).
        self.queries = shared_encoder(
            manifest.path(name),
            self.query_length - (self.query_prefix is not None),
            int(tok.get("pad_id", 0)),
            entry.sha256 if entry else None,
            shortcut,
        )

    # -- tokens, as PyLate lays them out ----------------------------------------------------------------------

    def rows(self, texts: Sequence[str], query: bool, into: Rows | None = None) -> Rows:
        out = into or Rows()
        # sentence-transformers' Transformer strips each text before tokenizing (PyLate tokenizes through it).
        stripped = [t.strip() for t in texts]
        encodings = (self.queries if query else self.encoder).tokenize(stripped)
        prefix = self.query_prefix if query else self.document_prefix
        for e in encodings:
            real = int(sum(e.attention_mask))
            ids = list(e.ids[:real])
            if prefix is not None:
                ids.insert(1, prefix)
            n = len(ids)
            mask = [1] * n
            if query and self.expansion and n < self.query_length:
                pad = self.query_length - n
                ids += [self.expansion_id] * pad
                mask += [int(self.attend)] * pad
            ids_array = np.asarray(ids, dtype=np.int64)
            if query:  # an expanded query keeps every position (its expansion too); else its real tokens
                keep = np.arange(len(ids) if self.expansion else n)
            else:
                keep = np.flatnonzero(~np.isin(ids_array, self.skip))
            out.encodings.append(Kept(ids, mask, [0] * len(ids)))
            out.keep.append(keep)
        return out

    @staticmethod
    def padded(rows: Rows, pad_id: int) -> Rows:
        """Its rows padded to its own longest (masked), as one tokenizer call pads a batch."""
        longest = max(len(k.ids) for k in rows.encodings)
        for k in rows.encodings:
            extra = longest - len(k.ids)
            if extra:
                k.ids += [pad_id] * extra
                k.attention_mask += [0] * extra
                k.type_ids += [0] * extra
        return rows

    # -- requests ---------------------------------------------------------------------------------------------

    def documents(self, body: dict[str, Any]) -> list[str]:
        """Strings, or Cohere's `{"text": "..."}` objects; WARMSTART_MAX_INPUTS counts documents."""
        docs = require_object(body, "documents")["documents"]
        if not isinstance(docs, list) or not docs:
            raise InvalidInputError('"documents" must be a non-empty list of strings')
        if len(docs) > self.max_inputs:
            raise TooManyInputsError(
                f"{len(docs)} documents; at most {self.max_inputs} per request (WARMSTART_MAX_INPUTS)"
            )
        return [
            check_text(d["text"] if isinstance(d, dict) and "text" in d else d, f"documents[{i}]", self.max_chars)
            for i, d in enumerate(docs)
        ]

    def prepare(self, payload: JSON) -> Prepared:
        """The request checked and tokenized on its own, for a batch of several (`handler.tasks.batch`)."""
        if isinstance(payload, dict) and "query" in payload and "inputs" not in payload:
            return self._prepare_rerank(payload)
        body = require_object(payload, "inputs")
        texts = check_texts(body["inputs"], "inputs", self.max_inputs, self.max_chars)
        query = choice(body, "input_type", INPUT_TYPES, "document") == "query"
        fmt = encoding_format(body)
        rows = self.padded(self.rows(texts, query), self.encoder.pad_id)

        def finish(out: npt.NDArray[Any], tokens: int) -> dict[str, Any]:
            vectors = self._kept(out, rows.keep)
            data: list[Any] = [_base64(v) for v in vectors] if fmt == "base64" else vectors
            return {"embeddings": data, "model": self.model, "usage": {"tokens": tokens}}

        return Prepared(rows.encodings, finish)

    def _prepare_rerank(self, body: dict[str, Any]) -> Prepared:
        query = check_text(body["query"], "query", self.max_chars)
        docs = self.documents(body)
        top_n = positive_int(body, "top_n")  # more than there are documents: all of them
        with_docs = flag(body, "return_documents")
        rows = self.padded(self.rows(docs, False, self.rows([query], True)), self.encoder.pad_id)

        def finish(out: npt.NDArray[Any], tokens: int) -> dict[str, Any]:
            q, *vectors = self._kept(out, rows.keep)
            scores = np.array([maxsim(q, d) for d in vectors], dtype=np.float32)
            results: list[dict[str, Any]] = []
            for i in rank(scores, top_n).tolist():
                item: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
                if with_docs:
                    item["document"] = {"text": docs[i]}
                results.append(item)
            return {"results": results, "model": self.model, "usage": {"tokens": tokens}}

        return Prepared(rows.encodings, finish)

    @staticmethod
    def _kept(out: npt.NDArray[Any], keep: list[npt.NDArray[np.intp]]) -> list[npt.NDArray[np.float32]]:
        """Each row's kept vectors, copied out of the pooled buffer (fancy indexing copies)."""
        return [finite(np.asarray(out[r, k], dtype=np.float32), "vectors") for r, k in enumerate(keep)]

    def __call__(self, payload: JSON) -> dict[str, Any]:
        (answer,) = run_prepared(self, [self.prepare(payload)], self.batch_tokens)
        if isinstance(answer, Exception):
            raise answer
        result: dict[str, Any] = answer
        return result

    def warmup(self) -> None:
        # A query (expanded to its length) and a padded pair of documents: the shapes a first request takes.
        self({"query": "warm-up query", "documents": ["warm-up", "a slightly longer warm-up passage, so it pads"]})


def maxsim(query: npt.NDArray[np.float32], document: npt.NDArray[np.float32]) -> float:
    """Late interaction: for each query vector its largest dot product with a document vector, summed (PyLate's
    `colbert_scores`). A document with no vector left (all skip-list tokens) scores 0."""
    if not len(document) or not len(query):
        return 0.0
    return float((query @ document.T).max(axis=1).sum(dtype=np.float64))


def _base64(matrix: npt.NDArray[np.float32]) -> str:
    """A text's vectors as base64 of their little-endian float32 bytes, row after row."""
    return base64.b64encode(np.ascontiguousarray(matrix, dtype="<f4").tobytes()).decode("ascii")


LATE_KEYS: dict[str, Any] = {
    "query_length": int,
    "document_length": int,
    "query_expansion": bool,
    "attend_to_expansion": bool,
    "query_prefix_id": (int, type(None)),
    "document_prefix_id": (int, type(None)),
    "expansion_id": (int, type(None)),
    "skip_ids": list,
}


def manifest_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """`late_interaction` (PyLate's settings with their token ids, written by `pack --from`), checked."""
    late = raw.get("late_interaction")
    if not isinstance(late, dict):
        raise ValueError("a multivector model needs 'late_interaction': PyLate's settings (pack --from writes it)")
    for key, kind in LATE_KEYS.items():
        if key not in late or not isinstance(late[key], kind) or (kind is int and isinstance(late[key], bool)):
            raise ValueError(f"late_interaction.{key} {late.get(key)!r}; expected {getattr(kind, '__name__', kind)}")
    if not all(isinstance(i, int) and i >= 0 for i in late["skip_ids"]):
        raise ValueError("late_interaction.skip_ids must be token ids")
    for key in ("query_length", "document_length"):
        if late[key] < 2:
            raise ValueError(f"late_interaction.{key} {late[key]}; valid: 2 or more")
    return {"late_interaction": dict(late)}


TOKEN_VECTORS = {"type": "array", "items": {"type": "array", "items": NUMBER}}
SPEC = TaskSpec(
    name=MultiVectorTask.name,
    factory=MultiVectorTask,
    request={
        "title": "multivector",
        "anyOf": [
            {
                "type": "object",
                "required": ["inputs"],
                "properties": {
                    "inputs": TEXTS,
                    "input_type": nullable({"enum": list(INPUT_TYPES)}),
                    "encoding_format": nullable({"enum": ["float", "base64"]}),
                    "model": MODEL,
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
    example={"query": "what is a cold start?", "documents": ["the first request of a new instance", "a warm call"]},
    answer={
        "title": "multivector",
        "anyOf": [
            {
                "type": "object",
                "required": ["embeddings", "model", "usage"],
                "properties": {
                    "embeddings": {"type": "array", "items": {"anyOf": [TOKEN_VECTORS, STRING]}},
                    "model": STRING,
                    "usage": USAGE,
                },
            },
            {
                "type": "object",
                "required": ["results", "model", "usage"],
                "properties": {"results": {"type": "array", "items": RERANK_RESULT}, "model": STRING, "usage": USAGE},
            },
        ],
    },
    fields=manifest_fields,
    routes=("/rerank", "/v1/rerank", "/v2/rerank", *TEXT_ROUTES),
    batches=True,
    tei_info=lambda manifest: {
        "dimension": manifest.dimension,
        "query_length": manifest.options["late_interaction"]["query_length"],
        "document_length": manifest.options["late_interaction"]["document_length"],
    },
    tei_info_schema={
        "type": "object",
        "required": ["query_length", "document_length"],
        "properties": {"dimension": nullable({"type": "integer"}), "query_length": NUMBER, "document_length": NUMBER},
    },
)
