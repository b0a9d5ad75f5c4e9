"""PyTorch backend: the pack-time torch.export program (what `warmstart pack --from` writes), weights mapped from
safetensors (no copy).

No `torch.load`: nothing is ever unpickled. torch.export's program of the stock transformers model plus the
task's head is the same module the ONNX graph is exported from, so any family that exports serves here too; it is
run by `handler.backends.program` (JSON, ATen operators only) over the mapped weights. A pack made for the
hand-written encoder this backend once carried (architecture "hf-encoder" or "bert-mean-pooled": no program) is
refused at init with the command that re-packs it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from handler.backends.contract import BackendSettings
from handler.backends.pool import current_arena
from handler.backends.program import load as load_program
from handler.backends.weights import mmap_safetensors
from handler.core.errors import ModelLoadError
from handler.core.manifest import Manifest
from handler.core.types import Arrays
from handler.observability.report import PhaseTimer

ARCHITECTURE = "exported-program"


class TorchBackend:
    name = "torch"

    def __init__(self) -> None:
        self.model: Callable[..., torch.Tensor] | None = None
        self.device = torch.device("cpu")
        self.device_reason = ""
        self.threads = 0
        self.output = "sentence_embedding"
        self.inputs: list[str] = []

    def initialize(self, manifest: Manifest, settings: BackendSettings[None], timer: PhaseTimer) -> None:
        spec = manifest.backends["torch"]
        check_architecture(manifest)
        self.threads = settings.threads
        torch.set_num_threads(settings.threads)
        if torch.get_num_interop_threads() != 1:
            # Only settable before any parallel work has run; keep whatever it is then.
            with contextlib.suppress(RuntimeError):
                torch.set_num_interop_threads(1)
        self.output = manifest.outputs[0].name
        self.inputs = [i.name for i in manifest.inputs]
        with timer.phase("load"):
            self.model = self._program(manifest, spec, settings)

    def _program(
        self, manifest: Manifest, spec: dict[str, Any], settings: BackendSettings[None]
    ) -> Callable[..., torch.Tensor]:
        """The exported program over the mapped weights (moved to the GPU once when CUDA is usable)."""
        weights = mmap_safetensors(manifest.path(spec["weights"]))
        self.device_reason = settings.cuda.reason
        if settings.cuda.usable and torch.cuda.is_available():
            self.device = torch.device("cuda")
        elif settings.cuda.usable:
            self.device_reason = f"{settings.cuda.reason}, but this torch build has no CUDA ({torch.__version__})"
        program = load_program(manifest.path(spec["program"]), weights, self.device)
        wanted = [i.name for i in manifest.inputs]
        if program.inputs != wanted:
            raise ModelLoadError(
                f"{program.path}: takes inputs {', '.join(program.inputs)}; the manifest feeds {', '.join(wanted)}"
            )

        def run(*feeds: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = program(*feeds)[0]
            return out

        return run

    def warm_device(self) -> dict[str, Any]:
        if self.device.type != "cuda":
            return {"cuda": False, "reason": self.device_reason}
        # A real allocation and a real kernel (cuBLAS init included), then wait for it.
        x = torch.ones((256, 256), device=self.device)
        (x @ x).sum().item()
        torch.cuda.synchronize()
        return {"cuda": True, "reason": self.device_reason, "name": torch.cuda.get_device_name(self.device)}

    def run(self, feeds: Arrays) -> Arrays:
        assert self.model is not None
        # from_numpy shares the (pooled) feed buffers: no copy on CPU; from pinned memory on CUDA.
        cuda = self.device.type == "cuda"
        with torch.inference_mode():
            # The program's inputs in its order (checked against the manifest at load): token ids and mask (and
            # types), SigLIP's ids alone, or an image tower's pixel_values.
            out = self.model(*(torch.from_numpy(feeds[n]).to(self.device, non_blocking=cuda) for n in self.inputs))
            arena = current_arena()
            if not cuda or arena is None:
                # On CPU the model's own output tensor is fresh memory already; a pooled copy would only cost.
                return {self.output: out.cpu().numpy()}
            host = arena.take(tuple(out.shape), np.float32)
            torch.from_numpy(host).copy_(out, non_blocking=True)  # device → pooled (pinned) host buffer
            torch.cuda.current_stream(self.device).synchronize()
        return {self.output: host}

    def set_threads(self, threads: int) -> int:
        # torch's OpenMP pool is created lazily at the next parallel region, so this is safe after a fork.
        torch.set_num_threads(max(1, threads))
        self.threads = torch.get_num_threads()
        return self.threads

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "providers": [f"torch-{self.device.type}"],
            "device": self.device.type,
            "device_reason": self.device_reason,
            "threads": self.threads,
            "torch": torch.__version__,
        }


def check_architecture(manifest: Manifest) -> None:
    """The torch entry runs the exported program; a pack made for the hand-written encoder (no program) gets one
    line saying how to re-pack it."""
    spec = manifest.backends["torch"]
    architecture = spec.get("architecture")
    where = manifest.root / "manifest.json"
    if "program" not in spec:
        source = (manifest.raw.get("source") or {}).get("dir") or "SOURCE_DIR"
        raise ModelLoadError(
            f"{where}: packed for the hand-written torch encoder ({architecture!r}, no exported program), which is "
            f"gone; re-pack it: warmstart pack --from {source} --out {manifest.root} --force "
            "(or serve this pack with WARMSTART_BACKEND=onnx)"
        )
    if architecture != ARCHITECTURE:
        raise ModelLoadError(f"{where}: torch architecture {architecture!r}; valid: {ARCHITECTURE}")


def create() -> TorchBackend:
    return TorchBackend()
