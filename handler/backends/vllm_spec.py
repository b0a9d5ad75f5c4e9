"""The vLLM backend's spec (implementation: handler.backends.vllm_engine), an engine that takes the whole request
(needs "request") and runs it on a CUDA GPU with continuous batching and a paged KV cache. Stdlib only: the
prefetch reads it before numpy is imported.

Its settings (checked before vLLM is imported, so a bad value costs no import):

| variable | default | what |
|---|---|---|
| WARMSTART_VLLM_GPU_MEMORY_PERCENT | 90 | the share of the GPU's memory vLLM takes (weights, CUDA graphs, KV cache) |
| WARMSTART_VLLM_MAX_NUM_SEQS | vLLM's | the most sequences one decode step batches |
| WARMSTART_VLLM_ENFORCE_EAGER | off | skip CUDA graph capture at init (a faster init, a slower decode) |
| WARMSTART_STANDBY_AFTER_S | unset | set: sleep mode enabled, for the host's warm standby (which checks the value) |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from handler.backends.registry import BackendSpec
from handler.core.config import env_bool, env_int

NAME = "vllm"
HF_DIR = "hf"  # the pack's copy of the source directory vLLM loads (infra/pack/lm_vllm.py writes it)
STANDBY_ENV = "WARMSTART_STANDBY_AFTER_S"  # handler.http_host.standby reads its value


@dataclass(frozen=True)
class VllmSettings:
    gpu_memory_utilization: float
    max_num_seqs: int | None
    enforce_eager: bool
    sleep_mode: bool


def settings(env: Mapping[str, str]) -> VllmSettings:
    percent = env_int(env, "WARMSTART_VLLM_GPU_MEMORY_PERCENT", 90, 5, 99)
    seqs = env_int(env, "WARMSTART_VLLM_MAX_NUM_SEQS", 0, 0, 1 << 16)
    return VllmSettings(
        gpu_memory_utilization=percent / 100,
        max_num_seqs=seqs or None,
        enforce_eager=env_bool(env, "WARMSTART_VLLM_ENFORCE_EAGER", False),
        # The cumem allocator sleep mode needs costs a little at every allocation: only when a standby can use it.
        sleep_mode=bool((env.get(STANDBY_ENV) or "").strip()),
    )


SPEC = BackendSpec(name=NAME, module="handler.backends.vllm_engine", needs="request", settings=settings)
