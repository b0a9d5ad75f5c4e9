"""What precision a pack is made in (`--dtype`, `--quantize`), which backend runs each, and the manifest's
`precision` entry.

float32: both backends, as before. float16 / bfloat16: the torch backend's exported program, captured with the
model in that dtype (torch runs both on CPU and on CUDA). ONNX graphs are not packed in float16/bfloat16:
ONNX Runtime's CPU execution provider has no bfloat16 kernels and runs a float16 graph no faster than float32
(`ONNX_DTYPE_REFUSED`); its CUDA provider has the kernels, but nothing at pack time can check them.
int8 / int8-block: ONNX Runtime's quantized operators (infra.pack.quantize); int8-dynamic is refused (one
activation scale per tensor: a text's answer would depend on its batch-mates); the torch
backend's program is float. Every reduced precision passes the quality gate (infra.pack.quality) first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from infra.pack.hf_source import UnsupportedModelError

DTYPES = ("float32", "float16", "bfloat16")
QUANTIZATIONS = ("int8", "int8-block", "int4")  # infra.pack.quantize.METHODS, and int4 for task generate
ENCODER_QUANTIZATIONS = ("int8", "int8-block")  # int4: the model builder's, causal LMs only (infra.pack.lm_pack)
# Choices that are refused with their reason (infra.pack.quantize.REFUSED holds the same words).
REFUSED_QUANTIZATIONS = {
    "int8-dynamic": "one activation scale per tensor, so a text's answer depends on its batch-mates",
}
ONNX_DTYPE_REFUSED = (
    "ONNX graphs are packed float32 or int8 only: ONNX Runtime's CPU execution provider has no bfloat16 kernels "
    "(MatMul, Add: NOT_IMPLEMENTED) and ran all-MiniLM-L6-v2's float16 graph at 1.08x float32's CPU time (batch "
    "32); int8 is 0.27x the size. The torch backend runs {dtype} on CPU and CUDA (--backends torch)"
)
TORCH_INT8_REFUSED = (
    "int8 is ONNX Runtime's quantization; the torch backend's program runs float32, float16 or bfloat16"
)


class PrecisionError(UnsupportedModelError):
    """A precision option outside its closed set, or a combination no backend runs."""


@dataclass(frozen=True)
class Precision:
    dtype: str = "float32"
    quantize: str | None = None
    calibration: tuple[str, ...] | None = None  # None: infra.pack.calibration's built-in set
    min_quality: float | None = None  # None: infra.pack.quality.DEFAULT_MIN_QUALITY for the task

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise PrecisionError(f"--dtype {self.dtype!r}; valid: {', '.join(DTYPES)}")
        if self.quantize in REFUSED_QUANTIZATIONS:
            raise PrecisionError(
                f"--quantize {self.quantize} is refused: {REFUSED_QUANTIZATIONS[self.quantize]}; "
                f"valid: {', '.join(QUANTIZATIONS)}"
            )
        if self.quantize is not None and self.quantize not in QUANTIZATIONS:
            raise PrecisionError(f"--quantize {self.quantize!r}; valid: {', '.join(QUANTIZATIONS)}")
        if self.quantize is not None and self.dtype != "float32":
            raise PrecisionError(
                f"--quantize {self.quantize} with --dtype {self.dtype}: choose one (int8 quantizes the float32 graph)"
            )
        if self.min_quality is not None and not 0.0 <= self.min_quality <= 1.0:
            raise PrecisionError(f"--min-quality {self.min_quality}: a figure between 0 and 1")
        if self.calibration is not None and not self.calibration:
            raise PrecisionError("--calibration: no texts")

    @property
    def reduced(self) -> bool:
        return self.dtype != "float32" or self.quantize is not None

    def texts(self, tokenizer: Any = None, max_length: int = 512) -> list[str]:
        """The gate's texts: the user's, or the built-in set with the model tokenizer's own hard texts
        (calibration.model_texts) first and the retrieval check's queries and documents last."""
        from infra.pack.calibration import builtin_texts, model_texts, retrieval_texts

        if self.calibration is not None:
            return list(self.calibration)
        own = model_texts(tokenizer, max_length) if tokenizer is not None else []
        return [*own, *builtin_texts(), *retrieval_texts()]

    def backends(
        self, chosen: tuple[str, ...], unsupported: dict[str, str], asked: Sequence[str] | None
    ) -> tuple[tuple[str, ...], dict[str, str]]:
        """The backends that run this precision: one asked for that cannot is refused; from the default set it
        is dropped with the reason in `unsupported_backends`."""
        if self.quantize is not None and self.quantize not in ENCODER_QUANTIZATIONS:
            raise PrecisionError(
                f"--quantize {self.quantize} is for causal LMs (task generate); encoders: "
                f"{', '.join(ENCODER_QUANTIZATIONS)}"
            )
        cannot = {}
        if self.quantize is not None:
            cannot["torch"] = TORCH_INT8_REFUSED
        elif self.dtype != "float32":
            cannot["onnx"] = ONNX_DTYPE_REFUSED.format(dtype=self.dtype)
        refused = [b for b in chosen if b in cannot]
        if asked is not None and refused:
            what = f"--quantize {self.quantize}" if self.quantize else f"--dtype {self.dtype}"
            raise PrecisionError(f"{what} with backend {refused[0]}: {cannot[refused[0]]}")
        kept = tuple(b for b in chosen if b not in cannot)
        if not kept:
            raise PrecisionError(
                f"no backend packs this model in {self.label}: " + "; ".join(f"{b}: {cannot[b]}" for b in refused)
            )
        return kept, {**unsupported, **{b: cannot[b] for b in refused}}

    @property
    def label(self) -> str:
        return self.quantize or self.dtype

    def entry(self, quality: dict[str, Any] | None, **more: Any) -> dict[str, Any]:
        """The manifest's `precision`: dtype, quantization, calibration set and the gate's figures."""
        out: dict[str, Any] = {"dtype": self.dtype, "quantization": self.quantize}
        if quality is not None:
            out["quality"] = {
                **quality,
                "calibration": "built-in" if self.calibration is None else "file",
            }
        out.update(more)
        return out
