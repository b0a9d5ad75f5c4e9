"""Where a continuous-batching decode step goes (handler.backends.genai_batch) at 1, 8 and 32 rows: the real
engine on a generate pack, in-process (no HTTP), N clients each streaming --requests greedy answers of --tokens
tokens in turn. Per level: the decode steps with the most rows (wall, this process's CPU, and the scheduler
thread's CPU outside the model run: the Python around it, per-row sampling included), the level's CPU per
generated token and tokens/s, and the CPU of its decode and prefill runs; then ONNX Runtime's profiler over the
same steps: kernel time per op type, so a step of N rows can be set against one row's.

    .venv/bin/python bench/generate/batch_profile.py --pack DIR [--rows 1,8,32] [--tokens 24] [--requests 1]
        [--kv-tokens 32768] [--disable QuickGeluFusion] [--no-profile]

The engine is started as the HTTP host starts it (WARMSTART_GENAI_BATCH=max rows, WARMSTART_GENAI_KV_TOKENS), with
the session swapped for one with the profiler on (the same model bytes and options). Wall times on a loaded
host: read the CPU times and the shares.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for `handler`

from bench.generate.decode_profile import op_totals

PROMPT = "the sea is blue and deep and wide . write a short poem about"


def run_level(
    runtime: Any, rows: int, tokens: int, requests: int = 1, totals: dict[str, float] | None = None
) -> list[tuple[int, float, float]]:
    """`rows` clients each streaming `requests` greedy answers in turn; (rows in the step, wall s, CPU s) for
    each decode step with the most rows. `totals` gets the level's wall, process CPU, tokens and model runs."""
    batch = runtime.backend.batch
    steps: list[tuple[int, float, float]] = []
    prefills: list[float] = []
    outside: list[float] = []  # the scheduler thread's CPU in a decode step outside the model run (Python)
    step = batch._step
    session = batch.session

    class Timed:  # the session, its run's thread CPU noted (with 1 intra-op thread the run itself is on it)
        ran = 0.0

        def io_binding(self) -> Any:
            return session.io_binding()

        def run_with_iobinding(self, binding: Any) -> None:
            cpu = time.thread_time()
            session.run_with_iobinding(binding)
            Timed.ran = time.thread_time() - cpu

    def timed(group: list[Any], first: int, prefill: bool) -> None:
        wall, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
        step(group, first, prefill)
        if prefill:
            prefills.append(time.process_time() - cpu)
        else:
            steps.append((len(group), time.perf_counter() - wall, time.process_time() - cpu))
            outside.append(time.thread_time() - own - Timed.ran)

    batch._step = timed
    batch.session = Timed()
    start = threading.Barrier(rows)

    made = [0] * rows

    def client(i: int) -> None:
        start.wait()
        for r in range(requests):
            ask = {"prompt": f"{i} {r} {PROMPT}", "temperature": 0, "max_tokens": tokens, "ignore_eos": True}
            for piece in runtime.task.stream(ask):
                made[i] += len(piece.get("token_ids") or [])

    wall, cpu = time.perf_counter(), time.process_time()
    try:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(rows)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        batch._step = step
        batch.session = session
    if totals is not None:
        totals.update(
            wall=time.perf_counter() - wall,
            cpu=time.process_time() - cpu,
            tokens=sum(made),
            decode_runs=len(steps),
            prefill_runs=len(prefills),
            prefill_cpu=sum(prefills),
            decode_cpu=sum(s[2] for s in steps),
            outside_ms=sorted(outside)[len(outside) // 2] * 1000 if outside else 0.0,
        )
    most = max((s[0] for s in steps), default=0)  # rows join a few a step (chunked prefill): the fullest steps
    return [s for s in steps if s[0] == most]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pack", type=Path, required=True, help="a generate pack")
    ap.add_argument("--rows", default="1,8,32", help="rows decoding together, one level each")
    ap.add_argument("--tokens", type=int, default=24, help="tokens each row generates")
    ap.add_argument("--kv-tokens", type=int, default=32768, help="WARMSTART_GENAI_KV_TOKENS")
    ap.add_argument("--requests", type=int, default=1, help="answers each client streams in turn")
    ap.add_argument("--disable", default="", help="ONNX Runtime graph optimizers to turn off (comma-separated)")
    ap.add_argument("--no-profile", action="store_true", help="time the steps only (no ONNX Runtime profiler)")
    ap.add_argument(
        "--spin", action="store_true", help="intra-op spinning on (the HTTP host's plan has it off: 2 runs at once)"
    )
    args = ap.parse_args(argv)
    import onnxruntime as ort

    from handler.core.config import Config
    from handler.runtime.invocation import Runtime

    levels = [int(x) for x in args.rows.split(",")]
    env = {"WARMSTART_GENAI_BATCH": str(max(levels)), "WARMSTART_GENAI_KV_TOKENS": str(args.kv_tokens)}
    runtime = Runtime.start(Config(model_dir=args.pack, backend=None, warmup=False), environ=env, emit=None)
    batch = runtime.backend.batch
    disabled = [x for x in args.disable.split(",") if x]

    def session(options: Any) -> Any:
        options.intra_op_num_threads = batch.threads
        options.inter_op_num_threads = 1
        # The HTTP host's plan (its workers' runs share the CPUs: no spinning), not this process's one run's:
        # a spinning thread's CPU would count as the step's.
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if args.spin else "0")
        model = args.pack / "model.onnx"
        source: Any = str(model)
        if batch.last_only:
            from handler.backends.lastlogits import last_logits_model

            source = last_logits_model(model.read_bytes())
            options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(args.pack))
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)

    def swap(new: Any) -> None:
        batch.session = new
        batch._bindings.clear()  # a binding is its session's own: the kept ones would fail on the new session
        batch._logits.clear()

    swap(session(ort.SessionOptions()))
    print(f"{args.pack}: {batch.describe()}; load average {os.getloadavg()[0]:.1f}\n")
    run_level(runtime, 1, 4)  # the first runs' one-off costs off the figures
    head = "| streams | rows in the step | steps | wall / step ms | CPU / step ms | CPU per row ms "
    head += "| outside the run ms | tokens | CPU / token ms | tok/s | decode runs (CPU s) | prefill runs (CPU s) |"
    print(head + "\n" + "|---" * 12 + "|")
    for rows in levels:
        totals: dict[str, float] = {}
        got = run_level(runtime, rows, args.tokens, args.requests, totals)
        wall = sorted(s[1] for s in got)[len(got) // 2] * 1000
        cpu = sorted(s[2] for s in got)[len(got) // 2] * 1000
        n = got[0][0]
        print(
            f"| {rows} | {n} | {len(got)} | {wall:.1f} | {cpu:.1f} | {cpu / n:.1f} | {totals['outside_ms']:.1f} "
            f"| {totals['tokens']:.0f} "
            f"| {totals['cpu'] / totals['tokens'] * 1000:.1f} | {totals['tokens'] / totals['wall']:.1f} "
            f"| {totals['decode_runs']:.0f} ({totals['decode_cpu']:.1f}) "
            f"| {totals['prefill_runs']:.0f} ({totals['prefill_cpu']:.1f}) |"
        )
    if args.no_profile:
        return 0
    plain = batch.session
    for rows in levels:
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tempfile.gettempdir()) / f"warmstart-batch-profile-{rows}")
        swap(session(options))
        run_level(runtime, 1, 2)
        batch.session.end_profiling()
        swap(session(options))
        got = run_level(runtime, rows, args.tokens)
        events = json.loads(Path(path := batch.session.end_profiling()).read_text())
        os.remove(path)
        # Only the decode runs with every row in: the model runs in order, and the timed steps are their last ones.
        runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
        keep = runs[-len(got) :] if got else []
        spans = [(e["ts"], e["ts"] + e["dur"]) for e in keep]
        nodes = [e for e in events if any(a <= e.get("ts", -1) < b for a, b in spans)]
        by_op, _ = op_totals(nodes)
        total = sum(by_op.values())
        n = max(1, len(keep))
        print(f"\n{rows} rows, {n} decode steps: kernel time per step {total / n / 1000:.1f} ms")
        print("| op type | ms / step | share |\n|---|---|---|")
        for op, us in by_op.most_common(8):
            print(f"| {op} | {us / n / 1000:.2f} | {100 * us / total:.1f}% |")
    swap(plain)
    return 0


if __name__ == "__main__":
    sys.exit(main())
