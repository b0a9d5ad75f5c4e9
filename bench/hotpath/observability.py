"""What observability costs per invocation (issue 18), in process, interleaved in blocks (this machine is shared).

1. The EMF emitter alone (`Emf.invocation`, one warm inference record, written to /dev/null): µs per call
   (target ≤ 50 µs).
2. `Runtime.handle` on a batch-1 embedding request (direct invoke, a Lambda context with a request id and an
   `_X_AMZN_TRACE_ID`): metrics + structured logs on (EMF lines to /dev/null) vs off (`WARMSTART_METRICS=off`).
   Medians of interleaved blocks. The model's ~5 ms varies by more than the difference on a shared machine, so
   the difference is also measured with the task stubbed out (the same shim path, a canned reply): that
   difference over the real invocation's median is the overhead in % (target ≤ 2%).
3. Log bytes per warm invocation (START/END/REPORT excluded: the platform writes those): what warmstart writes
   to stdout for one warm inference, metrics off (the state before issue 18) vs on.

Usage: .venv/bin/python bench/hotpath/observability.py [--calls 2000] [--blocks 10] [--json out]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
MODEL = ROOT / "models" / "default"
EVENT = {"inputs": ["How long does a cold start take on Lambda?"]}
LAMBDA_ENV = {
    "AWS_LAMBDA_FUNCTION_NAME": "warmstart-ImageFunction-1A2B3C4D5E6F",
    "AWS_LAMBDA_FUNCTION_VERSION": "12",
}


class Context:
    aws_request_id = "8f5b8c1e-3b1a-4f2e-9d7c-0a1b2c3d4e5f"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


def emitter_us(calls: int) -> float:
    from handler.observability import logs, metrics

    rec = metrics.Emf.from_environ(LAMBDA_ENV, "all-minilm-l6-v2@0.1.0", "onnx")
    inv = logs.Invocation(
        Context.aws_request_id, "1-5759e988-bd862e3fe1be46a994272793", False, "all-minilm-l6-v2@0.1.0"
    )
    inv.batch, inv.tokens = 1, 12
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        rec.invocation(inv, 1.0, False)
        t0 = time.perf_counter()
        for _ in range(calls):
            rec.invocation(inv, 1.0, False)
        return (time.perf_counter() - t0) / calls * 1e6


def handle_block(runtime: Any, calls: int) -> float:
    ctx = Context()
    t0 = time.perf_counter()
    for _ in range(calls):
        runtime.handle(EVENT, ctx)
    return (time.perf_counter() - t0) / calls * 1e6


def interleaved(on: Any, off: Any, blocks: int, calls: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"on": [], "off": []}
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        for rt in (on, off):
            handle_block(rt, max(1, calls // 10))  # warm both
        for i in range(blocks):
            order = (("on", on), ("off", off)) if i % 2 == 0 else (("off", off), ("on", on))
            for name, rt in order:
                times[name].append(handle_block(rt, calls))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="invocations per block")
    parser.add_argument("--blocks", type=int, default=10, help="blocks per setting, interleaved")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()

    from handler.core.config import Config
    from handler.runtime.invocation import Runtime

    os.environ["_X_AMZN_TRACE_ID"] = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    config = Config(model_dir=MODEL, backend="onnx", threads=1)
    on = Runtime.start(config, environ=LAMBDA_ENV, emit=None)
    off = Runtime.start(config, environ={**LAMBDA_ENV, "WARMSTART_METRICS": "off"}, emit=None)

    # 3. bytes per warm invocation
    sizes = {}
    for name, rt in (("off", off), ("on", on)):
        with contextlib.redirect_stdout(io.StringIO()):
            rt.handle(EVENT, Context())  # the cold one
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            for _ in range(100):
                rt.handle(EVENT, Context())
        sizes[name] = len(out.getvalue().encode()) / 100

    # 1. the emitter alone
    emitter = statistics.median(emitter_us(args.calls * 10) for _ in range(5))

    # 2. the whole invocation, on vs off, interleaved; then the same with the task stubbed out
    times = interleaved(on, off, args.blocks, args.calls)
    med_on, med_off = statistics.median(times["on"]), statistics.median(times["off"])
    reply = {"embeddings": [[0.0] * 384], "model": on.manifest.key, "usage": {"tokens": 12}}
    for rt in (on, off):
        rt.serve = lambda payload: reply  # the shim's path only
    stubbed = interleaved(on, off, args.blocks, args.calls * 20)
    stub_on, stub_off = statistics.median(stubbed["on"]), statistics.median(stubbed["off"])
    figures = {
        "emf_emitter_us": round(emitter, 2),
        "handle_on_us": round(med_on, 1),
        "handle_off_us": round(med_off, 1),
        "overhead_noisy_us": round(med_on - med_off, 1),
        "stubbed_on_us": round(stub_on, 2),
        "stubbed_off_us": round(stub_off, 2),
        "overhead_us": round(stub_on - stub_off, 2),
        "overhead_pct": round((stub_on - stub_off) / med_off * 100, 3),
        "log_bytes_per_warm_invocation": {k: round(v, 1) for k, v in sizes.items()},
        "blocks": args.blocks,
        "calls_per_block": args.calls,
        "spread_on_us": [round(min(times["on"]), 1), round(max(times["on"]), 1)],
        "spread_off_us": [round(min(times["off"]), 1), round(max(times["off"]), 1)],
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
