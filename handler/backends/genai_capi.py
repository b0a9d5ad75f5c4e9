"""onnxruntime-genai's C API through ctypes: the model, its generators and their logits, for the genai engine's
one-generator-per-request path (handler.backends.genai).

Why not the library's Python binding: each of its calls holds the GIL until it returns (measured on the 0.6B int4
pack: while `og.Model(config)` ran for 2 s, another Python thread got ~1.5% of its free loop rate). The model's load
is ~0.6 s of CPU that nothing else of the init could overlap, above all the tokenizer's parse (~0.2 s for a
151,936-token vocabulary), and in the HTTP host no other request's Python ran while one stream computed a step.
ctypes releases the GIL for every foreign call, so the parse runs in a thread beside the load (where the CPU quota
gives more than one CPU: handler.backends.genai.load_beside_init) and other threads run while a step computes.

The library is the one the binding loads: `onnxruntime_genai` is imported first, so its loader has opened
onnxruntime's library as it always does (onnxruntime_genai/_dll_directory.py); the objects and answers are the
binding's own (tests/functional/test_genai_capi.py compares greedy and seeded sampled tokens with it). Signatures
are ort_genai_c.h's for the pinned onnxruntime-genai (infra/deploy/requirements-generate-nodeps.txt); ctypes
cannot check them, so another version is refused (VERSIONS) rather than called with what may be wrong arguments.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Sequence
from typing import Any

import onnxruntime_genai as og  # type: ignore[import-untyped]  # no stubs; loads libonnxruntime for the C library

LIBRARY = "libonnxruntime-genai.so"
VERSIONS = ("0.18.",)  # the onnxruntime-genai releases whose C API these signatures were checked against
FLOAT32 = 1  # OgaElementType_float32

_vp = ctypes.c_void_p
_out = ctypes.POINTER(ctypes.c_void_p)
# name -> (argument types, result type); None: void. An OgaResult* (a c_void_p) is an error when not NULL.
_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "OgaResultGetError": ([_vp], ctypes.c_char_p),
    "OgaDestroyResult": ([_vp], None),
    "OgaCreateConfig": ([ctypes.c_char_p, _out], _vp),
    "OgaConfigOverlay": ([_vp, ctypes.c_char_p], _vp),
    "OgaConfigClearProviders": ([_vp], _vp),
    "OgaConfigAppendProvider": ([_vp, ctypes.c_char_p], _vp),
    "OgaDestroyConfig": ([_vp], None),
    "OgaCreateModelFromConfig": ([_vp, _out], _vp),
    "OgaDestroyModel": ([_vp], None),
    "OgaCreateGeneratorParams": ([_vp, _out], _vp),
    "OgaGeneratorParamsSetSearchNumber": ([_vp, ctypes.c_char_p, ctypes.c_double], _vp),
    "OgaGeneratorParamsSetSearchBool": ([_vp, ctypes.c_char_p, ctypes.c_bool], _vp),
    "OgaDestroyGeneratorParams": ([_vp], None),
    "OgaCreateGenerator": ([_vp, _vp, _out], _vp),
    "OgaDestroyGenerator": ([_vp], None),
    "OgaGenerator_AppendTokens": ([_vp, ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t], _vp),
    "OgaGenerator_GenerateNextToken": ([_vp], _vp),
    "OgaGenerator_GetNextTokens": (
        [_vp, ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)), ctypes.POINTER(ctypes.c_size_t)],
        _vp,
    ),
    "OgaGenerator_IsDone": ([_vp], ctypes.c_bool),
    "OgaGenerator_GetLogits": ([_vp, _out], _vp),
    "OgaGenerator_SetLogits": ([_vp, _vp], _vp),
    "OgaCreateTensorFromBuffer": ([_vp, ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t, ctypes.c_int, _out], _vp),
    "OgaTensorGetShapeRank": ([_vp, ctypes.POINTER(ctypes.c_size_t)], _vp),
    "OgaTensorGetShape": ([_vp, ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t], _vp),
    "OgaTensorGetData": ([_vp, _out], _vp),
    "OgaDestroyTensor": ([_vp], None),
}
_lib: Any = None
_lib_lock = threading.Lock()


class GenaiError(RuntimeError):
    """The library's own error message (a bad file, a refused option): what the binding raised as RuntimeError."""


def library() -> Any:
    """The C library, its functions typed (once per process)."""
    global _lib
    with _lib_lock:
        if _lib is None:
            version = str(getattr(og, "__version__", "unknown"))
            if not version.startswith(VERSIONS):
                raise GenaiError(
                    f"onnxruntime-genai {version}: its C API is called with the signatures of "
                    f"{', '.join(v + 'x' for v in VERSIONS)} only (infra/deploy/requirements-generate-nodeps.txt)"
                )
            lib = ctypes.CDLL(os.path.join(os.path.dirname(og.__file__), LIBRARY))
            for name, (args, result) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = args, result
            _lib = lib
        return _lib


def check(result: int | None) -> None:
    """Raise the library's message when a call returned an OgaResult (NULL: success); the result is freed."""
    if result:
        lib = library()
        message = lib.OgaResultGetError(result)
        lib.OgaDestroyResult(result)
        raise GenaiError((message or b"unknown error").decode("utf-8", "replace"))


