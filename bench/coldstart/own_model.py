"""Issue 13's figures: a user's own BERT-base-sized model packed with `warmstart pack --from`, side by side.

1. Cold start (process spawn → first answer through the real `awslambdaric`, against the runtime stub of the
   integration tests), embedding task, variants interleaved round by round, medians:
     warmstart-onnx   handler.app on the packed model (`pack --from` output as is), onnx backend
     warmstart-onnx+opt  the same after `warmstart optimize` (pre-optimized graph with prepacked weights for
                      this ORT and CPU, WordPiece shortcut), as the CPU Dockerfile does to the default (--optimize)
     floor-onnx       a tuned minimal ONNX Runtime + tokenizers handler of the same packed graph
                      (bench/handlers/floor_ort.py on its build step's files: the graph optimized once with
                      prepacked weights, the tokenizer from vocab.txt, GC paused at init, intra-op threads
                      from the Lambda memory size, no spinning, nothing else imported)
     naive-st         sentence-transformers loading the *source* directory at init (bench/handlers/naive_st.py)
     warmstart-torch  handler.app, torch backend (--torch)
   "Init" is spawn → the runtime's first `GET /invocation/next` (what Lambda reports as Init Duration).
2. Rerank, 1 query x 32 documents, in process, warm: warmstart's rerank task (onnx, torch) against
   `CrossEncoder.predict` on the same source directory, calls interleaved, medians.

Models are random (no downloads): tests/tiny_models.py's builders with BERT-base sizes (hidden 768, 12 layers,
12 heads, intermediate 3072, 512 positions, vocabulary 30,522 rows: ~110M parameters; the tokenizer knows
fewer words, the rows past it are never looked up), saved the way the hub lays them out, then packed with
`python -m infra.cli pack --from DIR`. They are built once under --work and reused (--rebuild to redo).

Usage: .venv/bin/python bench/coldstart/own_model.py [--rounds 5] [--calls 15] [--torch] [--optimize] [--warmup]
       [--rerank-size base|small] [--skip-naive] [--skip-coldstart] [--skip-rerank] [--work DIR] [--rebuild]
       [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import runner  # noqa: E402

SIZES: dict[str, dict[str, Any]] = {
    # BERT-base (bert-base-uncased, bge-base, e5-base, ms-marco-electra/bert-base cross-encoders).
    "base": {"HIDDEN": 768, "LAYERS": 12, "HEADS": 12, "INTERMEDIATE": 3072, "POSITIONS": 512, "VOCAB": 30522},
    # MiniLM-L6 (all-MiniLM-L6-v2, ms-marco-MiniLM-L-6-v2).
    "small": {"HIDDEN": 384, "LAYERS": 6, "HEADS": 12, "INTERMEDIATE": 1536, "POSITIONS": 512, "VOCAB": 30522},
}
MAX_SEQ = 256
TEXT = "what is the capital city of france ? paris is the capital of france , a city of good film and love ."


def build_source(work: Path, size: str, kind: str, rebuild: bool) -> Path:
    """A random `size` BERT model directory (tests/tiny_models.py with bigger constants), built once."""
    name = f"bert-{size}-{kind}"
    out = work / name
    if (out / "config.json").exists() and not rebuild:
        return out
    import tests.tiny_models as tm

    sizes = SIZES[size]
    saved = {k: getattr(tm, k) for k in ("HIDDEN", "LAYERS", "HEADS", "INTERMEDIATE", "POSITIONS", "INIT_RANGE")}
    build_config = tm.build_config

    def base_config(family: str, vocab_size: int, **extra: Any) -> Any:
        return build_config(family, max(vocab_size, sizes["VOCAB"]), **extra)

    for k in ("HIDDEN", "LAYERS", "HEADS", "INTERMEDIATE", "POSITIONS"):
        setattr(tm, k, sizes[k])
    tm.INIT_RANGE = 0.02  # BERT's own initializer range
    tm.build_config = base_config  # type: ignore[assignment]
    try:
        if kind == "sentence-transformers":
            tm.make_model_dir(work, "bert", kind, name=name, pooling="mean", normalize=True, max_seq_length=MAX_SEQ)
        else:
            tm.make_model_dir(work, "bert", kind, name=name)
    finally:
        for k, v in saved.items():
            setattr(tm, k, v)
        tm.build_config = build_config  # type: ignore[assignment]
    return out


def pack(source: Path, out: Path, rebuild: bool) -> tuple[Path, float | None]:
    if (out / "manifest.json").exists() and not rebuild:
        return out, None
    cmd = [sys.executable, "-m", "infra.cli", "pack", "--from", str(source), "--out", str(out), "--force"]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
    return out, time.perf_counter() - t0


def optimized_copy(packed: Path, rebuild: bool) -> Path:
    """A copy of the packed model with `warmstart optimize` applied (pre-optimized graph, prepacked weights for
    this ORT and CPU, WordPiece vocabulary shortcut): what the CPU Dockerfile does at build time."""
    out = packed.with_name(packed.name + "-opt")
    if (out / "model.opt.onnx").exists() and not rebuild:
        return out
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(packed, out)
    cmd = [sys.executable, "-m", "infra.cli", "optimize", str(out)]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return out


def params(source: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(source / "model.safetensors"), "np") as f:
        total = 0
        for k in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
            shape = f.get_slice(k).get_shape()
            n = 1
            for d in shape:
                n *= d
            total += n
    return total


# ---- cold start ----------------------------------------------------------------------------------------


def coldstart_variants(
    packed: Path, source: Path, opt: Path | None = None, floor: Path | None = None
) -> dict[str, tuple[str, dict[str, str]]]:
    return {
        "warmstart-onnx": ("handler.app.lambda_handler", {"WARMSTART_MODEL": str(packed), "WARMSTART_BACKEND": "onnx"}),
        "warmstart-onnx+opt": (
            "handler.app.lambda_handler",
            {"WARMSTART_MODEL": str(opt or packed), "WARMSTART_BACKEND": "onnx"},
        ),
        # The floor reads its own build step's files (runner.prepare_floor), made from the same packed graph.
        "floor-onnx": ("bench.handlers.floor_ort.lambda_handler", {"WARMSTART_MODEL": str(floor or packed)}),
        "naive-st": ("bench.handlers.naive_st.lambda_handler", {"BENCH_ST_MODEL_DIR": str(source)}),
        "warmstart-torch": (
            "handler.app.lambda_handler",
            {"WARMSTART_MODEL": str(packed), "WARMSTART_BACKEND": "torch"},
        ),
    }


def cold_one(handler: str, extra: dict[str, str], warmup: bool = False) -> dict[str, Any]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WARMSTART_", "BENCH_"))},
        "AWS_LAMBDA_FUNCTION_NAME": "bench",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "3538",  # 2 vCPUs on Lambda, like this machine
        # What Lambda sets for an on-demand function: warmstart then skips its warm-up inference (the first
        # request waits for init anyway). --warmup keeps it (provisioned concurrency's setting).
        "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        **extra,
    }
    if warmup and handler.startswith("handler."):
        env["WARMSTART_WARMUP"] = "1"
    argv = [sys.executable, "-m", "awslambdaric", handler]
    run = runner.lambda_start(argv, env, event={"inputs": [TEXT]}, warm_calls=5)
    return {
        "first_ms": run["first_ms"],
        "init_ms": run["init_ms"],
        "warm_ms": run["warm_ms"],
        "dim": len(json.loads(run["body"])["embeddings"][0]),
        "phases_ms": (run["init"] or {}).get("phases_ms"),
    }


def coldstart(
    packed: Path, source: Path, opt: Path | None, args: argparse.Namespace
) -> dict[str, list[dict[str, Any]]]:
    variants = coldstart_variants(packed, source, opt, runner.prepare_floor(packed, packed.parent / "floor-ort"))
    names = ["warmstart-onnx"] + (["warmstart-onnx+opt"] if opt else []) + ["floor-onnx"]
    names += [] if args.skip_naive else ["naive-st"]
    names += ["warmstart-torch"] if args.torch else []
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(args.rounds):
        for n in names:
            runs[n].append(cold_one(*variants[n], warmup=args.warmup))
            x = runs[n][-1]
            print(f"round {r + 1}/{args.rounds} {n:18s} first {x['first_ms']:8.0f} ms  init {x['init_ms']:8.0f} ms")
    med = {n: {k: statistics.median(x[k] for x in runs[n]) for k in ("first_ms", "init_ms", "warm_ms")} for n in names}
    print(f"\ncold start, {args.rounds} interleaved rounds (medians; min-max of first answer)")
    print(f"{'variant':18s} {'first answer':>13s} {'min':>7s} {'max':>7s} {'Init':>9s} {'warm p50':>9s} {'dim':>4s}")
    for n in names:
        firsts = [x["first_ms"] for x in runs[n]]
        print(
            f"{n:18s} {med[n]['first_ms']:10.0f} ms {min(firsts):7.0f} {max(firsts):7.0f} "
            f"{med[n]['init_ms']:6.0f} ms {med[n]['warm_ms']:6.1f} ms {runs[n][0]['dim']:4d}"
        )
    print()
    for a, b, label in (
        ("naive-st", "warmstart-onnx", "naive-st / warmstart-onnx (target >= 15x)"),
        ("naive-st", "warmstart-onnx+opt", "naive-st / warmstart-onnx+opt (target >= 15x)"),
        ("warmstart-onnx", "floor-onnx", "warmstart-onnx / floor-onnx (target <= 1.2x)"),
        ("warmstart-onnx+opt", "floor-onnx", "warmstart-onnx+opt / floor-onnx (target <= 1.2x)"),
        ("warmstart-torch", "floor-onnx", "warmstart-torch / floor-onnx"),
    ):
        if a in med and b in med:
            print(
                f"{label:50s} first answer {med[a]['first_ms'] / med[b]['first_ms']:6.2f}x   "
                f"Init {med[a]['init_ms'] / med[b]['init_ms']:6.2f}x"
            )
    for n in names:
        phases = [x["phases_ms"] for x in runs[n] if x["phases_ms"]]
        if phases:
            print(
                f"{n} init phases (median ms): "
                + ", ".join(f"{k} {statistics.median(p.get(k, 0) for p in phases):.1f}" for k in phases[0])
            )
    return runs


# ---- rerank --------------------------------------------------------------------------------------------


def rerank_payload(n_docs: int) -> dict[str, Any]:
    import random

    import tests.tiny_models as tm

    rng = random.Random(13)
    words = [w for w in tm.CORPUS if w.isalpha()]
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(20, 60))) for _ in range(n_docs)]
    return {"query": "what is the capital city of france", "documents": docs}


def rerank(source: Path, packed: Path, args: argparse.Namespace) -> dict[str, list[float]]:
    import numpy as np
    import torch
    import transformers
    from sentence_transformers import CrossEncoder

    from handler.core.config import Config
    from handler.models.loader import load_model
    from handler.observability.report import PhaseTimer

    transformers.logging.disable_progress_bar()  # "Loading weights" bars
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    payload = rerank_payload(32)
    pairs = [(payload["query"], d) for d in payload["documents"]]
    ce = CrossEncoder(str(source), device="cpu")
    env = {"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(1769 * threads)}
    tasks = {}
    for backend in ("onnx", "torch"):
        config = Config(model_dir=packed, backend=backend, threads=threads)  # type: ignore[arg-type]
        tasks[f"warmstart-{backend}"] = load_model(packed, config, env, PhaseTimer()).task
    calls: dict[str, Any] = {
        "CrossEncoder.predict": lambda: ce.predict(pairs),
        **{name: (lambda t=task: t(payload)) for name, task in tasks.items()},
    }
    # Same answers? (random model: scores near each other; the ranking and values must still agree.)
    reference = np.asarray(ce.predict(pairs), dtype=np.float32)
    for name, task in tasks.items():
        got = np.zeros(len(pairs), dtype=np.float32)
        for r in task(payload)["results"]:
            got[r["index"]] = r["relevance_score"]
        print(f"{name}: max |score - CrossEncoder.predict| = {float(np.abs(got - reference).max()):.2e}")
    for fn in calls.values():  # one warm call each, not timed
        fn()
    times: dict[str, list[float]] = {n: [] for n in calls}
    for _ in range(args.calls):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1000)
    base = statistics.median(times["CrossEncoder.predict"])
    print(f"\nrerank, 1 query x 32 documents (20-60 words each), {args.calls} interleaved calls, {threads} threads")
    print(f"{'variant':22s} {'median':>10s} {'min':>8s} {'max':>8s} {'vs CrossEncoder':>16s}")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:22s} {m:7.1f} ms {min(ts):8.1f} {max(ts):8.1f} {m / base:15.2f}x")
    print("target: warmstart <= 1.0x CrossEncoder.predict")
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="cold-start rounds (each runs every variant once)")
    ap.add_argument("--calls", type=int, default=15, help="rerank calls per variant (interleaved)")
    ap.add_argument("--torch", action="store_true", help="also time warmstart's torch backend's cold start")
    ap.add_argument(
        "--optimize",
        action="store_true",
        help="also warmstart-onnx+opt: a copy of the packed model after `warmstart optimize`",
    )
    ap.add_argument("--warmup", action="store_true", help="warmstart runs its warm-up inference at init")
    ap.add_argument("--skip-naive", action="store_true", help="leave out the sentence-transformers handler")
    ap.add_argument("--skip-coldstart", action="store_true")
    ap.add_argument("--skip-rerank", action="store_true")
    ap.add_argument("--rerank-size", choices=sorted(SIZES), default="base", help="the cross-encoder's size")
    ap.add_argument("--work", type=Path, default=Path("/tmp/warmstart-bench-own-model"), help="models built here")
    ap.add_argument("--rebuild", action="store_true", help="build and pack the models again")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args.work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {}
    print(f"machine: {os.cpu_count()} CPUs (affinity {len(os.sched_getaffinity(0))}), python {sys.version.split()[0]}")
    if not args.skip_coldstart:
        source = build_source(args.work, "base", "sentence-transformers", args.rebuild)
        packed, pack_s = pack(source, args.work / "packed-embedding", args.rebuild)
        manifest = json.loads((packed / "manifest.json").read_text())
        sizes = {f: (packed / f).stat().st_size / 2**20 for f in ("model.onnx", "model.onnx.data", "model.safetensors")}
        print(
            f"embedder: {source.name}, {params(source) / 1e6:.1f}M parameters, "
            f"packed {manifest['id']}:{manifest['version']}"
            f" (onnx fused: {manifest['backends']['onnx'].get('fused')}); "
            + ", ".join(f"{f} {s:.0f} MB" for f, s in sizes.items())
            + (f"; pack --from took {pack_s:.1f} s" if pack_s else "")
        )
        opt = optimized_copy(packed, args.rebuild) if args.optimize else None
        result["coldstart"] = coldstart(packed, source, opt, args)
    if not args.skip_rerank:
        source = build_source(args.work, args.rerank_size, "cross-encoder", args.rebuild)
        packed, pack_s = pack(source, args.work / f"packed-rerank-{args.rerank_size}", args.rebuild)
        print(
            f"\ncross-encoder: {source.name}, {params(source) / 1e6:.1f}M parameters"
            + (f"; pack --from took {pack_s:.1f} s" if pack_s else "")
        )
        result["rerank"] = rerank(source, packed, args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
