"""bench/bench_b1_split.py's pure parts, offline: the order its driver times the parts in, and its table."""

from __future__ import annotations

from bench import bench_b1_split as b1
from bench.b1_split_driver import call_orders


def test_graph_parts_reverse_every_other_call_so_each_follows_the_other() -> None:
    names = ["graph-own", "graph-peer", "graph-ours optimized"]
    even, odd = call_orders(names)
    assert even == names and odd == names[::-1]
    follows = {(o[i - 1], o[i]) for o in (even, odd) for i in range(1, len(o))}
    assert ("graph-own", "graph-peer") in follows and ("graph-peer", "graph-own") in follows


def test_table_quotes_whole_over_fastembeds_whole_per_clock_and_batch() -> None:
    row = {"tokenize": 0.1, "run": 4.0, "whole": 4.4, "n": 3}
    fe = {"tokenize": 0.1, "run": 4.0, "pool": 0.1, "whole": 4.0, "n": 3}
    per_b = {"b1": {"ours": row, "fastembed": fe}, "b32": {"ours": row, "fastembed": fe}}
    result = {"onnxruntime": {"ours": "1", "fastembed": "2"}, "wall": per_b, "cpu": per_b}
    text = b1.table(result, ("ours", "fastembed"))
    assert text.count("whole / fe") == 4
    assert "1.100x" in text and "1.000x" in text
    pool = next(line for line in text.splitlines() if line.strip().startswith("pool"))
    assert pool.split()[1] == "-"  # a part one side does not have


def test_min_cosine_is_the_worst_row() -> None:
    same = [[1.0, 0.0], [0.6, 0.8]]
    assert b1.min_cosine(same, same) == 1.0
    assert abs(b1.min_cosine(same, [[1.0, 0.0], [0.8, 0.6]]) - 0.96) < 1e-12
