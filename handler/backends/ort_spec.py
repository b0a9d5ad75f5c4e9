"""The ONNX Runtime backend's spec (implementation: handler.backends.ort) and its own settings, the
`WARMSTART_ORT_*` switches. Stdlib only: the prefetch reads it before numpy is imported."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from handler.backends.registry import BackendSpec, Ranges
from handler.core.config import env_bool, env_switch
from handler.core.records import record


# A record, not a dataclass (built in the prefetch's path: ~0.2 ms against ~1 ms) nor a NamedTuple (its `exec`'d
# __new__ ran the compiler: ~0.5 M instructions more a start, callgrind).
@record
class OrtSettings:
    prepack: bool = True
    # The manifest's pre-optimized ONNX model with prepacked weights, when made for this ORT and CPU
    # (WARMSTART_ORT_OPTIMIZED=0: never).
    optimized: bool = True
    # Outputs bound into pooled buffers: None lets the backend decide (on for CUDA, where it saves a copy).
    iobinding: bool | None = None
    # ONNX Runtime's C API on the CPU (handler.backends.ort_capi), where the start never imports the Python
    # package (WARMSTART_ORT_CAPI=0: the binding, as CUDA always uses).
    capi: bool = True

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> OrtSettings:
        """Parsed as every other setting (`WARMSTART_ORT_PREPACK=false` is off; a value outside
        1/0/true/false/yes/no/on/off fails init with ConfigError)."""
        return cls(
            prepack=env_bool(env, "WARMSTART_ORT_PREPACK", True),
            optimized=env_bool(env, "WARMSTART_ORT_OPTIMIZED", True),
            iobinding=env_switch(env, "WARMSTART_ORT_IOBINDING"),
            capi=env_bool(env, "WARMSTART_ORT_CAPI", True),
        )


def start_files(entry: Mapping[str, Any], env: Mapping[str, str]) -> tuple[list[str], Ranges]:
    """The pre-optimized model's files and the ranges the session reads of them, when the session will open
    them (made for this CPU, not switched off), else the portable model's files."""
    names = list(entry.get("files", []))
    optimized = entry.get("optimized")
    settings = OrtSettings.from_environ(env)
    if not optimized or not (settings.optimized and settings.prepack) or not _fits(optimized):
        return names, {}
    return list(optimized.get("files", [])) or names, optimized.get("touched_ranges") or {}


def _fits(optimized: Mapping[str, Any]) -> bool:
    from handler.backends.fingerprint import cpu_fingerprint

    fp = cpu_fingerprint()
    return bool(optimized.get("arch") == fp["arch"] and optimized.get("cpu_features") == fp["cpu_features"])


SPEC = BackendSpec(
    name="onnx",
    module="handler.backends.ort",
    needs="arrays",
    # A CPU start loads the C library (handler.backends.ort_capi), never the Python module (which embeds its own
    # copy of the runtime and is loaded only for CUDA or where the C API is switched off or unusable).
    libraries=(("onnxruntime", ("onnxruntime/capi/libonnxruntime.so.*",)),),
    settings=OrtSettings.from_environ,
    start_files=start_files,
    lean=True,  # the C API's Session.run_buffers (a CUDA or binding start takes the numpy path at its first request)
)
