"""Per-call overhead of the warm path over a hand-written handler, before (git ref --ref) vs after (this tree),
at batch 1 and 32, in one interleaved run (bench/runner.py).

    .venv/bin/python bench/hotpath/overhead.py [--ref main] [--rounds 15] [--block 25] [--threads 1]
        [--before-env NAME=VALUE ...] [--no-floor]

Each code version is one long-lived child (two `handler` packages cannot share an interpreter), in a cgroup of
its own with as many vCPUs as intra-op threads when run as root. Within every round the children are asked in
turn (order rotated round by round) for a block of calls at each batch size; in a block each call of the
product (`handler.app.lambda_handler`, the whole direct invoke, on models/default's portable graph) is paired
with one of the floor in the same process: tokenizers → onnxruntime `session.run` on the same model file and
threads → `tolist()` (pooling and normalization are in the packed graph). Overhead = median of the pairs'
differences, wall and the calling thread's CPU (at 1 intra-op thread ONNX Runtime runs the model on the calling
thread, so CPU is the steadier figure on a shared host). Only public surfaces are used, so any two versions compare.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MARK = "overhead:"
NO_FLOOR = "OVERHEAD_NO_FLOOR"  # set in a child's environment by --no-floor
SHORT = "How long does a cold start take on Lambda?"
BATCH32 = [
    f"passage {i}: serverless inference keeps the model warm between calls, " + "more " * (i % 9) for i in range(32)
]


def child() -> int:
    """In the child: `handler` is whichever version PYTHONPATH puts first."""
    import numpy as np
    from tokenizers import Tokenizer

    import handler.app as app  # the init, as Lambda runs it

    model = Path(os.environ["WARMSTART_MODEL"])
    manifest = json.loads((model / "manifest.json").read_text())

    def product(texts: list[str]) -> Any:
        return app.lambda_handler({"inputs": texts}, None)

    def embeddings(answer: Any) -> Any:  # the handler answers the JSON body's bytes (the runtime sends them as is)
        return (json.loads(answer) if isinstance(answer, bytes | str) else answer)["embeddings"]

    if os.environ.get(NO_FLOOR):  # the whole call timed: nothing else in the process (no second ONNX Runtime)
        for texts in ([SHORT], BATCH32) * 3:
            product(texts)
        serve(product, lambda texts: None)
        return 0
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(os.environ["WARMSTART_THREADS"])
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    session = ort.InferenceSession(str(model / manifest["backends"]["onnx"]["model"]), opts)
    names = [i.name for i in session.get_inputs()]
    tok = Tokenizer.from_file(str(model / manifest["tokenizer"]["file"]))
    tok.enable_truncation(manifest["tokenizer"]["truncation"])
    tok.enable_padding()

    def floor(texts: list[str]) -> Any:
        enc = tok.encode_batch(texts)
        feeds = {
            "input_ids": np.array([e.ids for e in enc], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
        }
        return session.run(None, {n: feeds[n] for n in names})[0].tolist()

    for texts in ([SHORT], BATCH32):  # the same answers, or the pair compares nothing
        a, b = np.array(embeddings(product(texts))), np.array(floor(texts))
        if not np.allclose(a, b, atol=1e-4):
            raise SystemExit(f"the product and the floor answer differently: max diff {np.abs(a - b).max()}")
        for _ in range(3):
            product(texts)
            floor(texts)
    serve(product, floor)
    return 0


def serve(product: Any, floor: Any) -> None:
    """Answer the parent's asks: per call, the product's time less the floor's (with no floor: the whole call)."""
    print(MARK + json.dumps({"pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        texts = [SHORT] if ask["batch"] == 1 else BATCH32
        out: dict[str, list[float]] = {"wall": [], "cpu": []}
        for _ in range(ask["calls"]):
            t0, c0 = time.perf_counter(), time.thread_time()
            product(texts)
            t1, c1 = time.perf_counter(), time.thread_time()
            floor(texts)
            t2, c2 = time.perf_counter(), time.thread_time()
            out["wall"].append(((t1 - t0) - (t2 - t1)) * 1000)
            out["cpu"].append(((c1 - c0) - (c2 - c1)) * 1000)
            out.setdefault("floor_wall", []).append((t2 - t1) * 1000)
        print(MARK + json.dumps({k: statistics.median(v) for k, v in out.items()}), flush=True)


def main() -> int:
    sys.path.append(str(ROOT))  # appended: a child's PYTHONPATH decides which `handler` it imports
    from bench import runner

    ap = runner.parser(__doc__, rounds=15, out="hotpath-overhead")
    ap.add_argument("--ref", default="main", help="git ref measured as 'before' (default %(default)s)")
    ap.add_argument("--block", type=int, default=25, help="batch-1 pairs a block (batch 32: an eighth, >= 3)")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads, both versions and the floor")
    ap.add_argument(
        "--before-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting of the 'before' child only (--ref HEAD --before-env WARMSTART_ORT_CAPI=0: one code, two ways)",
    )
    ap.add_argument(
        "--no-floor",
        action="store_true",
        help="time the whole call, no floor in the children (one ONNX Runtime a process: compares two APIs fairly)",
    )
    args = ap.parse_args()
    before_env = dict(kv.split("=", 1) for kv in args.before_env)
    versions = {"before": runner.ref_checkout(args.ref), "after": ROOT}
    meta = {"ref": args.ref, "threads": args.threads, "before_env": args.before_env}
    res = runner.Results("bench/hotpath/overhead.py", meta=meta)
    cgroups = {v: runner.Quota(v, float(args.threads)) for v in versions} if not runner.need_root() else {}
    children: dict[str, runner.Child] = {}
    try:
        for v, root in versions.items():
            # The portable graph for the product too: the floor runs that file, so the pair differs only in code.
            env = runner.lambda_env(
                float(args.threads), WARMSTART_THREADS=str(args.threads), WARMSTART_ORT_OPTIMIZED="0"
            )
            env["PYTHONPATH"] = str(root) if root == ROOT else f"{root}:{ROOT}"
            if v == "before":
                env.update(before_env)
            if args.no_floor:
                env[NO_FLOOR] = "1"
            argv = [sys.executable, __file__, "--child"]
            children[v] = runner.Child(cgroups[v].wrap(argv) if cgroups else argv, env, MARK)
        for rnd in range(args.rounds):
            for batch, calls in ((1, args.block), (32, max(3, args.block // 8))):
                for v in runner.order(list(versions), rnd):
                    res.add(round=rnd, variant=v, batch=batch, **children[v].ask({"batch": batch, "calls": calls}))
    finally:
        for c in children.values():
            c.close()
        for q in cgroups.values():
            q.close()
    rows = []
    for batch in (1, 32):
        for key in ("wall", "cpu"):
            before, after = res.stat(key, variant="before", batch=batch), res.stat(key, variant="after", batch=batch)
            # Of the medians: a round's difference can be near zero or negative at batch 32 (the model's own
            # spread is larger than the overhead), which makes per-round ratios meaningless.
            rows.append([batch, key, before.fmt(3), after.fmt(3), f"{after.median / before.median:.2f}x"])
    floor = [f"batch {b}: {res.stat('floor_wall', batch=b).fmt(2)} ms" for b in (1, 32)]
    what = "The whole call" if args.no_floor else "Overhead over the floor per call"
    res.save(
        args.out,
        f"{what} (ms), {args.threads} intra-op thread(s), before = {args.ref}"
        + "".join(f" {kv}" for kv in args.before_env)
        + ":\n\n"
        + runner.table(["batch", "measure", "before", "after", "after / before (medians)"], rows)
        + ("" if args.no_floor else f"\n\nThe floor's own call (wall): {', '.join(floor)}."),
    )
    return 0


if __name__ == "__main__":
    sys.exit(child() if sys.argv[1:] == ["--child"] else main())
