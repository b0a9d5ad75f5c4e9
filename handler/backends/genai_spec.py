"""The onnxruntime-genai backend's spec (implementation: handler.backends.genai), an engine that takes the whole
request (needs "request"). Stdlib only: the prefetch reads it before numpy is imported."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from handler.backends import q4lib
from handler.backends.genai_load import optimized_mode, start_files
from handler.backends.registry import BackendSpec
from handler.core.config import env_int

MAX_ROWS = 256  # rows of one decode step: past this a CPU step gets no faster per token, only each row slower
# Prompt tokens given to the decoder per step (WARMSTART_GENAI_PREFILL_CHUNK). ONNX Runtime's CPU attention holds a
# heads x step x total-length float32 score matrix, and every step's activations grow with the step: on the
# Qwen3-0.6B-shaped int4 pack a 512-token prompt peaked at 760 MB in one step, 733 in steps of 256, 716 in steps of
# 128, the same greedy tokens. Steps of 64: a first request's peak 11 MB lower again than 128's (ORT's arena holds
# half the activations) for 2.5% more of the prompt's CPU (1.025x, 0.96-1.05, 8 rounds in one process); 32 took
# 4 MB more off for ~11% more CPU than 64 (one run; docs/benchmarks.md, "Where a generate pack's memory goes").
PREFILL_CHUNK = 64


class GenaiSettings(NamedTuple):  # not a dataclass: built in the prefetch's path
    """The engine's own settings. `batch` > 1: requests share the decode steps (handler.backends.genai_batch),
    up to `batch` rows, `queue` more waiting (then 503), the KV cache `kv_tokens` tokens (0: from memory)."""

    batch: int = 1
    kv_tokens: int = 0
    queue: int = 0
    optimized: str = "auto"  # WARMSTART_GENAI_OPTIMIZED: the pack's prepacked decoder where it fits (genai_load)
    prefill_chunk: int = PREFILL_CHUNK  # WARMSTART_GENAI_PREFILL_CHUNK: prompt tokens per decoder step (0: all)
    q4: str = "auto"  # WARMSTART_GENAI_Q4: the pack's Q4MatMul decoder where its library loads (genai_load)
    q4_library: str = ""  # WARMSTART_Q4_LIBRARY: another build of that library (q4lib.library)

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> GenaiSettings:
        """WARMSTART_GENAI_BATCH (rows, 1..256; 1: one generator per request, as before), WARMSTART_GENAI_KV_TOKENS
        (the KV pool, tokens; 0 or unset: the memory left after the model), WARMSTART_GENAI_QUEUE (requests
        waiting for a row; default: as many as the rows), WARMSTART_GENAI_OPTIMIZED (auto | off: genai_load),
        WARMSTART_GENAI_PREFILL_CHUNK (prompt tokens per decoder step, 0: the whole prompt in one; default 64),
        WARMSTART_GENAI_Q4 (auto | off) and WARMSTART_Q4_LIBRARY (q4lib). On Lambda one instance serves one
        request: batch 1."""
        batch = env_int(env, "WARMSTART_GENAI_BATCH", 1, 1, MAX_ROWS)
        if "AWS_LAMBDA_FUNCTION_NAME" in env:
            batch = 1
        kv_tokens = env_int(env, "WARMSTART_GENAI_KV_TOKENS", 0, 0, 1 << 24)
        queue = env_int(env, "WARMSTART_GENAI_QUEUE", batch, 0, 100_000)
        chunk = env_int(env, "WARMSTART_GENAI_PREFILL_CHUNK", PREFILL_CHUNK, 0, 1 << 24)
        library = (env.get(q4lib.ENV_LIBRARY) or "").strip()
        q4lib.library({q4lib.ENV_LIBRARY: library} if library else {})  # a named file must exist: ConfigError
        return cls(batch, kv_tokens, queue, optimized_mode(env), chunk, q4lib.mode(env), library)


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
    # One generator per request (the only engine on Lambda) computes through onnxruntime-genai's C API and the
    # tokenizer: no numpy (a JSON constraint's logits and the batching engine import it where they need it).
    numpy=False,
)
