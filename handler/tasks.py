"""Tasks: validate a request's JSON, turn it into backend feeds, and the outputs into the response.

`embedding`: {"inputs": ["text", ...]} → {"embeddings": [[...]], "model": "id@version"}.
`tensor`:    {"inputs": {"name": nested list | {"npy": "<base64 .npy>"}}, "output_format": "list" | "npy"}
             → {"outputs": {"name": ...}, "model": "id@version"}; dtypes and shapes checked against the manifest.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from handler.arrays import from_list, from_npy
from handler.backends import Backend
from handler.config import Config
from handler.errors import InputTooLongError, InvalidEncodingError, InvalidInputError, TooManyInputsError
from handler.manifest import Manifest, TensorSpec
from handler.pool import BufferPool, current_arena
from handler.tokens import shared_encoder, usable_shortcut
from handler.types import JSON, Arrays

OUTPUT_FORMATS = ("list", "npy")


class Task(Protocol):
    name: str

    def __call__(self, payload: JSON) -> dict[str, Any]: ...

    def warmup(self) -> None: ...


class TaskFactory(Protocol):
    def __call__(
        self, manifest: Manifest, backend: Backend, config: Config, pool: BufferPool | None = None
    ) -> Task: ...


def _require_object(payload: JSON) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise InvalidInputError(f'request must be a JSON object with "inputs", got {type(payload).__name__}')
    if "inputs" not in payload:
        raise InvalidInputError('request has no "inputs" field')
    return payload


class EmbeddingTask:
    name = "embedding"

    def __init__(self, manifest: Manifest, backend: Backend, config: Config, pool: BufferPool | None = None) -> None:
        tok = manifest.tokenizer
        max_length = int(tok.get("truncation") or manifest.max_seq_length or 512)
        name = tok.get("file", "tokenizer.json")
        entry = manifest.files.get(name)
        # Shared with a loaded version whose tokenizer file has the same SHA-256 and settings: a reload to
        # such a version neither parses nor drops a tokenizer (each holds the GIL for milliseconds).
        # A WordPiece tokenizer built from the vocabulary, where a pack-time proof says it is the same (faster).
        vocab, why = usable_shortcut(manifest.root, tok, manifest.files)
        shortcut = (vocab, tok["shortcut"]["settings"]) if vocab and config.tokenizer_shortcut else None
        self.encoder = shared_encoder(
            manifest.path(name), max_length, int(tok.get("pad_id", 0)), entry.sha256 if entry else None, shortcut
        )
        if shortcut is None and not self.encoder.coldstart.get("shortcut"):
            self.encoder.coldstart["reason"] = (
                why if config.tokenizer_shortcut else "off (WARMSTART_TOKENIZER_SHORTCUT=0)"
            )
        self.backend = backend
        self.model = manifest.key
        self.output = manifest.outputs[0].name
        self.max_inputs = config.max_inputs
        self.max_chars = config.max_chars
        self.pool = pool or BufferPool()

    def texts(self, payload: JSON) -> list[str]:
        inputs = _require_object(payload)["inputs"]
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list):
            raise InvalidInputError(f'"inputs" must be a list of strings, got {type(inputs).__name__}')
        if not inputs:
            raise InvalidInputError('"inputs" is empty; send at least one string')
        if len(inputs) > self.max_inputs:
            raise TooManyInputsError(
                f"{len(inputs)} inputs; at most {self.max_inputs} per request (WARMSTART_MAX_INPUTS)"
            )
        for i, text in enumerate(inputs):
            if not isinstance(text, str):
                raise InvalidInputError(f"inputs[{i}] must be a string, got {type(text).__name__}")
            if len(text) > self.max_chars:
                raise InputTooLongError(
                    f"inputs[{i}] has {len(text)} characters; at most {self.max_chars} (WARMSTART_MAX_CHARS)"
                )
            if not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as e:  # a lone surrogate from a JSON escape such as "\ud800"
                    raise InvalidEncodingError(f"inputs[{i}] is not valid Unicode: {e.reason} at {e.start}") from None
        return inputs

    def _run(self, texts: list[str]) -> tuple[npt.NDArray[np.float32], int]:
        """Token ids and mask in pooled buffers, outputs bound to pooled buffers; the caller holds the arena."""
        encodings = self.encoder.tokenize(texts)
        arena = current_arena()
        assert arena is not None
        shape = (len(encodings), len(encodings[0].ids))
        ids, mask = arena.take(shape, np.int64), arena.take(shape, np.int64)
        self.encoder.fill(encodings, ids, mask)
        out = self.backend.run({"input_ids": ids, "attention_mask": mask})[self.output]
        return out, int(mask.sum())

    def embed(self, texts: list[str]) -> tuple[npt.NDArray[np.float32], int]:
        with self.pool.request():
            out, tokens = self._run(texts)
            return out.copy(), tokens  # a copy: the pooled buffer goes back when the arena closes

    def __call__(self, payload: JSON) -> dict[str, Any]:
        texts = self.texts(payload)
        with self.pool.request():
            vectors, tokens = self._run(texts)
            # tolist() copies into Python floats before the buffers go back: the response never aliases the pool.
            return {"embeddings": vectors.tolist(), "model": self.model, "usage": {"tokens": tokens}}

    def warmup(self) -> None:
        # A single query and a padded batch: touches every weight page, grows the arena and runs both the
        # batch-1 and the masked path. Longer shapes measured no faster afterwards on CPU, so they'd only cost.
        self.embed(["warm-up"])
        self.embed(["warm-up query", "a slightly longer warm-up passage, so the batch needs padding"])


class TensorTask:
    name = "tensor"

    def __init__(self, manifest: Manifest, backend: Backend, config: Config, pool: BufferPool | None = None) -> None:
        self.inputs = {s.name: s for s in manifest.inputs}
        self.outputs = [s.name for s in manifest.outputs]
        self.backend = backend
        self.model = manifest.key
        self.max_elements = config.max_elements
        self.pool = pool or BufferPool()

    def _array(self, name: str, value: JSON, spec: TensorSpec) -> npt.NDArray[Any]:
        dtype = np.dtype(spec.dtype)
        if isinstance(value, bytes):  # an `application/x-npy` body on the HTTP host (handler.media)
            array = from_npy(name, value, dtype, self.max_elements)
        elif isinstance(value, dict) and set(value) == {"npy"}:
            try:
                raw = base64.b64decode(value["npy"], validate=True)
            except (binascii.Error, ValueError, TypeError) as e:
                raise InvalidInputError(f"inputs.{name}: not a base64-encoded .npy array ({e})") from None
            array = from_npy(name, raw, dtype, self.max_elements)
        else:
            array = from_list(name, value, dtype, self.max_elements)
        if array.ndim != len(spec.shape) or any(
            isinstance(want, int) and want != got for want, got in zip(spec.shape, array.shape, strict=True)
        ):
            raise InvalidInputError(f"inputs.{name}: shape {list(array.shape)}, the model takes {list(spec.shape)}")
        return np.ascontiguousarray(array)

    def feeds(self, payload: JSON) -> tuple[Arrays, str]:
        body = _require_object(payload)
        inputs = body["inputs"]
        if not isinstance(inputs, dict):
            raise InvalidInputError(f'"inputs" must be an object of named tensors {sorted(self.inputs)}')
        missing, unknown = set(self.inputs) - set(inputs), set(inputs) - set(self.inputs)
        if missing or unknown:
            raise InvalidInputError(
                f"inputs must be exactly {sorted(self.inputs)}; missing {sorted(missing)}, unknown {sorted(unknown)}"
            )
        fmt = body.get("output_format", "list")
        if fmt not in OUTPUT_FORMATS:
            raise InvalidInputError(f"output_format {fmt!r}; valid: {', '.join(OUTPUT_FORMATS)}")
        arrays = {n: self._array(n, v, self.inputs[n]) for n, v in inputs.items()}
        # A symbolic dimension names one size across all inputs (ONNX's dim_param); "?" is unnamed.
        bound: dict[str, tuple[str, int]] = {}
        for name, array in arrays.items():
            for dim, size in zip(self.inputs[name].shape, array.shape, strict=True):
                if isinstance(dim, str) and dim != "?":
                    first, want = bound.setdefault(dim, (name, size))
                    if size != want:
                        raise InvalidInputError(
                            f"inputs.{name}: dimension {dim!r} is {size}, but inputs.{first} has it as {want}"
                        )
        return arrays, fmt

    def __call__(self, payload: JSON) -> dict[str, Any]:
        feeds, fmt = self.feeds(payload)
        outputs: dict[str, Any] = {}
        with self.pool.request():
            results = self.backend.run(feeds)
            # Serialized (copied) inside the arena: pooled output buffers never leave this block.
            for name in self.outputs:
                array = results[name]
                if fmt == "npy":
                    buf = io.BytesIO()
                    np.save(buf, array, allow_pickle=False)
                    outputs[name] = {"npy": base64.b64encode(buf.getvalue()).decode()}
                else:
                    outputs[name] = array.tolist()
        return {"outputs": outputs, "model": self.model}

    def warmup(self) -> None:
        # Free dimensions get 1: the smallest valid shape, so the warm-up cannot fail on size.
        feeds = {
            n: np.zeros([d if isinstance(d, int) else 1 for d in s.shape], dtype=np.dtype(s.dtype))
            for n, s in self.inputs.items()
        }
        self.backend.run(feeds)


TASKS: dict[str, TaskFactory] = {"embedding": EmbeddingTask, "tensor": TensorTask}
