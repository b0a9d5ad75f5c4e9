"""PyTorch backend: a pack-time torch.export program, or the hand-written encoder, weights mapped from
safetensors (no copy).

No `torch.load`: nothing is ever unpickled. Architectures:
- "exported-program" (what `pack --from` writes): torch.export's program of the stock transformers model plus
  the task's head, the same module the ONNX graph is exported from, so any family that exports serves here
  too; run by `handler.backends.program` (JSON, ATen operators only) over the mapped weights.
- "hf-encoder" (packs made before the exported program) and "bert-mean-pooled" (the default model's packs
  made before `pack --default` went through `pack --from`'s path):
  `encoder_torch`'s hand-written encoder, built on the meta device, weights adopted with `assign=True`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from handler.backends.contract import BackendSettings
from handler.backends.encoder_torch import EncoderConfig, HFEncoder, weight_names
from handler.backends.pool import current_arena
from handler.backends.program import load as load_program
from handler.backends.weights import mmap_safetensors
from handler.core.errors import ModelLoadError
from handler.core.manifest import Manifest
from handler.core.types import Arrays, BackendName
from handler.observability.report import PhaseTimer

_ARCHITECTURES = ("bert-mean-pooled", "hf-encoder", "exported-program")


class TorchBackend:
    name: BackendName = "torch"

    def __init__(self) -> None:
        self.model: Callable[..., torch.Tensor] | None = None
        self.device = torch.device("cpu")
        self.device_reason = ""
        self.threads = 0
        self.output = "sentence_embedding"

    def initialize(self, manifest: Manifest, settings: BackendSettings, timer: PhaseTimer) -> None:
        spec = manifest.backends["torch"]
        if spec.get("architecture") not in _ARCHITECTURES:
            raise ModelLoadError(
                f"{manifest.root / 'manifest.json'}: torch architecture {spec.get('architecture')!r}; "
                f"valid: {', '.join(_ARCHITECTURES)}"
            )
        path = manifest.path(spec["weights"])
        self.threads = settings.threads
        torch.set_num_threads(settings.threads)
        if torch.get_num_interop_threads() != 1:
            # Only settable before any parallel work has run; keep whatever it is then.
            with contextlib.suppress(RuntimeError):
                torch.set_num_interop_threads(1)
        self.output = manifest.outputs[0].name
        if spec["architecture"] == "exported-program":
            with timer.phase("load"):
                self.model = self._program(manifest, spec, settings)
            return
        with timer.phase("load"):
            weights = mmap_safetensors(path)
            model = self._build(manifest, spec)
            names, missing = weight_names(model, model.family, set(weights))
            if missing:
                raise ModelLoadError(f"{path}: missing tensors {sorted(missing)[:5]} ({len(missing)} in all)")
            # assign=True adopts the mapped tensors as parameters instead of copying into fresh ones; a
            # float16/bfloat16 checkpoint is widened once here (CPU kernels are float32).
            state = {
                k: weights[n] if weights[n].dtype == torch.float32 else weights[n].float() for k, n in names.items()
            }
            model.load_state_dict(state, assign=True, strict=True)
            model.eval().requires_grad_(False)
        self.device_reason = settings.cuda.reason
        if settings.cuda.usable and torch.cuda.is_available():
            with timer.phase("to_device"):
                self.device = torch.device("cuda")
                model = model.to(self.device)
        elif settings.cuda.usable:
            self.device_reason = f"{settings.cuda.reason}, but this torch build has no CUDA ({torch.__version__})"
        self.model = model

    def _program(
        self, manifest: Manifest, spec: dict[str, Any], settings: BackendSettings
    ) -> Callable[..., torch.Tensor]:
        """The exported program over the mapped weights (moved to the GPU once when CUDA is usable)."""
        weights = mmap_safetensors(manifest.path(spec["weights"]))
        self.device_reason = settings.cuda.reason
        if settings.cuda.usable and torch.cuda.is_available():
            self.device = torch.device("cuda")
        elif settings.cuda.usable:
            self.device_reason = f"{settings.cuda.reason}, but this torch build has no CUDA ({torch.__version__})"
        program = load_program(manifest.path(spec.get("program", "program.json")), weights, self.device)
        wanted = [i.name for i in manifest.inputs]
        if program.inputs != wanted:
            raise ModelLoadError(
                f"{program.path}: takes inputs {', '.join(program.inputs)}; the manifest feeds {', '.join(wanted)}"
            )

        def run(*feeds: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = program(*feeds)[0]
            return out

        return run

    @staticmethod
    def _build(manifest: Manifest, spec: dict[str, Any]) -> HFEncoder:
        """The model for the manifest, on the meta device (no memory, nothing initialized)."""
        normalize = bool(manifest.pooling.get("normalize", True))
        family = "bert" if spec["architecture"] == "bert-mean-pooled" else spec.get("family") or manifest.family
        try:
            config = EncoderConfig.from_hf(str(family), spec["config"])
            with torch.device("meta"):
                return HFEncoder(
                    config,
                    head=spec.get("head", "none"),
                    pooling=str(manifest.pooling.get("mode", "mean")),
                    normalize=normalize,
                    activation=manifest.options.get("activation"),  # a rerank model's (its spec's field)
                )
        except (KeyError, TypeError, ValueError) as e:
            raise ModelLoadError(f"{manifest.root / 'manifest.json'}: backends.torch: {e}") from None

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
            ids = torch.from_numpy(feeds["input_ids"]).to(self.device, non_blocking=cuda)
            mask = torch.from_numpy(feeds["attention_mask"]).to(self.device, non_blocking=cuda)
            if "token_type_ids" in feeds:
                types = torch.from_numpy(feeds["token_type_ids"]).to(self.device, non_blocking=cuda)
                out = self.model(ids, mask, types)
            else:
                out = self.model(ids, mask)
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


def create() -> TorchBackend:
    return TorchBackend()
