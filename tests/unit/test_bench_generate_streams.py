"""bench/generate/streams.py's report, offline: every ratio line says which variant batch is compared with (no
server is started here)."""

from __future__ import annotations

from bench.generate import streams
from bench.runner import Results


def _results(variants: list[str]) -> Results:
    results = Results("generate-streams")
    speed = {"batch": 20.0, "single": 10.0, "llama": 8.0, "baseline": 16.0}
    for rnd in range(2):
        for name in variants:
            for clients in (1, 8):
                results.rows.append(
                    {
                        "round": rnd,
                        "variant": name,
                        "clients": clients,
                        "load": 1.0,
                        "tok_s": speed[name] * (1 if clients == 1 else 3),
                        "tbt_p50_ms": 30.0,
                        "tbt_p99_ms": 60.0,
                        "ttft_p50_ms": 500.0,
                        "cpu_ms_per_token": 40.0,
                        "non_200": 0,
                    }
                )
    return results


def test_each_ratio_line_names_the_variant_batch_is_compared_with() -> None:
    md = streams.report(_results(["batch", "llama"]), ["batch", "llama"], [1, 8])
    assert "batch over llama, aggregate tok/s by clients: 1: 2.50x" in md
    assert "over single" not in md  # not run: no line for it (it printed an empty one)
    for line in md.splitlines():
        if "x (" in line and not line.startswith("|"):  # a ratio line outside the table
            assert line.startswith("batch over "), line


def test_single_and_baseline_get_their_own_lines() -> None:
    variants = ["batch", "single", "baseline"]
    md = streams.report(_results(variants), variants, [1, 8])
    assert "batch over single, aggregate tok/s by clients: 1: 2.00x" in md
    assert "batch over baseline, aggregate tok/s by clients: 1: 1.25x" in md
    assert "over llama" not in md
