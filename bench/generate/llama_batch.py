"""llama.cpp's side of bench/generate/batch_profile.py: N sequences decoding together in one context (as
llama-server's N parallel slots do: one llama_decode a step over every slot's token), through llama-cpp-python's
low-level API in its own venv (bench/generate/build_llama.sh), on a GGUF of the same model. Per level: the N
prompts prefilled in one batch, then --tokens greedy steps over all N; CPU per decode step (this process's
clock, --threads threads), CPU per row, and the prefill's CPU per prompt token.

    /work/cache/llama-venv/bin/python bench/generate/llama_batch.py --gguf Q4_0.gguf [--rows 1,8,32] [--tokens 24]

Not an HTTP figure (bench/generate/streams.py's `llama` variant is, with llama-server): the engines' steps alone.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

PROMPT = "the sea is blue and deep and wide . write a short poem about"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--rows", default="1,8,32")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    import llama_cpp as ll  # the peer's venv only
    import numpy as np

    levels = [int(x) for x in args.rows.split(",")]
    ll.llama_backend_init()
    mparams = ll.llama_model_default_params()
    model = ll.llama_model_load_from_file(args.gguf.encode(), mparams)
    vocab = ll.llama_model_get_vocab(model)
    n_vocab = ll.llama_vocab_n_tokens(vocab)
    print(f"{args.gguf}: {args.threads} threads; load average {os.getloadavg()[0]:.1f}\n")
    head = "| rows | prompt tokens | prefill CPU ms / prompt token | CPU / decode step ms | CPU per row ms "
    print(head + "| wall / step ms |")
    print("|---|---|---|---|---|---|")
    for rows in levels:
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = rows * (64 + args.tokens + 8)
        cparams.n_batch = 2048
        cparams.n_ubatch = 512
        cparams.n_seq_max = rows
        cparams.n_threads = cparams.n_threads_batch = args.threads
        cparams.kv_unified = True  # llama-server's default for its slots
        ctx = ll.llama_init_from_model(model, cparams)
        prompts = []
        for i in range(rows):
            text = f"{i} {PROMPT}".encode()
            buf = (ll.llama_token * 256)()
            n = ll.llama_tokenize(vocab, text, len(text), buf, 256, False, True)
            prompts.append(list(buf[:n]))
        total = sum(len(p) for p in prompts)
        batch = ll.llama_batch_init(max(total, rows), 0, 1)

        def fill(items: list[tuple[int, int, int, bool]], batch: Any = batch) -> None:
            batch.n_tokens = len(items)
            for k, (token, pos, seq, logits) in enumerate(items):
                batch.token[k], batch.pos[k], batch.n_seq_id[k] = token, pos, 1
                batch.seq_id[k][0], batch.logits[k] = seq, logits

        items = [(t, pos, i, pos == len(p) - 1) for i, p in enumerate(prompts) for pos, t in enumerate(p)]
        fill(items)
        cpu = time.process_time()
        if ll.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed on the prompts")
        prefill = time.process_time() - cpu
        outs = [k for k, it in enumerate(items) if it[3]]
        nxt = []
        for k in outs:
            logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, k), shape=(n_vocab,))
            nxt.append(int(np.argmax(logits)))
        lengths = [len(p) for p in prompts]
        steps = []
        for _ in range(args.tokens):
            fill([(nxt[i], lengths[i], i, True) for i in range(rows)])
            wall, cpu = time.perf_counter(), time.process_time()
            if ll.llama_decode(ctx, batch) != 0:
                raise SystemExit("llama_decode failed on a step")
            steps.append((time.process_time() - cpu, time.perf_counter() - wall))
            for i in range(rows):
                logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
                nxt[i] = int(np.argmax(logits))
                lengths[i] += 1
        ll.llama_batch_free(batch)
        ll.llama_free(ctx)
        cpu_med = sorted(s[0] for s in steps)[len(steps) // 2] * 1000
        wall_med = sorted(s[1] for s in steps)[len(steps) // 2] * 1000
        print(
            f"| {rows} | {total} | {prefill / total * 1000:.1f} | {cpu_med:.1f} | {cpu_med / rows:.1f} "
            f"| {wall_med:.1f} |"
        )
    ll.llama_model_free(model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
