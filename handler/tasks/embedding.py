"""`embedding`: {"inputs": ["text", ...], "prompt_name"?, "prompt"?, "dimensions"?, "encoding_format"?}
→ {"embeddings": [[...]] | ["<base64>"], "model": "id@version", "usage": {"tokens": n}}. The vectors are a
float32 array in the answer, written as JSON once, at the edge (`handler.api.encode`)."""

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
from handler.tasks.batch import Prepared
from handler.tasks.spec import MODEL, POSITIVE, STRING, TEXTS, USAGE, VECTOR_OR_BASE64, TaskSpec, nullable
from handler.tasks.text import (
    TEXT_ROUTES,
    TextModel,
    base64_rows,
    check_texts,
    encoding_format,
    joined,
    positive_int,
    prompt_for,
    require_object,
)

if TYPE_CHECKING:  # types only: numpy.typing's import dedents docstrings with regexes, at init
    import numpy.typing as npt


class EmbeddingTask(TextModel):
    """`{"inputs", "prompt_name"?, "prompt"?, "dimensions"?, "encoding_format"?}` → one vector per input,
    pooled (and normalized) in the model as its sentence-transformers modules say."""

    name = "embedding"

    def __init__(self, manifest: Manifest, backend: Backend, config: Config, pool: BufferPool | None = None) -> None:
        super().__init__(manifest, backend, config, pool)
        width = manifest.outputs[0].shape[-1] if manifest.outputs[0].shape else None
        self.dimension = manifest.dimension or (width if isinstance(width, int) else None)
        self.normalize = bool(manifest.pooling.get("normalize", True))
        self.prompts: dict[str, str] = manifest.options.get("prompts", {})
        self.default_prompt: str | None = manifest.options.get("default_prompt_name")

    def texts(self, payload: JSON) -> list[str]:
        return check_texts(require_object(payload, "inputs")["inputs"], "inputs", self.max_inputs, self.max_chars)

    def embed(self, texts: list[str]) -> tuple[npt.NDArray[np.float32], int]:
        return self.run_copy(texts)

    def _shorten(self, vectors: npt.NDArray[np.float32], dimensions: int) -> npt.NDArray[np.float32]:
        """Matryoshka: the first `dimensions` components, renormalized when the model's vectors are."""
        if dimensions > vectors.shape[1]:
            raise InvalidInputError(f'"dimensions" is {dimensions}; valid: an integer, 1 to {vectors.shape[1]}')
        cut = vectors[:, :dimensions]
        if not self.normalize:
            return cut
        norms = np.linalg.norm(cut, axis=1, keepdims=True)
        return (cut / np.where(norms > 0, norms, 1)).astype(np.float32)

    def _options(self, payload: JSON) -> tuple[list[str], int | None, str]:
        """The request's texts (prompt prepended), `dimensions` and encoding format, checked."""
        texts = self.texts(payload)
        body = require_object(payload, "inputs")
        prompt = self.prompt(body)
        joined(prompt, texts, "the prompt", "inputs", self.max_chars)  # prepended to every input
        dimensions = positive_int(body, "dimensions", self.dimension)
        fmt = encoding_format(body)
        if prompt:
            texts = [prompt + text for text in texts]
        return texts, dimensions, fmt

    def _answer(
        self, vectors: npt.NDArray[np.float32], tokens: int, dimensions: int | None, fmt: str
    ) -> dict[str, Any]:
        if dimensions is not None:
            vectors = self._shorten(vectors, dimensions)
        finite(vectors, "vectors")
        # Copied (or base64-encoded) before the buffers go back: the answer never aliases the pool.
        embeddings = base64_rows(vectors) if fmt == "base64" else np.array(vectors, dtype=np.float32)
        return {"embeddings": embeddings, "model": self.model, "usage": {"tokens": tokens}}

    def __call__(self, payload: JSON) -> dict[str, Any]:
        texts, dimensions, fmt = self._options(payload)
        with self.pool.request():
            vectors, tokens = self._run(texts)
            return self._answer(vectors, tokens, dimensions, fmt)

    def prepare(self, payload: JSON) -> Prepared:
        """The request checked and tokenized on its own, for a batch of several (`handler.tasks.batch`);
        its `dimensions` and format are applied to its own rows only."""
        texts, dimensions, fmt = self._options(payload)
        if dimensions is not None and self.dimension is not None and dimensions > self.dimension:
            self._shorten(np.zeros((0, self.dimension), np.float32), dimensions)  # its error, before the run
        encodings = self.encoder.tokenize(texts)
        return Prepared(encodings, lambda rows, tokens: self._answer(rows, tokens, dimensions, fmt))

    def warmup(self) -> None:
        # A single query and a padded batch: touches every weight page, grows the arena and runs both the
        # batch-1 and the masked path. Longer shapes measured no faster afterwards on CPU, so they'd only cost.
        self.embed(["warm-up"])
        self.embed(["warm-up query", "a slightly longer warm-up passage, so the batch needs padding"])

    def prompt(self, body: dict[str, Any]) -> str:
        """The prompt this request's texts get in front (`prompt_name`'s, `prompt`, or the model's default)."""
        return prompt_for(body, self.prompts, self.default_prompt, self.max_chars)


POOLING_MODES = ("mean", "cls", "max", "lasttoken")


def manifest_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """`pooling.mode`, `prompts` (name → text prepended) and `default_prompt_name`, checked."""
    mode = (raw.get("pooling") or {}).get("mode")
    if mode is not None and mode not in POOLING_MODES:
        raise ValueError(f"pooling mode {mode!r}; valid: {', '.join(POOLING_MODES)}")
    prompts = raw.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ValueError("prompts must be an object of prompt name → text")
    default = raw.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ValueError(f"default_prompt_name {default!r} is not among prompts {sorted(prompts)}")
    return {"prompts": dict(prompts), "default_prompt_name": default}


SPEC = TaskSpec(
    name=EmbeddingTask.name,
    factory=EmbeddingTask,
    oip="TextsToVectors",
    request={
        "title": "embedding",
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "inputs": TEXTS,
            "model": MODEL,
            "dimensions": POSITIVE,
            "encoding_format": nullable({"enum": ["float", "base64"]}),
            "prompt_name": nullable(STRING),
            "prompt": nullable(STRING),
        },
    },
    example={"inputs": "hello"},
    answer={
        "title": "embedding",
        "type": "object",
        "required": ["embeddings", "model", "usage"],
        "properties": {"embeddings": {"type": "array", "items": VECTOR_OR_BASE64}, "model": STRING, "usage": USAGE},
    },
    fields=manifest_fields,
    routes=("/v1/embeddings", "/v2/embed", "/embed", "/similarity", *TEXT_ROUTES),
    batches=True,
    tei_kind="embedding",
    tei_info=lambda manifest: {"pooling": manifest.pooling.get("mode", "mean")},
    tei_info_schema={"type": "object", "required": ["pooling"], "properties": {"pooling": STRING}},
)
