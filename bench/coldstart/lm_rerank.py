"""Decoder rerankers (Qwen3-Reranker style) packed with `pack --from`, against sentence-transformers' CrossEncoder
on the same directory.

1. Cold start: process spawn -> first rerank answer (1 query x 1 document), in a fresh Python each time, variants
   interleaved round by round, medians (min-max), and the child's peak RSS:
     warmstart-onnx / warmstart-torch  Runtime.start on the packed model (warm-up off) + one request
     cross-encoder                     CrossEncoder(source dir) + one predict
2. Warm, in one process: 1 query x 1 document (b1) and x 32 documents (b32), calls interleaved, medians;
   then the b32 scores against `CrossEncoder.predict` (max abs difference, same order).

The model is random (no downloads): tests/lm_rerankers.py with Qwen3-Reranker-0.6B's layer shape (hidden 1024,
16 heads / 8 KV heads of 128, intermediate 3072) and its 151,669-row vocabulary, 4 layers instead of 28 (a pack
in minutes on a laptop); the tokenizer is the tests' small BPE one (its ids reach the first 402 rows only).

Usage: .venv/bin/python bench/coldstart/lm_rerank.py [--work DIR] [--rounds 5] [--calls 15] [--layers 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

QUERY = "what is a cold start?"
DOC = "the first request of a new instance of the function, which loads the model before it answers ."
_WARMSTART = (
    "from pathlib import Path; from handler.core.config import Config; "
    "from handler.runtime.invocation import Runtime; "
    "c = Config(model_dir=Path({packed!r}), backend='BACKEND', warmup=False); "
    "Runtime.start(c, environ={{}}, emit=None).serve({{'query': {q!r}, 'documents': [{d!r}]}})"
)
CHILD = {
    "warmstart-onnx": _WARMSTART.replace("BACKEND", "onnx"),
    "warmstart-torch": _WARMSTART.replace("BACKEND", "torch"),
    "cross-encoder": (
        "from sentence_transformers import CrossEncoder; "
        "CrossEncoder({source!r}, local_files_only=True).predict([({q!r}, {d!r})])"
    ),
}


def build(work: Path, layers: int) -> tuple[Path, Path]:
    from infra.pack.hf_pack import pack_from
    from tests.lm_rerankers import make_reranker_dir

    source, packed = work / "reranker", work / "packed"
    if not (source / "modules.json").exists():
        sizes = {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128}
        sizes |= {"intermediate_size": 3072, "num_hidden_layers": layers, "max_position_embeddings": 40960}
        make_reranker_dir(work, scale=1.0, vocab_rows=151669, **sizes)
    if not (packed / "manifest.json").exists():
        pack_from(source, packed, model_id="lm-reranker", version="1", force=True)
    return source, packed


def cold(name: str, source: Path, packed: Path) -> tuple[float, float]:
    """(ms from spawn to the answer, the child's peak RSS in MB)."""
    code = CHILD[name].format(packed=str(packed), source=str(source), q=QUERY, d=DOC)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT)
    _, status, usage = os.wait4(child.pid, 0)
    took = (time.perf_counter() - start) * 1000
    if status != 0:
        raise RuntimeError(f"{name}: exit status {status}")
    return took, usage.ru_maxrss / 1024


def summary(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"


def warm(source: Path, packed: Path, calls: int) -> dict[str, dict[str, list[float]]]:
    from sentence_transformers import CrossEncoder

    from handler.core.config import Config
    from handler.runtime.invocation import Runtime

    runners: dict[str, Any] = {}
    for backend in ("onnx", "torch"):
        rt = Runtime.start(Config(model_dir=packed, backend=backend, warmup=True), environ={}, emit=None)
        runners[f"warmstart-{backend}"] = lambda docs, rt=rt: rt.serve({"query": QUERY, "documents": docs})
    ce = CrossEncoder(str(source), local_files_only=True)
    runners["cross-encoder"] = lambda docs: ce.predict([(QUERY, d) for d in docs], batch_size=32)
    sizes = {"b1": [DOC], "b32": [f"{DOC} {i} " + "passage text . " * (i % 7) for i in range(32)]}
    out: dict[str, dict[str, list[float]]] = {n: {s: [] for s in sizes} for n in runners}
    for run in runners.values():  # one untimed call each
        run(sizes["b32"])
    for i in range(calls):
        for name in runners if i % 2 == 0 else reversed(list(runners)):
            for size, docs in sizes.items():
                start = time.perf_counter()
                run = runners[name]
                run(docs)
                out[name][size].append((time.perf_counter() - start) * 1000)
    want = ce.predict([(QUERY, d) for d in sizes["b32"]], batch_size=32)
    for name in ("warmstart-onnx", "warmstart-torch"):
        got = [0.0] * len(want)
        for item in runners[name](sizes["b32"])["results"]:
            got[item["index"]] = item["relevance_score"]
        same = sorted(range(len(got)), key=lambda i: -got[i]) == sorted(range(len(want)), key=lambda i: -want[i])
        diff = max(abs(g - w) for g, w in zip(got, want, strict=True))
        print(f"  parity b32 {name}: max |score - CrossEncoder.predict| {diff:.2e}, same order {same}")
    return out


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=ROOT / "build" / "bench" / "lm_rerank")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=15)
    p.add_argument("--layers", type=int, default=4)
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    source, packed = build(args.work, args.layers)
    print(f"load average before: {loadavg()}")
    rows: dict[str, list[tuple[float, float]]] = {n: [] for n in CHILD}
    for r in range(args.rounds):
        for name in list(CHILD) if r % 2 == 0 else reversed(list(CHILD)):
            rows[name].append(cold(name, source, packed))
    print("cold start, spawn -> first answer (ms, median (min-max)); peak RSS (MB)")
    for name, got in rows.items():
        print(f"  {name:16} {summary([g[0] for g in got]):>28}   {summary([g[1] for g in got])}")
    timings = warm(source, packed, args.calls)
    print("warm, ms per request, median (min-max)")
    for name, by in timings.items():
        print(f"  {name:16} b1 {summary(by['b1']):>24}   b32 {summary(by['b32']):>26}")
    print(f"load average after: {loadavg()}")


if __name__ == "__main__":
    main()
