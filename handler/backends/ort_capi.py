"""ONNX Runtime's C API through ctypes: the CPU sessions of the `onnx` backend (handler.backends.ort).

Why not the Python binding: importing `onnxruntime` runs its Python modules and its pybind11 module's init (hundreds
of types registered) besides ONNX Runtime's own environment setup (~89 M instructions, the operator schemas, which
`CreateEnv` here does too): +117 M on a start's main thread (callgrind: `import numpy` 394.9 M, `import numpy,
onnxruntime` 512.3 M). Through the C library the wheel ships beside it (`onnxruntime/capi/libonnxruntime.so.<version>`)
a start to the first answer is 829.8 M against 851.5 M through the binding (bench/coldstart/instr.py --at-answer).
The binding links its own copy of the runtime statically: the same release built from the same tree, the same kernels,
the same answers (tests/functional/test_ort_capi.py compares them bit for bit). ctypes releases the GIL for every
foreign call, as the binding does for `run`.

The library is found without importing the package (`find_spec` reads the path; it runs nothing). The OrtApi struct
is a table of function pointers whose order is fixed per API version and only ever appended to; the indices and
signatures below are those of onnxruntime_c_api.h at ORT_API_VERSION 8 (microsoft/onnxruntime,
include/onnxruntime/core/session/onnxruntime_c_api.h). Everything used is in versions 1-5, whose ends ORT's own build
asserts (onnxruntime_c_api.cc's static_asserts: ReleaseCustomOpDomain at 101, ReleaseModelMetadata at 118,
AddFreeDimensionOverrideByName at 124, ReleaseAvailableProviders at 126, SetGlobalSpinControl at 149, as counted
here). ctypes cannot check a signature, so a library of another release than VERSIONS is not called:
CapiUnavailable, and the backend takes the binding.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy where the arrays are: a lean start runs the model without it (`Session.run_buffers`)
    from array import array as TypedBuffer

VERSIONS = ("1.31.",)  # the onnxruntime releases this module was checked against (layers/requirements.txt pins)
API_VERSION = 8  # the header version whose table the indices below are read from (GetApi returns the same table)
LOG_WARNING = 2  # OrtLoggingLevel: the environment logs warnings and worse, as the binding's default logger
_CPU_DEVICE_ALLOCATOR = 0  # OrtAllocatorType OrtDeviceAllocator
_MEM_TYPE_DEFAULT = 0  # OrtMemType OrtMemTypeDefault
_ONNX_TYPE_TENSOR = 1  # ONNXType

_vp = ctypes.c_void_p
_pvp = ctypes.POINTER(ctypes.c_void_p)
_size = ctypes.c_size_t
_psize = ctypes.POINTER(ctypes.c_size_t)
_int = ctypes.c_int
_pint = ctypes.POINTER(ctypes.c_int)
_str = ctypes.c_char_p
_pi64 = ctypes.POINTER(ctypes.c_int64)
# name -> (index in OrtApi, result type, argument types). An OrtStatus* result (a c_void_p) is an error when not
# NULL. Indices counted in the header above; the Release* entries are void.
_FUNCTIONS: dict[str, tuple[int, Any, list[Any]]] = {
    "GetErrorCode": (1, _int, [_vp]),
    "GetErrorMessage": (2, _str, [_vp]),
    "CreateEnv": (3, _vp, [_int, _str, _pvp]),
    "CreateSession": (7, _vp, [_vp, _str, _vp, _pvp]),
    "Run": (9, _vp, [_vp, _vp, ctypes.POINTER(_str), _pvp, _size, ctypes.POINTER(_str), _size, _pvp]),
    "CreateSessionOptions": (10, _vp, [_pvp]),
    "SetSessionExecutionMode": (13, _vp, [_vp, _int]),
    "SetSessionLogSeverityLevel": (22, _vp, [_vp, _int]),
    "SetSessionGraphOptimizationLevel": (23, _vp, [_vp, _int]),
    "SetIntraOpNumThreads": (24, _vp, [_vp, _int]),
    "SetInterOpNumThreads": (25, _vp, [_vp, _int]),
    "SessionGetInputCount": (30, _vp, [_vp, _psize]),
    "SessionGetOutputCount": (31, _vp, [_vp, _psize]),
    "SessionGetInputTypeInfo": (33, _vp, [_vp, _size, _pvp]),
    "SessionGetOutputTypeInfo": (34, _vp, [_vp, _size, _pvp]),
    "SessionGetInputName": (36, _vp, [_vp, _size, _vp, _pvp]),
    "SessionGetOutputName": (37, _vp, [_vp, _size, _vp, _pvp]),
    "CreateTensorWithDataAsOrtValue": (49, _vp, [_vp, _vp, _size, _pi64, _size, _int, _pvp]),
    "GetTensorMutableData": (51, _vp, [_vp, _pvp]),
    "CastTypeInfoToTensorInfo": (55, _vp, [_vp, _pvp]),
    "GetOnnxTypeFromTypeInfo": (56, _vp, [_vp, _pint]),
    "GetTensorElementType": (60, _vp, [_vp, _pint]),
    "GetDimensionsCount": (61, _vp, [_vp, _psize]),
    "GetDimensions": (62, _vp, [_vp, _pi64, _size]),
    "GetSymbolicDimensions": (63, _vp, [_vp, ctypes.POINTER(_str), _size]),
    "GetTensorTypeAndShape": (65, _vp, [_vp, _pvp]),
    "CreateCpuMemoryInfo": (69, _vp, [_int, _int, _pvp]),
    "AllocatorFree": (76, _vp, [_vp, _vp]),
    "GetAllocatorWithDefaultOptions": (78, _vp, [_pvp]),
    "ReleaseStatus": (93, None, [_vp]),
    "ReleaseSession": (95, None, [_vp]),
    "ReleaseValue": (96, None, [_vp]),
    "ReleaseTypeInfo": (98, None, [_vp]),
    "ReleaseTensorTypeAndShapeInfo": (99, None, [_vp]),
    "ReleaseSessionOptions": (100, None, [_vp]),
    "AddSessionConfigEntry": (130, _vp, [_vp, _str, _str]),
}
# ONNXTensorElementDataType -> numpy dtype name (the types a tensor of ours can have; string tensors are not). Names,
# not numpy types: a session is described at init, and a lean start (handler.core.numpy_gate) has no numpy then.
DTYPES: dict[int, str] = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
}
_ELEMENT_TYPES = {d: t for t, d in DTYPES.items()}
# numpy dtype -> element type, filled as arrays of each native dtype come: a dtype's `name` is built in Python by
# numpy (~3.4 us, three times a run), its hash is not.
_BY_DTYPE: dict[Any, int] = {}
_ITEM_SIZES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8}
# array.array typecodes `run_buffers` takes (their sizes fixed on every platform a wheel is built for).
_TYPECODES = {"q": 7, "f": 1, "d": 11, "b": 3, "B": 2}


class CapiUnavailable(RuntimeError):
    """The C library cannot be used here (not installed, another release): the binding serves instead."""


class OrtError(RuntimeError):
    """ONNX Runtime's own message for a failed call; `code` is its OrtErrorCode (2: invalid argument, 3: no such
    file, 7: invalid protobuf, ...), the same message the binding raised."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class _Api:
    """The library's typed functions, its environment and the CPU memory description (one per process)."""

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        lib.OrtGetApiBase.restype = ctypes.POINTER(_ApiBase)
        base = lib.OrtGetApiBase().contents
        self.version = (base.GetVersionString() or b"").decode()
        if not self.version.startswith(VERSIONS):
            raise CapiUnavailable(
                f"onnxruntime {self.version}: its C API is called with the table of {', '.join(VERSIONS)}x only"
            )
        table = ctypes.cast(base.GetApi(API_VERSION), _pvp)
        if not table:
            raise CapiUnavailable(f"onnxruntime {self.version} does not offer C API version {API_VERSION}")
        self.lib = lib  # kept: the functions below live in it
        for name, (index, result, args) in _FUNCTIONS.items():
            # CFUNCTYPE (not PYFUNCTYPE): the GIL is released for the call, so other threads run while ORT computes.
            setattr(self, name, ctypes.CFUNCTYPE(result, *args)(table[index]))
        env, info, allocator = _vp(), _vp(), _vp()
        self.check(self.CreateEnv(LOG_WARNING, b"warmstart", ctypes.byref(env)))
        self.check(self.CreateCpuMemoryInfo(_CPU_DEVICE_ALLOCATOR, _MEM_TYPE_DEFAULT, ctypes.byref(info)))
        self.check(self.GetAllocatorWithDefaultOptions(ctypes.byref(allocator)))
        # Process-lifetime objects, never released: every session needs the environment until it is gone.
        self.env, self.cpu, self.allocator = env, info, allocator

    def check(self, status: int | None) -> None:
        """Raise ORT's message when a call returned an OrtStatus (NULL: success); the status is released."""
        if status:
            message = (self.GetErrorMessage(status) or b"unknown error").decode("utf-8", "replace")
            code = int(self.GetErrorCode(status))
            self.ReleaseStatus(status)
            raise OrtError(message, code)

    def string(self, ptr: _vp) -> str:
        """A name ORT allocated with the default allocator, copied and freed."""
        try:
            return ctypes.string_at(ptr.value or 0).decode()
        finally:
            self.check(self.AllocatorFree(self.allocator, ptr))

    def __getattr__(self, name: str) -> Any:  # the functions are set in __init__; this keeps mypy content
        raise AttributeError(name)


