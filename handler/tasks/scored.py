"""The scoring text tasks: rerank (a cross-encoder) and classify (a sequence classifier).

`rerank`:   {"query", "documents": ["...", ...], "top_n"?, "return_documents"?, "instruction"? (a decoder reranker
            whose template has an instruction slot: replaces its default prompt)}
            → {"results": [{"index", "relevance_score", "document"?: {"text"}}], "model", "usage"}, highest
            score first (Cohere's, Jina's and vLLM's shape); the scores are the model's own output, activation
            included, as `CrossEncoder.predict` gives them.
`classify`: {"inputs": [...], "top_k"?} → {"predictions": [[{"label", "score"}, ...], ...], "model", "usage"},
            softmax (single label) or sigmoid (multi label) over the logits, as `transformers`' pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from handler.backends.contract import Backend
from handler.backends.pool import BufferPool
from handler.core.config import Config
from handler.core.errors import InvalidInputError, TooManyInputsError
from handler.core.manifest import Manifest
from handler.core.types import JSON
from handler.tasks.arrays import finite
from handler.tasks.batch import Prepared
from handler.tasks.lm_pairs import PairTemplate, template_fields
from handler.tasks.scoring import rank, sigmoid, softmax
from handler.tasks.spec import FLAG, LABELS, MODEL, NUMBER, POSITIVE, STRING, TEXTS, USAGE, TaskSpec
from handler.tasks.text import (
    TEXT_ROUTES,
    Text,
    TextModel,
    check_text,
    check_texts,
    flag,
    joined,
    positive_int,
    require_object,
)


class RerankTask(TextModel):
    name = "rerank"

    def __init__(self, manifest: Manifest, backend: Backend, config: Config, pool: BufferPool | None = None) -> None:
        super().__init__(manifest, backend, config, pool)
        fields = manifest.options.get("pair_template")  # a decoder reranker: each pair is one templated text
        self.template = PairTemplate(fields) if fields else None

    def tokenize(self, texts: Sequence[Text]) -> list[Any]:
        if self.template is None:
            return self.encoder.tokenize(texts)
        if all(isinstance(t, str) for t in texts):  # already formatted: a request with an instruction
            return self.template.restore(self.encoder.tokenize(texts), self.encoder.max_length)
        formatted = self.template.texts(texts)  # type: ignore[arg-type]  # a reranker's inputs are pairs
        return self.template.restore(self.encoder.tokenize(formatted), self.encoder.max_length)

    def documents(self, body: dict[str, Any]) -> list[str]:
        """Strings, or Cohere's `{"text": "..."}` objects; WARMSTART_MAX_INPUTS counts documents."""
        docs = require_object(body, "documents")["documents"]
        if not isinstance(docs, list):
            raise InvalidInputError(f'"documents" must be a list of strings, got {type(docs).__name__}')
        if not docs:
            raise InvalidInputError('"documents" is empty; send at least one string')
        if len(docs) > self.max_inputs:
            raise TooManyInputsError(
                f"{len(docs)} documents; at most {self.max_inputs} per request (WARMSTART_MAX_INPUTS)"
            )
        return [
            check_text(d["text"] if isinstance(d, dict) and "text" in d else d, f"documents[{i}]", self.max_chars)
            for i, d in enumerate(docs)
        ]

    def _options(self, payload: JSON) -> tuple[list[Text], list[str], int | None, bool]:
        """The request's (query, document) pairs (formatted texts with an `instruction`), documents, `top_n` and
        `return_documents`, checked."""
        body = require_object(payload, "query")
        query = check_text(body["query"], "query", self.max_chars)
        docs = self.documents(body)
        joined(query, docs, "query", "documents", self.max_chars)  # the query goes with every document
        top_n = positive_int(body, "top_n")  # more than there are documents: all of them
        with_docs = flag(body, "return_documents")
        pairs = [(query, doc) for doc in docs]
        instruction = body.get("instruction")
        if instruction is None:
            return list(pairs), docs, top_n, with_docs
        if self.template is None or self.template.instruction is None:
            what = "a cross-encoder" if self.template is None else "a decoder reranker without an instruction slot"
            raise InvalidInputError(f'"instruction" is not supported: {self.model} is {what}; leave it out')
        instruction = check_text(instruction, "instruction", self.max_chars)
        if not instruction:  # CrossEncoder.predict renders an empty prompt as no system message, not a filled slot
            raise InvalidInputError('"instruction" is empty; leave it out for the model\'s default prompt')
        return list(self.template.texts(pairs, instruction)), docs, top_n, with_docs

    def prepare(self, payload: JSON) -> Prepared:
        """The request checked and tokenized on its own, for a batch of several (`handler.tasks.batch`)."""
        pairs, docs, top_n, with_docs = self._options(payload)

        def finish(scores: Any, tokens: int) -> dict[str, Any]:
            return self._answer(scores, tokens, docs, top_n, with_docs)

        return Prepared(self.tokenize(pairs), finish)

    def _answer(self, scores: Any, tokens: int, docs: list[str], top_n: int | None, with_docs: bool) -> dict[str, Any]:
        scores = finite(scores.reshape(len(docs)), "scores")
        order = rank(scores, top_n)
        values = scores[order]  # a copy (float32: written at its shortest by the edge's encoder)
        results: list[dict[str, Any]] = []
        for i, score in zip(order.tolist(), values, strict=True):
            item: dict[str, Any] = {"index": i, "relevance_score": score}
            if with_docs:
                item["document"] = {"text": docs[i]}
            results.append(item)
        return {"results": results, "model": self.model, "usage": {"tokens": tokens}}

    def __call__(self, payload: JSON) -> dict[str, Any]:
        pairs, docs, top_n, with_docs = self._options(payload)
        scores, tokens = self.run_copy(pairs)
        return self._answer(scores, tokens, docs, top_n, with_docs)

    def warmup(self) -> None:
        # One pair, then a padded batch of two: both shapes a first real request takes.
        self.run_copy([("warm-up query", "warm-up")])
        self.run_copy([("warm-up query", "a"), ("warm-up query", "a slightly longer warm-up passage, so it pads")])


