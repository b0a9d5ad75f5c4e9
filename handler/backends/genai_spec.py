"""The onnxruntime-genai backend's spec (implementation: handler.backends.genai), an engine that takes the whole
request (needs "request"). Stdlib only: the prefetch reads it before numpy is imported."""

from __future__ import annotations

from handler.backends.genai_load import GenaiSettings, start_files
from handler.backends.registry import BackendSpec

SPEC = BackendSpec(
    name="genai",
    module="handler.backends.genai",
    needs="request",
    # The bindings and the library they link, then the ONNX Runtime that library opens when a model loads
    # (the C API's copy: the genai library runs its sessions through it).
    libraries=(
        (
            "onnxruntime_genai",
            ("onnxruntime_genai/onnxruntime_genai.*.so", "onnxruntime_genai/libonnxruntime-genai.so"),
        ),
        ("onnxruntime", ("onnxruntime/capi/libonnxruntime.so*",)),
    ),
    # WARMSTART_GENAI_OPTIMIZED, and the pack's files a start reads (the optimized decoder's where it will be
    # opened, the ranges of its data a session reads): handler.backends.genai_load.
    settings=GenaiSettings.from_environ,
    start_files=start_files,
)
