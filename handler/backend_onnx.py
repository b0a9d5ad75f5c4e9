"""ONNX Runtime backend (the `onnxruntime-gpu` package): CUDA provider when a device is usable, CPU otherwise."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort

from handler.backends import BackendSettings
from handler.errors import ModelLoadError
from handler.manifest import Manifest
from handler.report import PhaseTimer
from handler.types import Arrays, BackendName

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
_CUDA_OPTIONS = {
    # EXHAUSTIVE (the default) benchmarks every conv algorithm on first run: seconds of first-call latency.
    "cudnn_conv_algo_search": "DEFAULT",
    "arena_extend_strategy": "kSameAsRequested",
}


class OnnxBackend:
    name: BackendName = "onnx"

    def __init__(self) -> None:
        self.session: ort.InferenceSession | None = None
        self.providers: list[str] = []
        self.device_reason = ""
        self.threads = 0
        self._outputs: list[str] = []

    def initialize(self, manifest: Manifest, settings: BackendSettings, timer: PhaseTimer) -> None:
        path = manifest.path(manifest.backends["onnx"]["model"])
        options = ort.SessionOptions()
        options.intra_op_num_threads = settings.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # EXTENDED fuses LayerNorm/GELU/attention patterns; ALL adds CPU-layout transforms that did not pay here.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.log_severity_level = 3
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if settings.spin else "0")
        if not settings.prepack:
            # Prepacking copies MatMul weights into a packed layout: ~30 ms at init and a second copy in
            # memory, for ~2x faster short-sequence inference. Off only when asked (WARMSTART_ORT_PREPACK=0).
            options.add_session_config_entry("session.disable_prepacking", "1")
        wanted = [(CUDA, _CUDA_OPTIONS), CPU] if settings.cuda.usable else [CPU]
        self.device_reason = settings.cuda.reason
        with timer.phase("session"):
            try:
                self.session = ort.InferenceSession(str(path), options, providers=wanted)
            except Exception as e:  # ORT raises its own Fail/InvalidGraph/NoSuchFile types
                raise ModelLoadError(f"{path}: ONNX Runtime could not load it: {e}") from None
        # Trust what the session got, not what was available: a missing CUDA library falls back silently.
        self.providers = self.session.get_providers()
        if settings.cuda.usable and CUDA not in self.providers:
            self.device_reason = f"{settings.cuda.reason}, but the CUDA provider failed to load (CUDA/cuDNN libraries?)"
        self.threads = settings.threads
        self._outputs = [o.name for o in self.session.get_outputs()]

    def warm_device(self) -> dict[str, Any]:
        if CUDA not in self.providers:
            return {"cuda": False, "reason": self.device_reason}
        # The warm-up inference that follows runs real kernels on the device; here we only make sure the
        # context and the arena exist before it, so its time is inference, not setup.
        assert self.session is not None
        value = ort.OrtValue.ortvalue_from_numpy(np.zeros((1, 8), np.float32), "cuda", 0)
        return {"cuda": True, "reason": self.device_reason, "allocated_on": value.device_name()}

    def run(self, feeds: Arrays) -> Arrays:
        assert self.session is not None
        results = self.session.run(self._outputs, feeds)
        return dict(zip(self._outputs, results, strict=True))

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "providers": self.providers,
            "device": "cuda" if CUDA in self.providers else "cpu",
            "device_reason": self.device_reason,
            "threads": self.threads,
            "onnxruntime": ort.__version__,
        }


def create() -> OnnxBackend:
    return OnnxBackend()
