"""One batching step's model runs alone, by shape: what a prompt token and a decode row cost on the pack's
`model.onnx` as the batch engine (handler.backends.genai_batch) runs it (the head over each row's last token,
the KV arrays bound as past and present), under a CPU quota of its own, without the HTTP host or the scheduler.

    .venv/bin/python bench/generate/step_runs.py --pack DIR [--shapes 1x1x60,8x1x60,32x1x60,1x32x0,4x32x0]
        [--threads 1,2] [--spin 0,1] [--pairs 8x1x60+1x32x0,32x1x60+1x32x0] [--pair-threads 2]
        [--pair-spin 0] [--vcpus 2] [--repeat 5]

A shape is ROWSxWIDTHxPAST: ROWS rows of WIDTH new tokens each after PAST cached ones (a prompt run: WIDTH > 1,
PAST 0; a decode run: WIDTH 1). Per shape, per intra-op thread count and spinning: the median CPU time of this
process per run (and per token) and the median wall time. A pair A+B: the two runs one after the other and side by
side (B in a second thread, the engine's prompt run beside its decode run), on a session of each --pair-threads
count (default --threads' last) and --pair-spin setting, all kept open: the RSS after each says what one more
session of the graph costs (its own prepacked weights). Re-executes itself inside a cgroup v1 quota of --vcpus
with its cpu.shares raised (root), so the host's other jobs yield the quota's CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for `bench` and `handler`

from bench.runner import Quota, need_root

INNER = "WARMSTART_STEP_RUNS_INNER"


def parse(shape: str) -> tuple[int, int, int]:
    rows, width, past = (int(x) for x in shape.split("x"))
    return rows, width, past


class Runs:
    """A session of the pack's graph with the head over each row's last token, and KV arrays for every slot."""

    def __init__(self, pack: Path, threads: int, spin: bool, slots: int, capacity: int) -> None:
        import numpy as np
        import onnxruntime as ort

        from handler.backends.lastlogits import last_logits_model

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(pack))
        source = last_logits_model((pack / "model.onnx").read_bytes())
        self.session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        names = [i.name for i in self.session.get_inputs()]
        self.layers = sum(1 for n in names if n.startswith("past_key_values.") and n.endswith(".key"))
        kv = json.loads((pack / "manifest.json").read_text())["generation"]["kv"]  # the graph's KV dims are named
        heads, dim = int(kv["kv_heads"]), int(kv["head_dim"])
        self.vocab = int(self.session.get_outputs()[0].shape[-1])
        # zeros: pages are mapped when first touched (as the engine's MAP_NORESERVE pool)
        self.kv = [np.zeros((slots, heads, capacity, dim), np.float32) for _ in range(2 * self.layers)]
        self.np = np

    def binding(self, first: int, rows: int, width: int, past: int) -> tuple[Any, list[Any]]:
        from handler.backends.lastlogits import ROWS

        np = self.np
        binding = self.session.io_binding()
        held = [
            np.random.default_rng(1).integers(100, 5000, (rows, width)).astype(np.int64),
            np.ones((rows, past + width), np.int64),
            np.full((rows, 1), width - 1, np.int64),
            np.empty((rows, self.vocab), np.float32),
        ]
        for name, value in zip(("input_ids", "attention_mask", ROWS), held, strict=False):
            binding.bind_cpu_input(name, value)
        for layer in range(self.layers):
            for kind, name in enumerate(("key", "value")):
                a = self.kv[2 * layer + kind][first : first + rows]
                binding.bind_input(
                    f"past_key_values.{layer}.{name}", "cpu", 0, np.float32, list(a.shape), a.ctypes.data
                )
                binding.bind_output(f"present.{layer}.{name}", "cpu", 0, np.float32, list(a.shape), a.ctypes.data)
        binding.bind_output("logits", "cpu", 0, np.float32, list(held[3].shape), held[3].ctypes.data)
        return binding, held  # the arrays held while the binding is used (bound by address)

    def timed(self, run: Any, repeat: int) -> tuple[float, float]:
        """Median (CPU ms, wall ms) of `run()` after one untimed call."""
        run()
        cpu, wall = [], []
        for _ in range(repeat):
            c, w = time.process_time(), time.perf_counter()
            run()
            cpu.append((time.process_time() - c) * 1000)
            wall.append((time.perf_counter() - w) * 1000)
        return statistics.median(cpu), statistics.median(wall)


def inner(args: argparse.Namespace) -> None:
    shapes = [parse(s) for s in args.shapes.split(",") if s]
    pairs = [tuple(parse(s) for s in p.split("+")) for p in args.pairs.split(",") if p]
    slots = max([r for r, _, _ in shapes] + [a[0] + b[0] for a, b in pairs] + [1])
    capacity = max([w + p for _, w, p in shapes] + [s[1] + s[2] for pair in pairs for s in pair] + [1])
    threads = [int(x) for x in args.threads.split(",")]
    spins = [bool(int(x)) for x in args.spin.split(",")]
    print(f"{args.pack}; load average {os.getloadavg()[0]:.1f}; {args.vcpus} vCPU quota, its CPUs its own\n")
    print("| run | threads | spin | CPU ms | CPU ms / token | wall ms |\n|---|---|---|---|---|---|")
    for t in threads:
        for spin in spins:
            runs = Runs(args.pack, t, spin, slots, capacity)
            for rows, width, past in shapes:
                binding, _held = runs.binding(0, rows, width, past)
                cpu, wall = runs.timed(lambda b=binding, s=runs.session: s.run_with_iobinding(b), args.repeat)
                shape = f"{rows}x{width} after {past}"
                print(f"| {shape} | {t} | {int(spin)} | {cpu:.0f} | {cpu / (rows * width):.1f} | {wall:.0f} |")
    if not pairs:
        return
    # The pairs as the batch engine runs them (the HTTP host's engine does not spin; two spinning runs side by
    # side take each other's CPUs), on a session of each --pair-threads count, the earlier sessions kept open:
    # the RSS after each is what one more session of the same graph costs (its own prepacked weights).
    print("\n| pair (A + B) | threads | spin | one after the other: wall ms (CPU) | side by side: wall ms (CPU) |")
    print("|---|---|---|---|---|")
    kept, rss = [], [f"before the pairs' sessions {rss_mb():.0f} MB"]
    for t in [int(x) for x in (args.pair_threads or str(threads[-1])).split(",")]:
        for spin in [bool(int(x)) for x in str(args.pair_spin).split(",")]:
            runs = Runs(args.pack, t, spin, slots, capacity)
            kept.append(runs)
            rss.append(f"{len(kept)} session(s) {rss_mb():.0f} MB")
            for a, b in pairs:
                ws, cs, wo, co = pair(runs, a, b, args.repeat)
                name = f"{a[0]}x{a[1]} + {b[0]}x{b[1]}"
                print(f"| {name} | {t} | {int(spin)} | {ws:.0f} ({cs:.0f}) | {wo:.0f} ({co:.0f}) |")
    print("\nRSS: " + "; ".join(rss))


def pair(runs: Runs, a: tuple[int, int, int], b: tuple[int, int, int], repeat: int) -> tuple[float, ...]:
    """Median wall and CPU ms of runs A and B one after the other, then side by side (B in a second thread, the
    engine's prompt run beside its decode run), on disjoint slots of one session."""
    first, _ha = runs.binding(0, *a)
    second, _hb = runs.binding(a[0], *b)

    def serial() -> None:
        runs.session.run_with_iobinding(second)
        runs.session.run_with_iobinding(first)

    def overlapped() -> None:
        helper = threading.Thread(target=runs.session.run_with_iobinding, args=(second,))
        helper.start()
        runs.session.run_with_iobinding(first)
        helper.join()

    cs, ws = runs.timed(serial, repeat)
    co, wo = runs.timed(overlapped, repeat)
    return ws, cs, wo, co


def rss_mb() -> float:
    """This process's resident set now (VmRSS), MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pack", type=Path, required=True, help="a generate pack (the builder's KV-cache graph)")
    ap.add_argument("--shapes", default="1x1x60,8x1x60,32x1x60,1x32x0,4x32x0", help="ROWSxWIDTHxPAST, comma-separated")
    ap.add_argument("--threads", default="1,2", help="intra-op thread counts")
    ap.add_argument("--spin", default="0,1", help="intra-op spinning off (0) and on (1)")
    ap.add_argument("--pairs", default="8x1x60+1x32x0,32x1x60+1x32x0", help="A+B: two runs serial and side by side")
    ap.add_argument(
        "--pair-threads", default="", help="intra-op thread counts of the pairs' sessions (default: --threads' last)"
    )
    ap.add_argument("--pair-spin", default="0", help="spinning off (0) and on (1) for the pairs' sessions")
    ap.add_argument("--vcpus", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    if os.environ.get(INNER):
        inner(args)
        return 0
    why = need_root()
    if why:
        raise SystemExit(f"bench/generate/step_runs.py {why}")
    import subprocess

    with Quota("step-runs", args.vcpus) as quota:
        quota.own()
        argv_all = [sys.executable, str(Path(__file__).resolve()), *(sys.argv[1:] if argv is None else argv)]
        env = {**os.environ, INNER: "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        return subprocess.run(quota.wrap(argv_all), env=env, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
