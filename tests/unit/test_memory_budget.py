"""Batch tokens derived from the memory the instance has and the model's cost per token (issue 32: the budget
derived, not assumed): where the memory is read from, the clamps, WARMSTART_BATCH_TOKENS, bigger model → smaller
runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from handler.core.config import Config
from handler.core.manifest import Manifest
from handler.core.memory import (
    FALLBACK_MEMORY_MB,
    MemoryLimit,
    batch_budget,
    bytes_per_token,
    memory_limit,
)
from handler.runtime.workers import sizing_from_environ

MB = 2**20
MINILM = {"hidden": 384, "layers": 6, "heads": 12, "intermediate": 1536}
BERT_BASE = {"hidden": 768, "layers": 12, "heads": 12, "intermediate": 3072}


def manifest(shape: dict[str, int] | None, dimension: int | None = 384, max_seq: int = 256) -> Manifest:
    return Manifest(
        root=Path("/m"),
        id="m",
        version="1",
        task="embedding",
        default_backend="onnx",
        files={},
        backends={"onnx": {}},
        inputs=(),
        outputs=(),
        max_seq_length=max_seq,
        dimension=dimension,
        shape=shape or {},
    )


def cgroup_tree(tmp_path: Path, files: dict[str, str], own: str = "") -> tuple[Path, Path]:
    root = tmp_path / "cg"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    proc = tmp_path / "proc-cgroup"
    proc.write_text(own)
    return root, proc


def test_lambda_memory_wins_over_the_cgroup(tmp_path: Path) -> None:
    root, proc = cgroup_tree(tmp_path, {"memory.max": str(3 * 1024 * MB)})
    env = {"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1769"}
    assert memory_limit(env, root, proc) == MemoryLimit(1769, "lambda")
    assert memory_limit({}, root, proc) == MemoryLimit(3072, "cgroup-v2")


def test_cgroup_v1_of_the_process_own_group(tmp_path: Path) -> None:
    """The local Lambda and the memory test put the process in its own cgroup: its limit, not the root's."""
    files = {
        "memory/memory.limit_in_bytes": "9223372036854771712",  # v1's "unlimited"
        "memory/inst-1/memory.limit_in_bytes": str(1024 * MB),
    }
    root, proc = cgroup_tree(tmp_path, files, "12:memory:/inst-1\n11:cpu,cpuacct:/x\n")
    assert memory_limit({}, root, proc) == MemoryLimit(1024, "cgroup-v1")


def test_no_limit_anywhere_is_the_documented_fallback(tmp_path: Path) -> None:
    root, proc = cgroup_tree(tmp_path, {"memory.max": "max\n", "memory/memory.limit_in_bytes": str(1 << 63)})
    assert memory_limit({"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "lots"}, root, proc) == MemoryLimit(
        FALLBACK_MEMORY_MB, "fallback"
    )
    assert FALLBACK_MEMORY_MB == 1024


def test_cost_per_token_follows_the_measurements() -> None:
    """bench/hotpath/memory_budget.py: MiniLM 25.0 KB (rows of 64), BERT-base 50.2 KB; at 512-token rows attention
    wins on MiniLM (36.4 KB); BERT-base 48.3 KB. The formula is never under and at most 8% over."""
    for shape, seq, measured in (
        (MINILM, 256, 25.0),
        (BERT_BASE, 256, 50.2),
        (MINILM, 512, 36.4),
        (BERT_BASE, 512, 48.3),
    ):
        cost, source = bytes_per_token(manifest(shape, max_seq=seq))
        assert source == "manifest"
        assert measured * 1024 <= cost <= measured * 1024 * 1.08, (shape, seq, cost)


def test_vocabulary_wide_logits_per_token_are_counted() -> None:
    plain = bytes_per_token(manifest(MINILM))[0]
    splade = bytes_per_token(manifest({**MINILM, "logits": 30522}))[0]  # a SPLADE graph's MLM logits
    assert splade == plain + 12 * 30522 and splade > 10 * plain


def test_an_old_manifest_is_estimated_from_its_width_never_below_the_real_shape() -> None:
    estimated, source = bytes_per_token(manifest(None, dimension=384))
    assert source == "estimated"
    assert estimated >= bytes_per_token(manifest(MINILM))[0]
    assert bytes_per_token(manifest(None, dimension=None))[0] >= bytes_per_token(manifest(BERT_BASE))[0]


def budget(shape: dict[str, int], memory_mb: int, resident_mb: int, runs: int = 1, **config: Any) -> Any:
    cfg = Config(model_dir=Path("/m"), backend=None, **config)
    return batch_budget(cfg, manifest(shape), runs, {}, resident_mb * MB, MemoryLimit(memory_mb, "cgroup-v1"))


def test_a_bigger_model_runs_in_smaller_chunks() -> None:
    """At 1 GiB and 2 workers: MiniLM (113 MB resident) keeps 8,192; BERT-base (393 MB) gets about 2,000."""
    small = budget(MINILM, 1024, 113, runs=2)
    big = budget(BERT_BASE, 1024, 393, runs=2)
    assert (small.batch_tokens, small.source) == (8192, "ceiling")
    assert big.source == "derived" and 1500 < big.batch_tokens < 2500
    # what is left after the resident model, the reserve and the margin, over the runs' cost
    free = (1024 - 393) * MB - 2 * big.reserve_mb * MB - big.margin_mb * MB
    assert big.batch_tokens == int(free // (2 * big.bytes_per_token))
    assert budget(BERT_BASE, 1024, 393, runs=1).batch_tokens > 2 * big.batch_tokens  # one run, one reserve


def test_more_memory_gives_more_up_to_the_ceiling_and_no_memory_the_floor() -> None:
    assert budget(BERT_BASE, 3008, 393, runs=2).batch_tokens == 8192
    starved = budget(BERT_BASE, 512, 393, runs=2)
    assert (starved.batch_tokens, starved.source) == (256, "floor")  # one longest row: rows are never cut


def test_an_explicit_setting_wins_over_the_memory() -> None:
    cfg = Config.from_environ({"WARMSTART_BATCH_TOKENS": "16384"})
    assert cfg.batch_tokens_set
    got = batch_budget(cfg, manifest(BERT_BASE), 2, {}, 393 * MB, MemoryLimit(1024, "cgroup-v1"))
    assert (got.batch_tokens, got.source) == (16384, "WARMSTART_BATCH_TOKENS")
    assert not Config.from_environ({}).batch_tokens_set


def test_the_worker_pool_takes_the_model_budget() -> None:
    assert sizing_from_environ({}, 2, 2018).batch_tokens == 2018
    assert sizing_from_environ({"WARMSTART_BATCH_TOKENS": "512"}, 2).batch_tokens == 512


@pytest.mark.parametrize("bad", [{"hidden": 0}, {"heads": "12"}, ["hidden"]])
def test_a_manifest_shape_must_be_positive_integers(tmp_path: Path, bad: Any) -> None:
    from handler.core.manifest import _shape

    with pytest.raises(ValueError, match=r"shape|hidden|heads"):
        _shape({"shape": bad})
