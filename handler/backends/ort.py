"""ONNX Runtime backend (the `onnxruntime-gpu` package; `onnxruntime` on Lambda): on the CPU through ONNX Runtime's C
API (handler.backends.ort_capi: the wheel's own libonnxruntime, the Python package never imported), the Python binding
for the CUDA provider and wherever the C library cannot be used (the reason is in the init report's
`coldstart.onnx_api`)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from handler.backends import ort_capi
from handler.backends.contract import BackendSettings
from handler.backends.fingerprint import cpu_fingerprint, int8_refusal
from handler.backends.ort_spec import OrtSettings
from handler.backends.pool import current_arena
from handler.core.errors import ModelLoadError, ModelRunError
from handler.core.manifest import Manifest
from handler.core.types import Arrays
from handler.observability.report import PhaseTimer

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
_CUDA_OPTIONS = {
    # EXHAUSTIVE (the default) benchmarks every conv algorithm on first run: seconds of first-call latency.
    "cudnn_conv_algo_search": "DEFAULT",
    "arena_extend_strategy": "kSameAsRequested",
}
# The binding's type names -> numpy dtype names (names, as ort_capi.DTYPES: no numpy at a lean start's init).
_DTYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
}
# GraphOptimizationLevel's values (the same in the C API and the binding).
_DISABLE_ALL, _ENABLE_EXTENDED = 0, 2
# (name, dtype, dims): each dim an int, or the name of an input's symbolic dim to take from the feeds.
OutputSpec = tuple[str, Any, list[int | str]]
# (name, dtype or None, dims: int, a symbol's name, or None) of an input or output, from either API.
IOSpec = tuple[str, Any, list[Any]]


def quantization(manifest: Manifest) -> Any:
    """The int8 record of the graph: the onnx backend's entry (text packs), else the precision gate's (an
    image-text pack's towers share one)."""
    own = manifest.backends["onnx"].get("quantization")
    if own is not None:
        return own
    precision = manifest.raw.get("precision")
    quality = precision.get("quality") if isinstance(precision, dict) else None
    return quality.get("quantization") if isinstance(quality, dict) else None


class OnnxBackend:
    name = "onnx"

    def __init__(self) -> None:
        self.session: Any = None  # an onnxruntime.InferenceSession (the binding) or an ort_capi.Session
        self.capi: ort_capi.Session | None = None  # set when the C API serves
        self.path: Path | None = None
        self.providers: list[str] = []
        self.device_reason = ""
        self.threads = 0
        self.version = ""
        # Which API serves and why: the init report's "coldstart.onnx_api".
        self.api: dict[str, Any] = {"used": "", "reason": ""}
        # Whether the pre-optimized, prepacked model was used, or why not: the init report's "coldstart".
        self.optimized: dict[str, Any] = {"used": False, "reason": "not packed"}
        self._outputs: list[str] = []
        self._bound: list[OutputSpec] | None = None  # None: some output's shape is unknowable before the run
        self._symbols: list[tuple[str, int, str]] = []  # (input, axis, symbol) to read dims off the feeds
        self._bindings: list[Any] = []  # idle IOBinding objects: one per in-flight run, reused
        # Binding outputs pays where ORT would otherwise copy device → fresh host memory (CUDA). On CPU with
        # small outputs (MiniLM: 1.5 KB a vector) the Python binding calls cost ~100 us a run measured here,
        # ~3% of a batch-1 call, for nothing: plain `run` there unless WARMSTART_ORT_IOBINDING=1. (The C API
        # always writes into arrays made before the run when the shapes are known: no copy, no binding calls.)
        self.bind_outputs = False
        self._lock = threading.Lock()

    def initialize(self, manifest: Manifest, settings: BackendSettings[OrtSettings], timer: PhaseTimer) -> None:
        path = manifest.path(manifest.backends["onnx"]["model"])
        refusal = int8_refusal(quantization(manifest))
        if refusal is not None:
            raise ModelLoadError(f"{path}: {refusal}")
        self.version, self.api = runtime(settings)
        optimized, self.optimized = optimized_model(manifest, settings, self.version)
        if optimized is not None:
            try:
                self._create(optimized, settings, timer, preoptimized=True)
                return
            except ModelLoadError as e:  # never a failed start over a speed-up: the portable model follows
                self.optimized = {"used": False, "reason": f"load failed: {e}"}
        self._create(path, settings, timer, preoptimized=False)

    def _create(
        self, path: Path, settings: BackendSettings[OrtSettings], timer: PhaseTimer, preoptimized: bool
    ) -> None:
        # EXTENDED fuses LayerNorm/GELU/attention patterns; ALL adds CPU-layout transforms that did not pay here.
        # A pre-optimized model was saved after EXTENDED at pack time: running the passes again finds nothing.
        level = _DISABLE_ALL if preoptimized else _ENABLE_EXTENDED
        config = {"session.intra_op.allow_spinning": "1" if settings.spin else "0"}
        if not settings.own.prepack:
            # Prepacking copies MatMul weights into a packed layout: ~30 ms at init and a second copy in
            # memory, for ~2x faster short-sequence inference. Off only when asked (WARMSTART_ORT_PREPACK=0).
            config["session.disable_prepacking"] = "1"
        self.device_reason = settings.cuda.reason
        self.threads = settings.threads
        self.path = path
        with timer.phase("session"):
            if self.api["used"] == "c":
                inputs, outputs = self._create_capi(path, settings, level, config)
            else:
                inputs, outputs = self._create_binding(path, settings, level, config)
        self._outputs = [name for name, _, _ in outputs]
        self._plan_bound_outputs(inputs, outputs)
        self.bind_outputs = CUDA in self.providers if settings.own.iobinding is None else settings.own.iobinding

    def _create_capi(
        self, path: Path, settings: BackendSettings[OrtSettings], level: int, config: dict[str, str]
    ) -> tuple[list[IOSpec], list[IOSpec]]:
        try:
            session = ort_capi.Session(
                str(path), intra_threads=settings.threads, optimization=level, log_severity=3, config=config
            )
        except ort_capi.OrtError as e:
            raise ModelLoadError(f"{path}: ONNX Runtime could not load it: {e}") from None
        self.session = self.capi = session
        self.providers = [CPU]
        return (
            [(i.name, i.dtype, i.dims) for i in session.inputs],
            [(o.name, o.dtype, o.dims) for o in session.outputs],
        )

    def _create_binding(
        self, path: Path, settings: BackendSettings[OrtSettings], level: int, config: dict[str, str]
    ) -> tuple[list[IOSpec], list[IOSpec]]:
        import onnxruntime as ort  # deferred: ~117 M instructions of import, paid only where the C API is not used

        options = ort.SessionOptions()
        options.intra_op_num_threads = settings.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel(level)
        options.log_severity_level = 3
        for key, value in config.items():
            options.add_session_config_entry(key, value)
        wanted = [(CUDA, _CUDA_OPTIONS), CPU] if settings.cuda.usable else [CPU]
        try:
            self.session = ort.InferenceSession(str(path), options, providers=wanted)
        except Exception as e:  # ORT raises its own Fail/InvalidGraph/NoSuchFile types
            raise ModelLoadError(f"{path}: ONNX Runtime could not load it: {e}") from None
        self.capi = None
        # Trust what the session got, not what was available: a missing CUDA library falls back silently.
        self.providers = self.session.get_providers()
        if settings.cuda.usable and CUDA not in self.providers:
            self.device_reason = f"{settings.cuda.reason}, but the CUDA provider failed to load (CUDA/cuDNN libraries?)"

        def specs(args: Any) -> list[IOSpec]:
            return [(a.name, _DTYPES.get(a.type), list(a.shape)) for a in args]

        return specs(self.session.get_inputs()), specs(self.session.get_outputs())

    def _plan_bound_outputs(self, inputs: list[IOSpec], outputs: list[IOSpec]) -> None:
        """Outputs whose every dim is fixed or named after an input's dim can be preallocated and bound."""
        self._symbols = [
            (name, axis, d) for name, _, dims in inputs for axis, d in enumerate(dims) if isinstance(d, str)
        ]
        symbols = {s for _, _, s in self._symbols}
        plan: list[OutputSpec] = []
        for name, dtype, dims in outputs:
            if dtype is None or not all(isinstance(d, int) or d in symbols for d in dims):
                self._bound = None
                return
            plan.append((name, dtype, list(dims)))
        self._bound = plan

    @property
    def coldstart(self) -> dict[str, Any]:
        """The init report's `coldstart` facts of this backend (handler.models.loader reads them)."""
        return {"onnx_optimized": self.optimized, "onnx_api": self.api}

    def warm_device(self) -> dict[str, Any]:
        if CUDA not in self.providers:
            return {"cuda": False, "reason": self.device_reason}
        # The warm-up inference that follows runs real kernels on the device; here we only make sure the
        # context and the arena exist before it, so its time is inference, not setup.
        import numpy as np
        import onnxruntime as ort  # already imported: CUDA is served by the binding

        value = ort.OrtValue.ortvalue_from_numpy(np.zeros((1, 8), np.float32), "cuda", 0)
        return {"cuda": True, "reason": self.device_reason, "allocated_on": value.device_name()}

    def _shapes(self, feeds: Arrays, plan: list[OutputSpec]) -> list[tuple[str, Any, tuple[int, ...]]]:
        dims = {s: feeds[name].shape[axis] for name, axis, s in self._symbols}
        return [
            (name, dtype, tuple(d if isinstance(d, int) else dims[d] for d in shape)) for name, dtype, shape in plan
        ]

    def run(self, feeds: Arrays) -> Arrays:
        """Inside a request's arena, outputs go into pooled buffers (valid until the arena closes); otherwise, or
        when an output's shape is unknowable in advance, into fresh arrays."""
        if self.capi is not None:
            return self._run_capi(self.capi, feeds)
        assert self.session is not None
        arena = current_arena()
        plan = self._bound
        if arena is None or plan is None or not self.bind_outputs:
            return self._plain(feeds)
        outputs = {name: arena.take(shape, dtype) for name, dtype, shape in self._shapes(feeds, plan)}
        with self._lock:
            binding = self._bindings.pop() if self._bindings else self.session.io_binding()
        try:
            for name, array in feeds.items():
                binding.bind_cpu_input(name, array)
            for name, array in outputs.items():
                binding.bind_output(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
            self.session.run_with_iobinding(binding)
        except Exception:
            # A graph whose output dims are named like its inputs' but mean something else: fall back for good.
            result = self._plain(feeds)
            self._bound = None
            return result
        finally:
            binding.clear_binding_inputs()
            binding.clear_binding_outputs()
            with self._lock:
                self._bindings.append(binding)
        return outputs

    def _run_capi(self, session: ort_capi.Session, feeds: Arrays) -> Arrays:
        """ORT writes into arrays made here when every output's shape follows from the feeds (pooled buffers inside
        a request's arena when binding is on), else it allocates and the outputs are copied out."""
        plan = self._bound
        if plan is not None:
            import numpy as np  # deferred: a lean start runs `run_buffers` (handler.core.numpy_gate)

            arena = current_arena() if self.bind_outputs else None
            shapes = self._shapes(feeds, plan)
            into = [arena.take(s, d) if arena is not None else np.empty(s, d) for _, d, s in shapes]
            try:
                return dict(zip(self._outputs, session.run(feeds, into), strict=True))
            except ort_capi.OrtError:
                # A graph whose output dims are named like its inputs' but mean something else: ORT refuses the
                # preallocated shape. When the plain run works, that was it: plain from now on.
                result = self._run_plain(session, feeds)
                self._bound = None
                return result
        return self._run_plain(session, feeds)

    def run_buffers(
        self, feeds: dict[str, tuple[Any, tuple[int, ...]]]
    ) -> dict[str, tuple[str, list[int], bytes]] | None:
        """`run` without numpy (handler.core.numpy_gate): `array.array` feeds and their shapes → each output's dtype
        name, shape and bytes; None when the C API does not serve (the binding needs numpy: take `run`)."""
        if self.capi is None:
            return None
        try:
            return dict(zip(self._outputs, self.capi.run_buffers(feeds), strict=True))
        except ort_capi.OrtError as e:
            raise ModelRunError(f"{self.path}: ONNX Runtime failed running it: {e}") from None

    def _run_plain(self, session: ort_capi.Session, feeds: Arrays) -> Arrays:
        try:
            return dict(zip(self._outputs, session.run(feeds), strict=True))
        except ort_capi.OrtError as e:
            raise ModelRunError(f"{self.path}: ONNX Runtime failed running it: {e}") from None

    def _plain(self, feeds: Arrays) -> Arrays:
        assert self.session is not None
        results = self.session.run(self._outputs, feeds)
        return dict(zip(self._outputs, results, strict=True))

    def set_threads(self, threads: int) -> int:
        # ORT builds its intra-op pool with the session and cannot resize it; rebuilding the session would
        # unshare its prepacked weights from the template's pages. The session keeps what it was built with.
        return self.threads

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "providers": self.providers,
            "device": "cuda" if CUDA in self.providers else "cpu",
            "device_reason": self.device_reason,
            "threads": self.threads,
            "onnxruntime": self.version,
            "onnxruntime_api": self.api["used"],
        }


def runtime(settings: BackendSettings[OrtSettings]) -> tuple[str, dict[str, Any]]:
    """ONNX Runtime's release and which API serves: the C API on the CPU (when on and usable), else the binding,
    with the reason either way. The binding's package is imported only when it serves."""
    if settings.cuda.usable:
        why = "CUDA: the Python binding serves the CUDA provider"
    elif not settings.own.capi:
        why = "off (WARMSTART_ORT_CAPI=0)"
    else:
        try:
            return ort_capi.version(), {"used": "c", "reason": "CPU: ONNX Runtime's C API (no Python package import)"}
        except ort_capi.CapiUnavailable as e:  # never a failed start over a speed-up: the binding follows
            why = f"C API unusable: {e}"
    import onnxruntime as ort  # deferred: see _create_binding

    return str(ort.__version__), {"used": "python", "reason": why}


def optimized_model(
    manifest: Manifest, settings: BackendSettings[OrtSettings], version: str
) -> tuple[Path | None, dict[str, Any]]:
    """The pre-optimized model's path when it may be used here, and the report's line either way. `version`: the
    ONNX Runtime release that will load it.

    Its prepacked weights are in MLAS's layout for the ORT version and CPU features they were made with;
    anything else would read them wrongly, so any difference means the portable model (never a wrong answer).
    """
    spec = manifest.backends["onnx"].get("optimized")
    if not spec:
        return None, {"used": False, "reason": "not packed (warmstart optimize)"}
    if not settings.own.optimized:
        return None, {"used": False, "reason": "off (WARMSTART_ORT_OPTIMIZED=0)"}
    if settings.cuda.usable:
        return None, {"used": False, "reason": "CUDA: prepacked weights are for the CPU provider"}
    if not settings.own.prepack:
        return None, {"used": False, "reason": "prepacking off (WARMSTART_ORT_PREPACK=0)"}
    made_for = {"onnxruntime": spec.get("onnxruntime"), **{k: spec.get(k) for k in ("arch", "cpu_features")}}
    here = {"onnxruntime": version, **cpu_fingerprint()}
    differs = [f"{k} {here[k]} != {made_for[k]}" for k in here if here[k] != made_for[k]]
    if differs:
        return None, {"used": False, "reason": "made for another target: " + "; ".join(differs), "made_for": made_for}
    missing = [n for n in spec.get("files", []) if n not in manifest.files]
    if missing or spec.get("model") not in manifest.files:
        return None, {"used": False, "reason": f"files not in this copy of the model: {missing or spec.get('model')}"}
    return manifest.path(spec["model"]), {"used": True, "model": spec["model"], "made_for": made_for}


def create() -> OnnxBackend:
    return OnnxBackend()
