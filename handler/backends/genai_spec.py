"""The onnxruntime-genai backend's spec (implementation: handler.backends.genai), an engine that takes the whole
request (needs "request"). Stdlib only: the prefetch reads it before numpy is imported."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from handler.backends.registry import BackendSpec
from handler.core.config import env_int

MAX_ROWS = 256  # rows of one decode step: past this a CPU step gets no faster per token, only each row slower


class GenaiSettings(NamedTuple):  # not a dataclass: built in the prefetch's path
    """The engine's own settings. `batch` > 1: requests share the decode steps (handler.backends.genai_batch),
    up to `batch` rows, `queue` more waiting (then 503), the KV cache `kv_tokens` tokens (0: from memory)."""

    batch: int = 1
    kv_tokens: int = 0
    queue: int = 0

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> GenaiSettings:
        """WARMSTART_GENAI_BATCH (rows, 1..256; 1: one generator per request, as before), WARMSTART_GENAI_KV_TOKENS
        (the KV pool, tokens; 0 or unset: the memory left after the model), WARMSTART_GENAI_QUEUE (requests
        waiting for a row; default: as many as the rows). On Lambda one instance serves one request: batch 1."""
        batch = env_int(env, "WARMSTART_GENAI_BATCH", 1, 1, MAX_ROWS)
        if "AWS_LAMBDA_FUNCTION_NAME" in env:
            batch = 1
        kv_tokens = env_int(env, "WARMSTART_GENAI_KV_TOKENS", 0, 0, 1 << 24)
        queue = env_int(env, "WARMSTART_GENAI_QUEUE", batch, 0, 100_000)
        return cls(batch, kv_tokens, queue)


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
    settings=GenaiSettings.from_environ,
)
