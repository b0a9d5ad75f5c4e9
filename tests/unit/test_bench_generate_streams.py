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
                        "peak_rss_mb": 900.0,
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


def test_the_llama_line_only_when_llama_was_asked_for_and_not_run() -> None:
    md = streams.report(_results(["batch"]), ["batch"], [1, 8])
    assert "llama-server: not run" not in md  # not among the variants: nothing to say (it said READY was absent)
    md = streams.report(_results(["batch"]), ["batch"], [1, 8], llama_missing=True)
    assert "llama-server: not run (/work/cache/llama-server/READY absent" in md


PERF_BY_DSO = """# Samples: 12K of event 'cpu-clock:ppp'
#
    88.01%  onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so
     8.25%  [kernel.kallsyms]
     2.21%  libc.so.6
     0.93%  libpython3.11.so.1.0
     0.26%  _multiarray_umath.cpython-311-x86_64-linux-gnu.so
     0.17%  libstdc++.so.6.0.30
     0.06%  tokenizers.abi3.so
     0.02%  _asyncio.cpython-311-x86_64-linux-gnu.so
     0.01%  libfoo.so
"""


def test_perf_samples_are_summed_by_library_group() -> None:
    got = streams.perf_groups(PERF_BY_DSO)
    assert got["ONNX Runtime"] == 88.01
    assert got["kernel"] == 8.25
    assert round(got["libc"], 2) == 2.38
    assert round(got["Python"], 2) == 0.95  # the interpreter and its own extension modules
    assert got["numpy"] == 0.26  # numpy's _umath module is numpy's, not the interpreter's `math`
    assert got["tokenizers"] == 0.06
    assert got["other"] == 0.01
    sampled = [{"variant": "batch", "clients": 8, "perf": got}]
    md = streams.report(_results(["batch"]), ["batch"], [1, 8], sampled)
    assert "| variant | clients | ONNX Runtime | kernel | numpy | tokenizers | libc | Python | other |" in md
    assert "| batch | 8 | 88.0% | 8.2% | 0.3% | 0.1% | 2.4% | 1.0% | 0.0% |" in md
