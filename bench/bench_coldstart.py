"""Cold start, process spawn → first embedding returned through the real awslambdaric.

Variants run interleaved, round by round, so a noisy neighbour hurts them all alike; medians reported.
  warmstart-onnx       handler.app, onnx backend
  warmstart-onnx+sha   the same with WARMSTART_VERIFY_SHA256=1 (cost of hashing at init)
  floor-onnx           ONNX Runtime + tokenizers, minimal (bench/handlers/minimal_ort.py)
  naive-st             sentence-transformers loaded at init (bench/handlers/naive_st.py)
  warmstart-torch      handler.app, torch backend
  floor-torch          import torch + one forward pass (bench/handlers/minimal_torch.py)
  imports-only-*       warmstart's imports for a backend, no model: the memory baselines

Usage: .venv/bin/python bench/bench_coldstart.py [--rounds 5] [--skip-naive] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.runtime_stub import RuntimeStub  # noqa: E402

MODEL = ROOT / "models" / "default"
EVENT = {"inputs": ["A cold start is the time from nothing to the first answer."]}

VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "warmstart-onnx": ("handler.app.lambda_handler", {"WARMSTART_BACKEND": "onnx"}),
    "warmstart-onnx+sha": ("handler.app.lambda_handler", {"WARMSTART_BACKEND": "onnx", "WARMSTART_VERIFY_SHA256": "1"}),
    "floor-onnx": ("bench.handlers.minimal_ort.lambda_handler", {}),
    "naive-st": ("bench.handlers.naive_st.lambda_handler", {}),
    "warmstart-torch": ("handler.app.lambda_handler", {"WARMSTART_BACKEND": "torch"}),
    "floor-torch": ("bench.handlers.minimal_torch.lambda_handler", {}),
    "imports-only-onnx": ("bench.handlers.imports_only_onnx.lambda_handler", {}),
    "imports-only-torch": ("bench.handlers.imports_only_torch.lambda_handler", {}),
}


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cold_start(
    handler: str,
    env: dict[str, str],
    event: Any,
    warm_calls: int,
    timeout: float,
    warm_events: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Spawn `python -m awslambdaric handler` against a fresh runtime stub, invoke `event` once (the cold
    start) and `warm_calls` more times. first_ms: spawn → first answer; init_ms: spawn → the runtime's first
    `GET /next` (Lambda's Init Duration); the init report line, if the handler printed one; peak RSS.
    `warm_events` (name → event): the warm calls cycle through them instead, each one's median in
    `warm_ms_by[name]`; a warm call that is not answered raises."""
    with RuntimeStub() as stub:
        first_next: list[float] = []
        handler_cls = stub.server.RequestHandlerClass
        do_get = handler_cls.do_GET  # type: ignore[attr-defined]

        def timed_get(self: Any) -> None:
            if not first_next:
                first_next.append(time.perf_counter())
            do_get(self)

        handler_cls.do_GET = timed_get  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "awslambdaric", handler],
            cwd=ROOT,
            env={**env, "AWS_LAMBDA_RUNTIME_API": stub.address},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        outcome = stub.invoke(event, timeout=timeout)
        first_ms = (time.perf_counter() - t0) * 1000
        events = warm_events or {"event": event}
        warm: dict[str, list[float]] = {name: [] for name in events}
        for _ in range(warm_calls):
            for name, each in events.items():
                t1 = time.perf_counter()
                reply = stub.invoke(each)
                warm[name].append((time.perf_counter() - t1) * 1000)
                if warm_events is not None and reply.kind != "response":
                    raise RuntimeError(reply.body[:500])
        peak = peak_rss_mb(proc.pid)
        proc.kill()
        logs = proc.communicate()[0].decode(errors="replace")
    if outcome.kind != "response":
        raise RuntimeError(f"{handler}: {outcome.body[:500]!r}\n{logs[-2000:]}")
    init = next((json.loads(line) for line in logs.splitlines() if line.startswith('{"warmstart":"init"')), None)
    return {
        "first_ms": first_ms,
        "init_ms": (first_next[0] - t0) * 1000 if first_next else float("nan"),
        "warm_ms": statistics.median(warm[next(iter(warm))]) if warm_calls else float("nan"),
        "warm_ms_by": {name: statistics.median(times) for name, times in warm.items() if times},
        "peak_rss_mb": peak,
        "init": init,
        "body": outcome.body,
    }


def one(name: str) -> dict[str, Any]:
    handler, extra = VARIANTS[name]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WARMSTART_"))},
        "AWS_LAMBDA_FUNCTION_NAME": "bench",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "3538",  # 2 vCPUs on Lambda, like this machine
        "WARMSTART_MODEL": str(MODEL),
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        **extra,
    }
    return cold_start(handler, env, EVENT, warm_calls=20, timeout=300)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--skip-naive", action="store_true", help="leave out sentence-transformers (10+ s a run)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    names = [n for n in VARIANTS if not (args.skip_naive and n == "naive-st")]
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(args.rounds):
        for n in names:
            runs[n].append(one(n))
            print(f"round {r + 1}/{args.rounds} {n:20s} {runs[n][-1]['first_ms']:8.0f} ms", file=sys.stderr)

    def med(n: str, key: str) -> float:
        return statistics.median(x[key] for x in runs[n])

    print(f"\n{'variant':20s} {'first (median)':>15s} {'min':>8s} {'max':>8s} {'warm p50':>9s} {'peak RSS':>9s}")
    for n in names:
        firsts = [x["first_ms"] for x in runs[n]]
        print(
            f"{n:20s} {med(n, 'first_ms'):12.0f} ms {min(firsts):6.0f} {max(firsts):8.0f} "
            f"{med(n, 'warm_ms'):7.2f}ms {med(n, 'peak_rss_mb'):6.0f} MB"
        )
    print()
    ratios = [
        ("naive-st", "warmstart-onnx", "naive-st / warmstart-onnx (target >= 15x)"),
        ("warmstart-onnx", "floor-onnx", "warmstart-onnx / floor-onnx (target <= 1.2x)"),
        ("warmstart-torch", "floor-torch", "warmstart-torch / floor-torch (target <= 1.2x)"),
        ("warmstart-onnx+sha", "warmstart-onnx", "sha256-at-init / without"),
    ]
    for a, b, label in ratios:
        if a in runs and b in runs:
            print(f"{label:48s} {med(a, 'first_ms') / med(b, 'first_ms'):6.2f}x")
    weights = {
        "onnx": (MODEL / "model.onnx.data").stat().st_size / 2**20,
        "torch": (MODEL / "model.safetensors").stat().st_size / 2**20,
    }
    for backend, w in weights.items():
        n, base = f"warmstart-{backend}", med(f"imports-only-{backend}", "peak_rss_mb")
        print(
            f"{n}: peak RSS {med(n, 'peak_rss_mb'):.0f} MB = imports-only baseline {base:.0f} MB "
            f"+ {med(n, 'peak_rss_mb') - base:.0f} MB; weights {w:.0f} MB"
        )
    phases = [x["init"]["phases_ms"] for x in runs["warmstart-onnx"] if x["init"]]
    if phases:
        keys = phases[0].keys()
        print(
            "warmstart-onnx init phases (median ms): "
            + ", ".join(f"{k} {statistics.median(p.get(k, 0) for p in phases):.1f}" for k in keys)
        )
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
