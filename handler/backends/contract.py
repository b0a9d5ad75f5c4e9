"""The accelerator contract (initialize / run / describe) and the registry that picks one by name.

Backend modules are imported only when chosen: `onnxruntime` costs ~0.3 s to import and `torch` ~2.5 s,
and a function pays only for the one it runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from handler.backends.device import CudaProbe
from handler.core.config import env_bool, env_switch
from handler.core.errors import ConfigError
from handler.core.manifest import Manifest
from handler.core.types import BACKEND_NAMES, Arrays, BackendName
from handler.observability.report import PhaseTimer

_MODULES: dict[BackendName, str] = {"onnx": "handler.backends.ort", "torch": "handler.backends.pytorch"}


@dataclass(frozen=True)
class BackendSettings:
    threads: int
    cuda: CudaProbe
    spin: bool  # let intra-op threads spin between ops: faster, but burns billed CPU time on Lambda
    prepack: bool = True
    # The manifest's pre-optimized ONNX model with prepacked weights, when made for this ORT and CPU
    # (WARMSTART_ORT_OPTIMIZED=0: never).
    optimized: bool = True
    # Outputs bound into pooled buffers: None lets the backend decide (on for CUDA, where it saves a copy).
    iobinding: bool | None = None

    @classmethod
    def from_environ(cls, env: Mapping[str, str], threads: int, cuda: CudaProbe, spin: bool) -> BackendSettings:
        """ONNX Runtime's switches parsed as every other setting (`WARMSTART_ORT_PREPACK=false` is off; a value
        outside 1/0/true/false/yes/no/on/off fails init with ConfigError)."""
        return cls(
            threads=threads,
            cuda=cuda,
            spin=spin,
            prepack=env_bool(env, "WARMSTART_ORT_PREPACK", True),
            optimized=env_bool(env, "WARMSTART_ORT_OPTIMIZED", True),
            iobinding=env_switch(env, "WARMSTART_ORT_IOBINDING"),
        )


class Backend(Protocol):
    name: BackendName

    def initialize(self, manifest: Manifest, settings: BackendSettings, timer: PhaseTimer) -> None:
        """Map the weights and build what runs them; record sub-phases on `timer`."""

    def warm_device(self) -> dict[str, Any]:
        """Initialize the accelerator for real (context, an allocation, a kernel); say what was done."""

    def run(self, feeds: Arrays) -> Arrays:
        """Named inputs → named outputs, as the manifest's spec says."""

    def set_threads(self, threads: int) -> int:
        """Change the intra-op thread count after init (a restored snapshot); returns the count in effect."""

    def describe(self) -> dict[str, Any]:
        """Facts for the init report and status: providers, device, threads, versions."""


def create_backend(name: str, manifest: Manifest) -> Backend:
    if name not in BACKEND_NAMES:
        raise ConfigError(f"unknown backend {name!r}; valid backends: {', '.join(BACKEND_NAMES)}")
    if name in manifest.unsupported_backends:
        raise ConfigError(
            f"model {manifest.key} cannot run on backend {name!r}: {manifest.unsupported_backends[name]}; "
            f"it is packed for: {', '.join(sorted(manifest.backends))}"
        )
    if name not in manifest.backends:
        raise ConfigError(
            f"model {manifest.key} is not packed for backend {name!r}; it is packed for: "
            f"{', '.join(sorted(manifest.backends))}"
        )
    module = importlib.import_module(_MODULES[name])
    backend: Backend = module.create()
    return backend
