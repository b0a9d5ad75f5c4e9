"""`embedding`: {"inputs": ["text", ...], "prompt_name"?, "prompt"?, "dimensions"?, "encoding_format"?}
→ {"embeddings": [[...]] | ["<base64>"], "model": "id@version", "usage": {"tokens": n}}. The vectors are a
float32 array in the answer, written as JSON once, at the edge (`handler.api.encode`).

A lean start (`handler.core.numpy_gate`: a Lambda start that leaves numpy out) answers a plain request (no
`dimensions`, float format) without numpy: the tokenizer's ids go to the backend as `array('q')` buffers and the
vectors come back as float32 bytes (`TextModel.run_lean`), written by `handler.core.f32` with the numpy path's
bytes. Any other request, or a backend that cannot run without numpy, imports numpy first (`numpy_gate.need`)."""

from __future__ import annotations

from math import isfinite
from typing import TYPE_CHECKING, Any

from handler.backends.contract import Backend
from handler.backends.pool import BufferPool
from handler.core import numpy_gate
from handler.core.config import Config
from handler.core.errors import InvalidInputError
from handler.core.f32 import F32Rows
from handler.core.manifest import Manifest
from handler.core.types import JSON
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

if TYPE_CHECKING:  # types only: numpy.typing's import dedents docstrings with regexes, at init; numpy, tasks.arrays
    # and tasks.batch (which import numpy) are imported where they run: a lean start has no numpy
    import numpy as np
    import numpy.typing as npt

    from handler.tasks.batch import Prepared


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
        import numpy as np  # deferred: see the TYPE_CHECKING import

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
        import numpy as np  # deferred: see the TYPE_CHECKING import

        from handler.tasks.arrays import finite

        if dimensions is not None:
            vectors = self._shorten(vectors, dimensions)
        finite(vectors, "vectors")
        # Copied (or base64-encoded) before the buffers go back: the answer never aliases the pool.
        embeddings = base64_rows(vectors) if fmt == "base64" else np.array(vectors, dtype=np.float32)
        return {"embeddings": embeddings, "model": self.model, "usage": {"tokens": tokens}}

    def __call__(self, payload: JSON) -> dict[str, Any]:
        texts, dimensions, fmt = self._options(payload)
        if numpy_gate.lean():
            if dimensions is None and fmt == "float":
                answer = self._answer_lean(texts)
                if answer is not None:
                    return answer
            numpy_gate.need()  # a request the numpy-free path does not serve: numpy from here on
        with self.pool.request():
            vectors, tokens = self._run(texts)
            return self._answer(vectors, tokens, dimensions, fmt)

    def _answer_lean(self, texts: list[str]) -> dict[str, Any] | None:
        """The answer without numpy (the module's docstring); None where the backend cannot serve it so."""
        got = self.run_lean(texts)
        if got is None:
            return None
        values, width, tokens = got
        if not all(map(isfinite, values)):  # refused with the numpy path's own message (a rare, failing request)
            numpy_gate.need()
            import numpy as np

            from handler.tasks.arrays import finite

            finite(np.frombuffer(values, np.float32).reshape(-1, width), "vectors")
        return {"embeddings": F32Rows(values, width), "model": self.model, "usage": {"tokens": tokens}}

    def prepare(self, payload: JSON) -> Prepared:
        """The request checked and tokenized on its own, for a batch of several (`handler.tasks.batch`);
        its `dimensions` and format are applied to its own rows only."""
        import numpy as np  # deferred: see the TYPE_CHECKING import

        from handler.tasks.batch import Prepared

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
    lean=True,
    tei_kind="embedding",
    tei_info=lambda manifest: {"pooling": manifest.pooling.get("mode", "mean")},
    tei_info_schema={"type": "object", "required": ["pooling"], "properties": {"pooling": STRING}},
)
