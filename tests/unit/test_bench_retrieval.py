"""bench/peers/retrieval.py's pure parts: the parity comparison that decides whether a pair is timed, the
per-kind table with its within-round ratios, and the flag refusals. Nothing is built or started here."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.peers import retrieval as br


def test_max_diff_of_dense_and_multi_vector_answers() -> None:
    assert br.max_diff("hybrid", [[1.0, 2.0], [0.5, 0.5]], [[1.0, 2.5], [0.5, 0.25]]) == pytest.approx(0.5)
    assert br.max_diff("colbert", [[[1.0, 0.0], [0.0, 1.0]]], [[[1.0, 0.0], [0.0, 1.0]]]) == 0.0
    # another number of tokens, rows or widths is no small difference: it is another answer
    assert br.max_diff("colbert", [[[1.0, 0.0], [0.0, 1.0]]], [[[1.0, 0.0]]]) == math.inf
    assert br.max_diff("hybrid", [[1.0]], [[1.0], [1.0]]) == math.inf
    assert br.max_diff("rerank", [0.25, 0.5], [0.25, 0.75]) == pytest.approx(0.25)


def test_max_diff_of_sparse_answers_needs_the_same_terms() -> None:
    a = [{"indices": [3, 7], "values": [0.5, 1.0]}]
    assert br.max_diff("sparse", a, [{"indices": [3, 7], "values": [0.5, 1.25]}]) == pytest.approx(0.25)
    assert br.max_diff("sparse", a, [{"indices": [3, 8], "values": [0.5, 1.0]}]) == math.inf
    assert br.max_diff("sparse", [{"indices": [], "values": []}], [{"indices": [], "values": []}]) == 0.0


def test_every_kind_names_its_sides_pairs_and_build() -> None:
    assert set(br.SIDES) == set(br.PARITY) == set(br.RATIOS) == set(br.BUILDS) == set(br.KINDS)
    for kind, pairs in br.PARITY.items():
        for a, b, tol in pairs:
            assert a in br.SIDES[kind] and (b in br.SIDES[kind] or b == "reference") and 0 < tol < 1e-2
    for kind, pairs in br.RATIOS.items():
        assert all(a in br.SIDES[kind] and b in br.SIDES[kind] for a, b in pairs)


def test_figures_take_ratios_within_each_round() -> None:
    rows = []
    for rnd, (ours, theirs) in enumerate([(100.0, 200.0), (300.0, 300.0), (50.0, 200.0)]):
        for side, ms in (("ours", ours), ("fastembed", theirs)):
            rows.append({"kind": "sparse", "side": side, "round": rnd, "cold_ms": ms, "b1_ms": ms / 10})
    rows.append({"kind": "colbert", "side": "ours", "round": 0, "cold_ms": 1e9})  # another kind: not mixed in
    text = br.figures(rows, "sparse")
    lines = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()}
    cold = lines["cold start, spawn -> first answer (ms)"]
    # ours 100/300/50 -> median 100; fastembed 200/300/200 -> 200; per-round ratios 0.5, 1.0, 0.25 -> 0.50x
    assert "| 100 (50-300) | 200 (200-300) | 0.50x (0.25-1.00) |" in cold
    assert "| 10.0 (5.0-30.0) | 20.0 (20.0-30.0) | 0.50x (0.25-1.00) |" in lines["warm batch 1 (ms)"]
    assert "warm batch 32 (ms)" not in lines  # measured by no side: no row, not a row of zeros
    rows[0]["b32_ms"] = 5.0  # measured by one side once: shown for it alone, no ratio
    assert br.figures(rows, "sparse").count("| warm batch 32 (ms) | 5 | - | - |") == 1


def test_evict_drops_each_sides_own_model_files(tmp_path: Path) -> None:
    paths = {}
    for key in ("packed", "fastembed", "source", "images"):
        (tmp_path / key / "sub").mkdir(parents=True)
        (tmp_path / key / "sub" / f"{key}.bin").write_bytes(b"x")
        paths[key] = str(tmp_path / key)
    names = {side: [f.name for f in br.model_files("rerank", side, paths)] for side in br.SIDES["rerank"]}
    assert names == {
        "ours": ["images.bin", "packed.bin"],
        "cross-encoder": ["images.bin", "source.bin"],
        "fastembed-ce": ["fastembed.bin", "images.bin"],
    }


def test_unknown_kind_is_refused_with_the_valid_ones() -> None:
    with pytest.raises(SystemExit, match="valid: sparse, colbert, images, hybrid, rerank"):
        br.main(["--kinds", "sparse,dense"])