class _ApiBase(ctypes.Structure):
    _fields_ = [
        ("GetApi", ctypes.CFUNCTYPE(_vp, ctypes.c_uint32)),
        ("GetVersionString", ctypes.CFUNCTYPE(_str)),
    ]


_api: _Api | None = None
_api_error: str | None = None
_api_lock = threading.Lock()


def library_path() -> str | None:
    """The C library of the installed onnxruntime wheel, found without importing the package (its pybind module's
    init is what this module exists to skip)."""
    from importlib.util import find_spec  # deferred: only the onnx backend looks for it

    spec = find_spec("onnxruntime")  # a top-level name: the path finders only, no code of the package runs
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        capi = os.path.join(folder, "capi")
        names = sorted(n for n in os.listdir(capi) if n.startswith("libonnxruntime.so.")) if os.path.isdir(capi) else []
        if names:
            return os.path.join(capi, names[-1])
    return None


def api() -> _Api:
    """The loaded library (once per process); CapiUnavailable, with the reason, when it cannot be used."""
    global _api, _api_error
    with _api_lock:
        if _api is None:
            if _api_error is not None:
                raise CapiUnavailable(_api_error)
            try:
                path = library_path()
                if path is None:
                    raise CapiUnavailable("onnxruntime's C library (onnxruntime/capi/libonnxruntime.so.*) not found")
                _api = _Api(path)
            except (CapiUnavailable, OSError, OrtError) as e:
                _api_error = str(e)
                raise CapiUnavailable(_api_error) from None
        return _api