class Model:
    """An OgaModel made from the pack directory `root`, `overlay` (genai_config.json's JSON overlaid) and the
    providers (empty: the CPU). Freed by close() (or when collected), after every generator made from it.
    `entered`: set just before the long call (the load itself), for a caller that made this in a thread and waits
    to go on until the thread no longer needs the GIL."""

    def __init__(
        self, root: str, overlay: str, providers: Sequence[str] = (), entered: threading.Event | None = None
    ) -> None:
        self.ptr: int | None = None  # first: close() (and __del__) must find it whatever fails below
        lib = library()
        self._lib = lib
        # Generator calls on one model are serialized, as the binding's GIL did (concurrent generators of one model
        # were never run); the GIL itself is free while a call computes.
        self.lock = threading.Lock()
        config = ctypes.c_void_p()
        check(lib.OgaCreateConfig(os.fsencode(root), ctypes.byref(config)))
        try:
            check(lib.OgaConfigOverlay(config, overlay.encode()))
            check(lib.OgaConfigClearProviders(config))
            for provider in providers:
                check(lib.OgaConfigAppendProvider(config, provider.encode()))
            model = ctypes.c_void_p()
            if entered is not None:  # the caller's thread may go on: from here this one needs no GIL
                entered.set()
            check(lib.OgaCreateModelFromConfig(config, ctypes.byref(model)))
            self.ptr = model.value
        finally:
            lib.OgaDestroyConfig(config)

    def close(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, None
            self._lib.OgaDestroyModel(ptr)

    def __del__(self) -> None:
        self.close()


class Generator:
    """One request's OgaGenerator (its KV cache) over `model`; `search`: the generator params' search options
    (bool values set as bools, the rest as numbers, as the binding's set_search_options does)."""

    def __init__(self, model: Model, search: dict[str, float | bool]) -> None:
        self.ptr: int | None = None  # first: close() (and __del__) must find it whatever fails below
        if not model.ptr:
            raise GenaiError("the model is closed")
        lib = self._lib = library()
        self.model = model  # kept alive while this generator lives
        params = ctypes.c_void_p()
        check(lib.OgaCreateGeneratorParams(model.ptr, ctypes.byref(params)))
        try:
            for name, value in search.items():
                if isinstance(value, bool):
                    check(lib.OgaGeneratorParamsSetSearchBool(params, name.encode(), value))
                else:
                    check(lib.OgaGeneratorParamsSetSearchNumber(params, name.encode(), float(value)))
            generator = ctypes.c_void_p()
            with model.lock:
                check(lib.OgaCreateGenerator(model.ptr, params, ctypes.byref(generator)))
            self.ptr = generator.value
        finally:
            lib.OgaDestroyGeneratorParams(params)

    def append_tokens(self, ids: Sequence[int]) -> None:
        array = (ctypes.c_int32 * len(ids))(*ids)
        with self.model.lock:
            check(self._lib.OgaGenerator_AppendTokens(self.ptr, array, len(ids)))

    def generate_next_token(self) -> None:
        with self.model.lock:
            check(self._lib.OgaGenerator_GenerateNextToken(self.ptr))

    def next_token(self) -> int:
        """The token the last step chose (batch 1)."""
        data = ctypes.POINTER(ctypes.c_int32)()
        count = ctypes.c_size_t()
        check(self._lib.OgaGenerator_GetNextTokens(self.ptr, ctypes.byref(data), ctypes.byref(count)))
        if count.value < 1:
            raise GenaiError("the generator returned no token")
        return int(data[0])

    def is_done(self) -> bool:
        return bool(self._lib.OgaGenerator_IsDone(self.ptr))

    def get_logits(self) -> Any:
        """The last position's logits, a numpy float32 array of the library's shape (a copy we may write)."""
        import numpy as np  # deferred: only a JSON-constrained request reads the logits

        lib = self._lib
        tensor = ctypes.c_void_p()
        check(lib.OgaGenerator_GetLogits(self.ptr, ctypes.byref(tensor)))
        try:
            rank = ctypes.c_size_t()
            check(lib.OgaTensorGetShapeRank(tensor, ctypes.byref(rank)))
            shape = (ctypes.c_int64 * rank.value)()
            check(lib.OgaTensorGetShape(tensor, shape, rank.value))
            data = ctypes.c_void_p()
            check(lib.OgaTensorGetData(tensor, ctypes.byref(data)))
            dims = tuple(int(d) for d in shape)
            count = int(np.prod(dims)) if dims else 1
            buffer = (ctypes.c_float * count).from_address(data.value or 0)
            return np.array(buffer, dtype=np.float32).reshape(dims)
        finally:
            lib.OgaDestroyTensor(tensor)

    def set_logits(self, logits: Any) -> None:
        """Replace the last position's logits (same shape as get_logits) before the next step."""
        import numpy as np  # deferred, as in get_logits

        array = np.ascontiguousarray(logits, dtype=np.float32)
        shape = (ctypes.c_int64 * array.ndim)(*array.shape)
        lib = self._lib
        tensor = ctypes.c_void_p()
        # The tensor borrows `array`'s memory: it lives until SetLogits has copied it and the tensor is freed.
        check(lib.OgaCreateTensorFromBuffer(array.ctypes.data, shape, array.ndim, FLOAT32, ctypes.byref(tensor)))
        try:
            with self.model.lock:
                check(lib.OgaGenerator_SetLogits(self.ptr, tensor))
        finally:
            lib.OgaDestroyTensor(tensor)

    def close(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, None
            self._lib.OgaDestroyGenerator(ptr)

    def __del__(self) -> None:
        self.close()
