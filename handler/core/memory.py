"""How many padded tokens one model run may hold: from the memory this instance really has and the model's
activation cost per token (docs/configuration.md#memory).

A model run's activation memory grows with its padded tokens (rows x the longest row), so every run is cut to
`batch_tokens` (handler.tasks.text.chunks). A fixed number fits one model and one memory size; this derives it
from the limit the instance runs under and the model's shape, so a bigger model runs in smaller chunks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from handler.core.config import Config
from handler.core.cpu import own_cgroup
from handler.core.manifest import Manifest
from handler.core.records import record

# No Lambda setting and no cgroup limit (a laptop, a host without limits): size for the deploy manifests'
# `limits.memory: 1Gi` (infra/deploy/k8s/warmstart.yaml, infra/deploy/knative.yaml).
FALLBACK_MEMORY_MB = 1024
# A cgroup "limit" at or above this is the kernel's "unlimited" (v1 writes 2^63 rounded to a page).
_UNLIMITED = 1 << 60
CEILING_TOKENS = 8192  # past this a run gets no faster (docs/http-host.md) and memory only grows
# The body, its parsed strings and the tokenizer's peak for one request, per character of the largest request
# the limits allow (max_inputs x max_chars): 153 MB measured for 256 x 20,000 CJK characters (5.12 M): 30 B.
REQUEST_BYTES_PER_CHAR = 32
MARGIN = 0.10  # of the memory: the allocator's slack, the warm-up's and the answer's buffers, fragmentation
# Activation bytes per padded token, fitted to peak RSS above the warm instance (bench/hotpath/memory_budget.py):
# MiniLM (hidden 384, intermediate 1,536, 12 heads) 23.5-25.0 KB at rows of 64-256 tokens and 36 KB at 512;
# BERT-base (768, 3,072, 12 heads) 47.1-50.2 KB at 64-256. The peak is the larger of two phases: the
# feed-forward's (~67 B a unit of width: 25.6 KB and 51.4 KB) and attention's, whose scores grow with the row
# (4 B x heads x the longest row, over ~32 B a hidden unit: 36.4 KB at 512 on MiniLM, 48.3 KB on BERT-base).
# The formula gives 25.5 / 51.0 KB at rows up to 256 and 37.1 / 51.0 KB at 512: 0-8% over every measurement.
FFN_BYTES_PER_WIDTH = 68
ATTENTION_BYTES_PER_HIDDEN = 34
SCORE_BYTES = 4  # float32 attention scores: one per head per pair of tokens
# A graph that holds vocabulary-wide logits per token before pooling them (SPLADE: 30,522 floats a token, ten
# times the encoder's own activations): the logits, their masked copy and one more in flight, float32.
# Unmeasured: three copies is the upper end of what the pooling's elementwise steps keep alive at once.
LOGIT_BYTES = 12


@record
class MemoryLimit:
    mb: int
    source: str  # lambda (AWS_LAMBDA_FUNCTION_MEMORY_SIZE), cgroup-v2, cgroup-v1, fallback


def _cgroup_limit(root: Path, proc_cgroup: Path | None) -> tuple[int | None, str]:
    own_v2, own_v1 = own_cgroup(proc_cgroup, "memory")
    candidates = [
        *((base / "memory.max", "cgroup-v2") for base in dict.fromkeys([root / own_v2.lstrip("/"), root])),
        *(
            (base / "memory.limit_in_bytes", "cgroup-v1")
            for base in dict.fromkeys([root / "memory" / own_v1.lstrip("/"), root / "memory"])
        ),
    ]
    for path, kind in candidates:  # the process's own cgroup first, then the hierarchy's root
        try:
            raw = path.read_text().strip()
        except OSError:
            continue
        if raw == "max" or (raw.isdigit() and int(raw) >= _UNLIMITED):
            continue
        if raw.isdigit():
            return int(raw), kind
    return None, "none"


def memory_limit(
    environ: Mapping[str, str] | None = None,
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    proc_cgroup: Path | None = Path("/proc/self/cgroup"),
) -> MemoryLimit:
    """Lambda's configured memory, else the cgroup's limit, else FALLBACK_MEMORY_MB."""
    env = os.environ if environ is None else environ
    lambda_mb = (env.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE") or "").strip()
    if lambda_mb.isdigit() and int(lambda_mb) > 0:
        return MemoryLimit(int(lambda_mb), "lambda")
    limit, kind = _cgroup_limit(cgroup_root, proc_cgroup)
    if limit is not None:
        return MemoryLimit(limit // 2**20, kind)
    return MemoryLimit(FALLBACK_MEMORY_MB, "fallback")


def bytes_per_token(manifest: Manifest) -> tuple[int, str]:
    """Activation bytes per padded token of one run at the model's longest row, and where the shape came from.

    A manifest packed before `shape` was recorded gives only the output width (`dimension`): hidden is taken
    as that (768 without it), intermediate as 4 x hidden and heads as hidden / 32 (twice the usual 64-wide
    heads: an over-estimate, so the run is smaller, never larger, than the measured cost allows)."""
    shape = manifest.shape
    seq = manifest.max_seq_length or 512
    if "hidden" in shape:
        hidden, source = shape["hidden"], "manifest"
    else:
        hidden, source = manifest.dimension or 768, "estimated"
    intermediate = shape.get("intermediate", 4 * hidden)
    heads = shape.get("heads", max(1, hidden // 32))
    if len(shape.keys() & {"hidden", "intermediate", "heads"}) < 3:
        source = "estimated"
    ffn = FFN_BYTES_PER_WIDTH * max(hidden, intermediate // 4)
    attention = ATTENTION_BYTES_PER_HIDDEN * hidden + SCORE_BYTES * heads * seq
    return max(ffn, attention) + LOGIT_BYTES * shape.get("logits", 0), source


@record
class Budget:
    """What one model run may hold, and the figures it came from (the init report's `limits`)."""

    memory: MemoryLimit
    resident_mb: float  # RSS after the model loaded
    reserve_mb: float  # the worst request's body, strings and tokenization, per run at once
    margin_mb: float
    runs: int
    bytes_per_token: int
    shape: str  # manifest | estimated
    batch_tokens: int
    # derived | ceiling (8,192, or the caller's Config) | floor (the memory left holds less than one longest row)
    # | WARMSTART_BATCH_TOKENS
    source: str

    def describe(self) -> dict[str, Any]:
        return {
            "memory_mb": self.memory.mb,
            "memory_from": self.memory.source,
            "resident_mb": round(self.resident_mb),
            "request_reserve_mb": round(self.reserve_mb),
            "margin_mb": round(self.margin_mb),
            "runs_at_once": self.runs,
            "bytes_per_token": self.bytes_per_token,
            "shape_from": self.shape,
            "batch_tokens": self.batch_tokens,
            "batch_tokens_from": self.source,
        }


def derive(
    memory: MemoryLimit,
    resident_bytes: int,
    per_token: int,
    runs: int,
    max_inputs: int,
    max_chars: int,
    floor: int,
    ceiling: int = CEILING_TOKENS,
) -> tuple[int, str, float, float]:
    """(batch tokens, source, reserve MB, margin MB):
    `(memory - resident - runs x reserve - margin) / (runs x bytes per token)`, clamped to [floor, ceiling].

    Each of `runs` model runs at once (the HTTP host's workers) may be serving the worst request: its own
    reserve (max_inputs x max_chars x 32 B: 164 MB at the defaults) and its own run. At 1 GiB with the default
    model (113 MB resident, 25.5 KB a token) and 2 workers: (1024 - 113 - 328 - 102) MB / 51 KB = 9,657 ->
    8,192; BERT-base (393 MB resident, 51 KB a token): 201 MB / 102 KB = 2,018 (one worker: 7,329).
    `floor` (the longest row) wins over the memory: a row is never cut, only rows are grouped."""
    runs = max(1, runs)
    total = memory.mb * 2**20
    reserve = max_inputs * max_chars * REQUEST_BYTES_PER_CHAR
    margin = total * MARGIN
    free = total - resident_bytes - runs * reserve - margin
    tokens = int(free // (runs * per_token)) if free > 0 else 0
    source = "derived"
    if tokens < floor:
        tokens, source = floor, "floor"
    if tokens > ceiling:
        tokens, source = ceiling, "ceiling"
    return tokens, source, reserve / 2**20, margin / 2**20


def resident_bytes(status: Path = Path("/proc/self/status")) -> int:
    """This process's RSS now (0 where /proc is not there: the budget then leaves the margin to cover it)."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def batch_budget(
    config: Config,
    manifest: Manifest,
    runs: int,
    environ: Mapping[str, str] | None = None,
    resident: int | None = None,
    limit: MemoryLimit | None = None,
) -> Budget:
    """The padded tokens of one of this model's runs: WARMSTART_BATCH_TOKENS when set, else `derive` from the
    memory limit, the RSS now (`resident`) and the model's cost, at most `config.batch_tokens`. Reads one or
    two cgroup files and /proc/self/status: ~0.1 ms, no model run."""
    limit = limit or memory_limit(environ)
    resident = resident_bytes() if resident is None else resident
    per_token, shape = bytes_per_token(manifest)
    floor = manifest.max_seq_length or 512
    tokens, source, reserve, margin = derive(
        limit, resident, per_token, runs, config.max_inputs, config.max_chars, floor, config.batch_tokens
    )
    if config.batch_tokens_set:
        tokens, source = config.batch_tokens, "WARMSTART_BATCH_TOKENS"
    return Budget(limit, resident / 2**20, reserve, margin, max(1, runs), per_token, shape, tokens, source)
