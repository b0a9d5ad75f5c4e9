"""The child side of bench/peers/run.py: one embedder in one process, run by each one's own interpreter.

Stdlib only at module level, so the peers' venvs (build/peers/*) can run it without this project installed.

  cold KIND --model DIR           load, embed one sentence, print one JSON line, then wait for stdin to close
                                  (the parent reads peak RSS and CPU time meanwhile)
  serve KIND --model DIR [--threads N|default]
                                  load and warm up, print one JSON line (ready), then for each JSON line on
                                  stdin ({"batch": 1 or 32, "calls": n}) time n calls and print their ms: a
                                  long-lived child, so the parent can interleave the variants call block by
                                  call block within one round (bench/runner.py's Child)

KIND: ours (handler.app's lambda_handler, the whole per-call path) or fastembed (TextEmbedding.embed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

KINDS = ("ours", "fastembed")
MARK = "peers-driver:"
# Short sentences, like one search query or one chunk title: what one HTTP request carries here.
SENTENCES = [
    "A cold start is the time from nothing to the first answer.",
    "The quick brown fox jumps over the lazy dog.",
    "Serverless functions scale to zero when idle.",
    "How do I reset my password?",
    "Embeddings map text to vectors of fixed length.",
    "The meeting was moved to Thursday afternoon.",
    "Rain is expected over the weekend in the north.",
    "She ordered a coffee and sat by the window.",
    "Batching requests raises throughput on a busy server.",
    "What is the capital of Australia?",
    "The library closes at eight on weekdays.",
    "Tokenizers split words into sub-word pieces.",
    "Our flight was delayed by two hours.",
    "Cosine similarity compares the angle between two vectors.",
    "He fixed the bug and wrote a test for it.",
    "The museum opens a new exhibition next month.",
    "Which laptop has the longest battery life?",
    "A small model answers quickly on one CPU.",
    "The train to the airport leaves every ten minutes.",
    "Please send the invoice by the end of the day.",
    "Neural networks learn from examples.",
    "The garden needs watering twice a week in summer.",
    "Where can I find the nearest pharmacy?",
    "Throughput is requests answered per second.",
    "The concert was sold out within an hour.",
    "Latency percentiles describe the slowest answers.",
    "They hiked to the top of the hill at sunrise.",
    "A quota limits how much CPU a group may use.",
    "The recipe calls for two eggs and a cup of flour.",
    "Is the store open on public holidays?",
    "The report is due at the end of the quarter.",
    "Dynamic batching groups requests that wait in a queue.",
]


def load(kind: str, model: str, threads: int | None) -> Callable[[list[str]], list[list[float]]]:
    """The embedder as its users call it, loaded; returns texts -> vectors."""
    if kind == "ours":
        # WARMSTART_MODEL and WARMSTART_THREADS come from the parent's environment: importing is the init.
        import handler.app as app

        def ours(texts: list[str]) -> list[list[float]]:
            # The JSON bytes awslambdaric posts (encoded once, at the edge), read back as a client does.
            out: Any = json.loads(app.lambda_handler({"inputs": texts}, None))
            return list(out["embeddings"])

        return ours
    if kind == "fastembed":
        from fastembed import TextEmbedding

        # fastembed's own pipeline for this model (mean pooling, L2 normalization), from a local directory.
        model_ = TextEmbedding("sentence-transformers/all-MiniLM-L6-v2", specific_model_path=model, threads=threads)

        def fastembed(texts: list[str]) -> list[list[float]]:
            return [v.tolist() for v in model_.embed(texts, batch_size=len(texts))]

        return fastembed
    raise ValueError(f"unknown kind {kind!r}; valid: {', '.join(KINDS)}")


def emit(payload: dict[str, Any]) -> None:
    sys.stdout.write(MARK + json.dumps(payload) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["cold", "serve"])
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", default="default")
    args = ap.parse_args(argv)
    threads = None if args.threads == "default" else int(args.threads)
    if args.mode == "cold":
        embed = load(args.kind, args.model, threads)
        vec = embed([SENTENCES[0]])[0]
        emit({"vec": vec})
        sys.stdin.read()  # held until the parent has read /proc
        return 0
    t0 = time.perf_counter()
    embed = load(args.kind, args.model, threads)
    load_ms = (time.perf_counter() - t0) * 1000
    for _ in range(3):  # first calls allocate arenas and fill caches: not what a warm call costs
        embed(SENTENCES[:1])
        embed(SENTENCES)
    emit({"load_ms": load_ms, "vec": embed([SENTENCES[0]])[0], "pid": os.getpid()})
    i = 0
    for line in sys.stdin:
        ask = json.loads(line)
        times = []
        for _ in range(int(ask["calls"])):
            texts = SENTENCES if ask["batch"] == 32 else [SENTENCES[i % len(SENTENCES)]]
            i += 1
            t1 = time.perf_counter()
            embed(texts)
            times.append((time.perf_counter() - t1) * 1000)
        emit({"ms": times})
    return 0


if __name__ == "__main__":
    sys.exit(main())