class ClassifyTask(TextModel):
    name = "classify"

    def __init__(self, manifest: Manifest, backend: Backend, config: Config, pool: BufferPool | None = None) -> None:
        super().__init__(manifest, backend, config, pool)
        self.labels: tuple[str, ...] = manifest.options["labels"]
        self.multi_label = manifest.options["problem_type"] == "multi_label_classification"

    def _options(self, payload: JSON) -> tuple[list[str], int | None]:
        """The request's texts and `top_k`, checked."""
        body = require_object(payload, "inputs")
        texts = check_texts(body["inputs"], "inputs", self.max_inputs, self.max_chars)
        return texts, positive_int(body, "top_k")  # top_k past the labels' count: all of them

    def prepare(self, payload: JSON) -> Prepared:
        """The request checked and tokenized on its own, for a batch of several (`handler.tasks.batch`)."""
        texts, top_k = self._options(payload)
        return Prepared(self.encoder.tokenize(texts), lambda logits, tokens: self._answer(logits, tokens, top_k))

    def _answer(self, logits: Any, tokens: int, top_k: int | None) -> dict[str, Any]:
        if logits.ndim != 2 or logits.shape[1] != len(self.labels):
            raise RuntimeError(f"the model gave logits of shape {list(logits.shape)} for {len(self.labels)} labels")
        finite(logits, "logits")
        probs = (sigmoid(logits) if self.multi_label else softmax(logits)).astype(np.float32)
        predictions = []
        for row in probs:
            order = rank(row, top_k)
            scores = row[order]
            predictions.append(
                [{"label": self.labels[j], "score": s} for j, s in zip(order.tolist(), scores, strict=True)]
            )
        return {"predictions": predictions, "model": self.model, "usage": {"tokens": tokens}}

    def __call__(self, payload: JSON) -> dict[str, Any]:
        texts, top_k = self._options(payload)
        logits, tokens = self.run_copy(texts)
        return self._answer(logits, tokens, top_k)

    def warmup(self) -> None:
        self.run_copy(["warm-up"])
        self.run_copy(["warm-up", "a slightly longer warm-up passage, so the batch needs padding"])


