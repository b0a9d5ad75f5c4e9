"""`tensor`: {"inputs": {"name": nested list | {"npy": "<base64 .npy>"}}, "output_format": "list" | "npy"}
→ {"outputs": {"name": ...}, "model": "id@version"}; dtypes and shapes checked against the manifest."""

from __future__ import annotations

import base64
import binascii
import io
from typing import TYPE_CHECKING, Any

import numpy as np

from handler.backends.contract import Backend
from handler.backends.pool import BufferPool
from handler.core.config import Config
from handler.core.errors import InvalidInputError
from handler.core.manifest import Manifest, TensorSpec
from handler.core.types import JSON, Arrays
from handler.tasks.arrays import finite, from_list, from_npy
from handler.tasks.spec import MODEL, STRING, TaskSpec, nullable
from handler.tasks.text import require_object

if TYPE_CHECKING:  # types only: numpy.typing's import dedents docstrings with regexes, at init
    import numpy.typing as npt

OUTPUT_FORMATS = ("list", "npy")
_NPY_HINT = '; ask for "output_format": "npy", which does'


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
        if isinstance(value, bytes):  # an `application/x-npy` body on the HTTP host (handler.api.media)
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
        body = require_object(payload, "inputs")
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
            # Copied (or serialized) inside the arena: pooled output buffers never leave this block.
            for name in self.outputs:
                array = results[name]
                if fmt == "npy":  # .npy holds NaN and infinities as they are
                    buf = io.BytesIO()
                    np.save(buf, array, allow_pickle=False)
                    outputs[name] = {"npy": base64.b64encode(buf.getvalue()).decode()}
                else:  # an array, written as JSON at the edge (float32 at its shortest); JSON has no NaN
                    outputs[name] = np.array(finite(array, f"output {name!r}", _NPY_HINT))
        return {"outputs": outputs, "model": self.model}

    def warmup(self) -> None:
        # Free dimensions get 1: the smallest valid shape, so the warm-up cannot fail on size.
        feeds = {
            n: np.zeros([d if isinstance(d, int) else 1 for d in s.shape], dtype=np.dtype(s.dtype))
            for n, s in self.inputs.items()
        }
        self.backend.run(feeds)


SPEC = TaskSpec(
    name=TensorTask.name,
    factory=TensorTask,
    oip="Tensors",
    request={
        "title": "tensor",
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "inputs": {"type": "object", "description": 'name → nested list, or {"npy": base64 .npy}'},
            "output_format": nullable({"enum": list(OUTPUT_FORMATS)}),
            "model": MODEL,
        },
    },
    answer={
        "title": "tensor",
        "type": "object",
        "required": ["outputs", "model"],
        "properties": {"outputs": {"type": "object"}, "model": STRING},
    },
    npy_input=True,
    warmup_may_fail=True,  # a generic model may reject the all-zero inputs it is warmed with
)
