"""Serving figures of task multivector: cold start to the first answer, warm batch 1 and 32 (vectors) and a
32-document MaxSim rerank, peak RSS, per backend and against fastembed's `LateInteractionTextEmbedding` serving
the same float32 ONNX graph (its answerai-colbert-small-v1 entry pointed at a local copy with
`specific_model_path`; its rerank: its vectors, MaxSim in numpy), rounds interleaved, each start a fresh
process pinned to one CPU. The model: a random BERT with a small ColBERT's shapes (answerai-colbert-small-v1's:
12 layers, hidden 384, 12 heads, vocabulary 30,522, 96-wide vectors; query 32, document 180 tokens), laid out as
PyLate saves it.

    PYTHONPATH=$PWD python bench/peers/colbert_serve.py /tmp/colbert-bench [rounds] [fastembed site]

fastembed does not install into this venv (it brings onnxruntime, which replaces onnxruntime-gpu's module):
`pip install --no-deps --target SITE fastembed==0.9.1 loguru mmh3 py_rust_stemmers` and pass SITE.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

SHAPE = {
    "hidden_size": 384,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 1536,
    "vocab_size": 30522,
    "max_position_embeddings": 512,
}
CHILD = r"""
import json, statistics, sys, time
t0 = time.perf_counter()
from pathlib import Path
from handler.core.config import Config
from handler.runtime.invocation import Runtime
model, backend = Path(sys.argv[1]), sys.argv[2]
words = "the quick brown fox jumps over lazy dog paris berlin capital city machine learning model search".split()
docs = [" ".join(words[(i * 7 + j) % len(words)] for j in range(60)) for i in range(32)]
rt = Runtime.start(Config(model_dir=model, backend=backend), environ={}, emit=None)
rt.serve({"query": "what is the capital of france?", "documents": docs[:8]})
cold = time.perf_counter() - t0
def timed(payload, n):
    out = []
    for _ in range(n):
        t = time.perf_counter(); rt.serve(payload); out.append((time.perf_counter() - t) * 1000)
    return statistics.median(out)
b1 = timed({"inputs": docs[:1]}, 20)
q1 = timed({"inputs": ["what is the capital of france?"], "input_type": "query"}, 20)
b32 = timed({"inputs": docs}, 5)
rerank = timed({"query": "what is the capital of france?", "documents": docs}, 5)
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))  # ru_maxrss survives exec
rss = int(hwm.split()[1]) / 1024
print(json.dumps({"cold_s": cold, "doc_b1_ms": b1, "query_b1_ms": q1, "doc_b32_ms": b32, "rerank_32_ms": rerank,
                  "peak_rss_mb": rss}))
"""
FASTEMBED = r"""
import json, statistics, sys, time
t0 = time.perf_counter()
import numpy as np
from fastembed import LateInteractionTextEmbedding
model = LateInteractionTextEmbedding(
    "answerdotai/answerai-colbert-small-v1", specific_model_path=sys.argv[1], threads=1,
    providers=["CPUExecutionProvider"],
)
words = "the quick brown fox jumps over lazy dog paris berlin capital city machine learning model search".split()
docs = [" ".join(words[(i * 7 + j) % len(words)] for j in range(60)) for i in range(32)]
def rerank(query, documents):
    q = next(iter(model.query_embed([query])))
    return [float((q @ np.asarray(d).T).max(axis=1).sum()) for d in model.embed(documents, batch_size=32)]
rerank("what is the capital of france?", docs[:8])
cold = time.perf_counter() - t0
def timed(call, n):
    out = []
    for _ in range(n):
        t = time.perf_counter(); call(); out.append((time.perf_counter() - t) * 1000)
    return statistics.median(out)
b1 = timed(lambda: list(model.embed(docs[:1])), 20)
q1 = timed(lambda: list(model.query_embed(["what is the capital of france?"])), 20)
b32 = timed(lambda: list(model.embed(docs, batch_size=32)), 5)
rr = timed(lambda: rerank("what is the capital of france?", docs), 5)
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))  # ru_maxrss survives exec
rss = int(hwm.split()[1]) / 1024
print(json.dumps({"cold_s": cold, "doc_b1_ms": b1, "query_b1_ms": q1, "doc_b32_ms": b32, "rerank_32_ms": rr,
                  "peak_rss_mb": rss}))
"""


def fastembed_dir(src: Path, packed: Path, out: Path) -> Path:
    """The packed float32 graph and the source's tokenizer files, named as fastembed's entry expects them."""
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "special_tokens_map.json"):
        if (src / name).exists():  # transformers 5 writes no special_tokens_map.json (fastembed: optional)
            shutil.copyfile(src / name, out / name)
    config = json.loads((src / "tokenizer_config.json").read_text())
    config["model_max_length"] = 512  # the test tokenizer's 64 would cut documents short of ours
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    shutil.copyfile(packed / "model.onnx", out / "vespa_colbert.onnx")
    shutil.copyfile(packed / "model.onnx.data", out / "model.onnx.data")  # the graph names its data file
    return out


def main() -> None:
    work = Path(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    packed = work / "packed"
    if not (packed / "manifest.json").exists():
        from infra.pack.hf_pack import pack_from
        from tests.colbert_models import make_colbert_dir

        src = make_colbert_dir(work / "src", shape=SHAPE, dimension=96, query_length=32, document_length=180)
        started = time.perf_counter()
        pack_from(src, packed, force=True)
        print(f"packed in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    results: dict[str, list[dict[str, float]]] = {"onnx": [], "torch": []}
    site = sys.argv[3] if len(sys.argv) > 3 else None
    if site:
        results["fastembed"] = []
        peer = fastembed_dir(work / "src", packed, work / "fastembed")
    for _ in range(rounds):
        for backend in results:
            load = Path("/proc/loadavg").read_text().split()[0]
            if backend == "fastembed":
                argv, child_env = [FASTEMBED, str(peer)], {**env, "PYTHONPATH": f"{site}:{os.getcwd()}"}
            else:
                argv, child_env = [CHILD, str(packed), backend], env
            out = subprocess.run(
                ["taskset", "-c", "0", sys.executable, "-c", *argv],
                env=child_env,
                capture_output=True,
                text=True,
                check=True,
            )
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["load"] = float(load)
            results[backend].append(row)
            print(backend, json.dumps(row), file=sys.stderr)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