ACTIVATIONS = ("sigmoid", "identity")  # rerank: what the graph applied to the single logit
PROBLEM_TYPES = ("single_label_classification", "multi_label_classification")  # classify: softmax | sigmoid


def rerank_fields(raw: dict[str, Any]) -> dict[str, Any]:
    activation = raw.get("activation")
    if activation is None:
        raise ValueError(f"a rerank model needs 'activation'; valid: {', '.join(ACTIVATIONS)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r}; valid: {', '.join(ACTIVATIONS)}")
    template = raw.get("pair_template")  # a decoder reranker's (handler.tasks.lm_pairs)
    return {"activation": activation, **({"pair_template": template_fields(template)} if template else {})}


def classify_fields(raw: dict[str, Any]) -> dict[str, Any]:
    labels = raw.get("labels")
    if not isinstance(labels, list) or not labels or not all(isinstance(x, str) for x in labels):
        raise ValueError("a classify model needs 'labels': a non-empty list of label names in id order")
    problem_type = raw.get("problem_type")
    if problem_type is not None and problem_type not in PROBLEM_TYPES:
        raise ValueError(f"problem_type {problem_type!r}; valid: {', '.join(PROBLEM_TYPES)}")
    return {"labels": tuple(labels), "problem_type": problem_type or PROBLEM_TYPES[0]}


def labels_info(labels: tuple[str, ...]) -> dict[str, Any]:
    """TEI's `/info` id2label and label2id."""
    return {
        "id2label": {str(i): label for i, label in enumerate(labels)},
        "label2id": {label: i for i, label in enumerate(labels)},
    }


RERANK_RESULT = {
    "type": "object",
    "required": ["index", "relevance_score"],
    "properties": {
        "index": {"type": "integer", "minimum": 0},
        "relevance_score": NUMBER,
        "document": {"type": "object", "required": ["text"], "properties": {"text": STRING}},
    },
}
PREDICTION = {"type": "object", "required": ["label", "score"], "properties": {"label": STRING, "score": NUMBER}}

RERANK = TaskSpec(
    name=RerankTask.name,
    factory=RerankTask,
    oip="QueryToScores",
    request={
        "title": "rerank",
        "type": "object",
        "required": ["query", "documents"],
        "properties": {
            "query": STRING,
            "documents": {"type": "array"},
            "top_n": POSITIVE,
            "return_documents": FLAG,
            "instruction": STRING,
            "model": MODEL,
        },
    },
    example={"query": "what is a cold start?", "documents": ["the first request of a new instance", "a warm call"]},
    answer={
        "title": "rerank",
        "type": "object",
        "required": ["results", "model", "usage"],
        "properties": {"results": {"type": "array", "items": RERANK_RESULT}, "model": STRING, "usage": USAGE},
    },
    fields=rerank_fields,
    routes=("/rerank", "/v1/rerank", "/v2/rerank", *TEXT_ROUTES),
    batches=True,
    tei_kind="reranker",
    tei_info=lambda manifest: labels_info(("LABEL_0",)),  # one score: TEI names it LABEL_0
    tei_info_schema=LABELS,
)

CLASSIFY = TaskSpec(
    name=ClassifyTask.name,
    factory=ClassifyTask,
    oip="TextsToLabelScores",
    request={
        "title": "classify",
        "type": "object",
        "required": ["inputs"],
        "properties": {"inputs": TEXTS, "top_k": POSITIVE, "model": MODEL},
    },
    example={"inputs": "hello"},
    answer={
        "title": "classify",
        "type": "object",
        "required": ["predictions", "model", "usage"],
        "properties": {
            "predictions": {"type": "array", "items": {"type": "array", "items": PREDICTION}},
            "model": STRING,
            "usage": USAGE,
        },
    },
    fields=classify_fields,
    routes=("/predict", *TEXT_ROUTES),
    batches=True,
    tei_kind="classifier",
    tei_info=lambda manifest: labels_info(manifest.options.get("labels") or ("LABEL_0",)),
    tei_info_schema=LABELS,
)