def version() -> str:
    """The C library's release (`GetVersionString`), what `onnxruntime.__version__` says of the same wheel."""
    return api().version


class IOInfo:
    """An input's or output's name, numpy dtype name (None: a type this module does not handle) and dims (an int, a
    symbolic dim's name, or None where the graph names neither), as the binding's NodeArg gives them."""

    __slots__ = ("dims", "dtype", "name")

    def __init__(self, name: str, dtype: Any, dims: list[int | str | None]) -> None:
        self.name, self.dtype, self.dims = name, dtype, dims

    def __repr__(self) -> str:
        return f"IOInfo({self.name!r}, {self.dtype}, {self.dims})"


class Session:
    """An OrtSession over the model at `path` on the CPU provider. `options`: threads, graph optimization level,
    log severity, execution mode as ints; `config`: session config entries. Freed by close() (or when collected)."""

    def __init__(
        self,
        path: str,
        *,
        intra_threads: int,
        inter_threads: int = 1,
        sequential: bool = True,
        optimization: int,
        log_severity: int = 3,
        config: Mapping[str, str] = {},
    ) -> None:
        self.ptr: int | None = None  # first: close() (and __del__) must find it whatever fails below
        a = self._api = api()
        options = _vp()
        a.check(a.CreateSessionOptions(ctypes.byref(options)))
        try:
            a.check(a.SetIntraOpNumThreads(options, intra_threads))
            a.check(a.SetInterOpNumThreads(options, inter_threads))
            a.check(a.SetSessionExecutionMode(options, 0 if sequential else 1))
            a.check(a.SetSessionGraphOptimizationLevel(options, optimization))
            a.check(a.SetSessionLogSeverityLevel(options, log_severity))
            for key, value in config.items():
                a.check(a.AddSessionConfigEntry(options, key.encode(), value.encode()))
            session = _vp()
            a.check(a.CreateSession(a.env, os.fsencode(path), options, ctypes.byref(session)))
            self.ptr = session.value
        finally:
            a.ReleaseSessionOptions(options)
        self.inputs = self._describe(a.SessionGetInputCount, a.SessionGetInputName, a.SessionGetInputTypeInfo)
        self.outputs = self._describe(a.SessionGetOutputCount, a.SessionGetOutputName, a.SessionGetOutputTypeInfo)
        self._output_names = (_str * len(self.outputs))(*(o.name.encode() for o in self.outputs))
        self._input_names: dict[tuple[str, ...], Any] = {}

    def _describe(self, count_of: Any, name_of: Any, type_of: Any) -> list[IOInfo]:
        a = self._api
        count = _size()
        a.check(count_of(self.ptr, ctypes.byref(count)))
        out = []
        for i in range(count.value):
            name = _vp()
            a.check(name_of(self.ptr, i, a.allocator, ctypes.byref(name)))
            label = a.string(name)
            info = _vp()
            a.check(type_of(self.ptr, i, ctypes.byref(info)))
            try:
                out.append(IOInfo(label, *self._tensor_type(info)))
            finally:
                a.ReleaseTypeInfo(info)
        return out

    def _tensor_type(self, info: _vp) -> tuple[Any, list[int | str | None]]:
        a = self._api
        kind = _int()
        a.check(a.GetOnnxTypeFromTypeInfo(info, ctypes.byref(kind)))
        if kind.value != _ONNX_TYPE_TENSOR:
            return None, []
        tensor = _vp()  # borrowed from `info`: not released
        a.check(a.CastTypeInfoToTensorInfo(info, ctypes.byref(tensor)))
        element = _int()
        a.check(a.GetTensorElementType(tensor, ctypes.byref(element)))
        rank = _size()
        a.check(a.GetDimensionsCount(tensor, ctypes.byref(rank)))
        dims = (ctypes.c_int64 * rank.value)()
        symbols = (_str * rank.value)()
        a.check(a.GetDimensions(tensor, dims, rank.value))
        a.check(a.GetSymbolicDimensions(tensor, symbols, rank.value))
        shape: list[int | str | None] = [
            int(d) if d >= 0 else (s.decode() if s else None) for d, s in zip(dims, symbols, strict=True)
        ]
        return DTYPES.get(element.value), shape

    def run(self, feeds: Mapping[str, Any], into: Sequence[Any] | None = None) -> list[Any]:
        """Every output for `feeds` (numpy arrays by input name, read in place: no copy). `into`: one preallocated
        C-contiguous array per output, of its exact dtype and shape, that ORT writes into (returned); else ORT
        allocates and each output is copied out. OrtError with ORT's message when the run fails."""
        import numpy as np  # deferred: a lean start runs `run_buffers` (handler.core.numpy_gate)

        names = tuple(feeds)
        arrays = [np.ascontiguousarray(feeds[n]) for n in names]  # kept alive until Run returns
        n_out = len(self.outputs)
        inputs = (_vp * len(arrays))()
        outputs = (_vp * n_out)()
        try:
            for i, array in enumerate(arrays):
                inputs[i] = self._value(array)
            if into is not None:
                for i, array in enumerate(into):
                    outputs[i] = self._value(array)
            self._run(names, inputs, outputs)
            return list(into) if into is not None else [self._copy_out(outputs[i]) for i in range(n_out)]
        finally:
            self._release(inputs, outputs)

    def run_buffers(
        self, feeds: Mapping[str, tuple[TypedBuffer[Any], tuple[int, ...]]]
    ) -> list[tuple[str, list[int], bytes]]:
        """`run` without numpy: each feed a typed buffer (`array.array`: 'q' int64, 'f' float32, ...) in C order and
        its shape; each output as (its dtype name, its shape, a copy of its bytes in C order)."""
        a = self._api
        names = tuple(feeds)
        inputs = (_vp * len(names))()
        outputs = (_vp * len(self.outputs))()
        try:
            for i, name in enumerate(names):
                buffer, shape = feeds[name]
                element = _TYPECODES.get(buffer.typecode)
                if element is None:
                    raise OrtError(f"buffers of typecode {buffer.typecode!r} are not tensors this backend passes", 2)
                count = 1
                for d in shape:
                    count *= d
                if count != len(buffer):
                    raise OrtError(f"{name}: {len(buffer)} values for the shape {list(shape)}", 2)
                inputs[i] = self._tensor(buffer.buffer_info()[0], len(buffer) * buffer.itemsize, shape, element)
            self._run(names, inputs, outputs)
            out = []
            for value in outputs:
                element, dims = self._output_type(value)
                nbytes = _ITEM_SIZES[element]
                for d in dims:
                    nbytes *= d
                data = _vp()
                if nbytes:
                    a.check(a.GetTensorMutableData(value, ctypes.byref(data)))
                out.append((DTYPES[element], dims, ctypes.string_at(data.value or 0, nbytes) if nbytes else b""))
            return out
        finally:
            self._release(inputs, outputs)

    def _run(self, names: tuple[str, ...], inputs: Any, outputs: Any) -> None:
        a = self._api
        input_names = self._input_names.get(names)
        if input_names is None:  # the same few name tuples every call: encoded once
            input_names = self._input_names[names] = (_str * len(names))(*(n.encode() for n in names))
        n_out = len(self.outputs)
        a.check(a.Run(self.ptr, None, input_names, inputs, len(names), self._output_names, n_out, outputs))

    def _release(self, inputs: Any, outputs: Any) -> None:
        for value in (*inputs, *outputs):
            if value:
                self._api.ReleaseValue(value)

    def _value(self, array: Any) -> int:
        """An OrtValue over `array`'s memory (the caller keeps the array alive and releases the value)."""
        element = _BY_DTYPE.get(array.dtype)
        if element is None:
            element = _ELEMENT_TYPES.get(array.dtype.name) if array.dtype.isnative else None
            if element is None:
                raise OrtError(f"arrays of {array.dtype} are not ONNX tensors this backend passes", 2)
            _BY_DTYPE[array.dtype] = element
        if not array.flags.c_contiguous:
            raise OrtError("an output buffer must be C-contiguous", 2)
        return self._tensor(array.ctypes.data, array.nbytes, array.shape, element)

    def _tensor(self, address: int, nbytes: int, dims: Sequence[int], element: int) -> int:
        """An OrtValue over the memory at `address` (the caller keeps it alive and releases the value)."""
        a = self._api
        shape = (ctypes.c_int64 * len(dims))(*dims)
        value = _vp()
        a.check(
            a.CreateTensorWithDataAsOrtValue(a.cpu, address, nbytes, shape, len(dims), element, ctypes.byref(value))
        )
        return value.value or 0

    def _output_type(self, value: int | None) -> tuple[int, list[int]]:
        """An output's element type (one this module handles, else OrtError) and dims."""
        a = self._api
        info = _vp()
        a.check(a.GetTensorTypeAndShape(value, ctypes.byref(info)))
        try:
            element = _int()
            a.check(a.GetTensorElementType(info, ctypes.byref(element)))
            rank = _size()
            a.check(a.GetDimensionsCount(info, ctypes.byref(rank)))
            dims = (ctypes.c_int64 * rank.value)()
            a.check(a.GetDimensions(info, dims, rank.value))
        finally:
            a.ReleaseTensorTypeAndShapeInfo(info)
        if element.value not in DTYPES:
            raise OrtError(f"an output of ONNX element type {element.value} is not one this backend returns", 2)
        return element.value, list(dims)

    def _copy_out(self, value: int | None) -> Any:
        import numpy as np  # deferred, as in run

        element, dims = self._output_type(value)
        out = np.empty(tuple(dims), DTYPES[element])
        if out.nbytes:
            data = _vp()
            self._api.check(self._api.GetTensorMutableData(value, ctypes.byref(data)))
            ctypes.memmove(out.ctypes.data, data, out.nbytes)
        return out

    def close(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, None
            self._api.ReleaseSession(ptr)

    def __del__(self) -> None:
        self.close()
