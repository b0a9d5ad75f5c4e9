"""Where a generate pack's decode step goes at batch 1: ONNX Runtime's profiler on the pack's model.onnx, run as
onnxruntime-genai runs a decode step (one new token after --past positions; past and present keys/values one
buffer of max length, bound both ways, as genai's past_present_share_buffer does), time per op type and the
slowest nodes.

    .venv/bin/python bench/generate/decode_profile.py --pack DIR [--past 512] [--steps 30] [--threads 1]

The profiler's times are wall time: on a loaded host read the shares, not the milliseconds; the step's CPU time
(this thread's clock: with one intra-op thread the step runs on it) is printed beside them.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def kv_shape(shape: list[Any], max_length: int, head_size: int) -> list[int]:
    """A past_key_values input's shape as genai allocates it with a shared buffer: the sequence axis max length."""
    names = {"batch_size": 1, "past_sequence_length": max_length, "kv_cache_dim": head_size}
    out = []
    for d in shape:
        if isinstance(d, str) and d not in names:
            raise SystemExit(f"past_key_values axis {d!r}: not one of {', '.join(names)}")
        out.append(names[d] if isinstance(d, str) else int(d))
    return out


def op_totals(events: list[dict[str, Any]]) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Kernel time (µs) per op type and per node from ONNX Runtime's profile events."""
    by_op: collections.Counter[str] = collections.Counter()
    by_node: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            by_op[e["args"]["op_name"]] += e["dur"]
            by_node[e["name"].removesuffix("_kernel_time")] += e["dur"]
    return by_op, by_node


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pack", type=Path, required=True, help="a generate pack (or the builder's output directory)")
    ap.add_argument("--past", type=int, default=512, help="positions already in the cache")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    import numpy as np
    import onnxruntime as ort

    decoder = json.loads((args.pack / "genai_config.json").read_text())["model"]["decoder"]
    head_size = int(decoder["head_size"])
    max_length = args.past + args.steps + 2
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.gettempdir()) / "warmstart-decode-profile")
    session = ort.InferenceSession(str(args.pack / "model.onnx"), options, providers=["CPUExecutionProvider"])
    binding = session.io_binding()
    kv = {}
    for i in session.get_inputs():
        if i.name.startswith("past_key_values"):
            kv[i.name] = ort.OrtValue.ortvalue_from_numpy(
                np.zeros(kv_shape(i.shape, max_length, head_size), np.float32)
            )
            binding.bind_ortvalue_input(i.name, kv[i.name])
            binding.bind_ortvalue_output(i.name.replace("past_key_values", "present"), kv[i.name])
        elif i.name not in ("input_ids", "attention_mask"):
            raise SystemExit(f"input {i.name!r}: this profile feeds input_ids, attention_mask and past_key_values")
    binding.bind_cpu_input("input_ids", np.full((1, 1), 100, np.int64))
    for o in session.get_outputs():
        if not o.name.startswith("present"):
            binding.bind_output(o.name)

    def step(total: int) -> None:
        binding.bind_cpu_input("attention_mask", np.ones((1, total), np.int64))
        session.run_with_iobinding(binding)

    step(args.past + 1)  # the first run (allocations) is profiled too: counted over steps + 1
    cpu, wall = time.thread_time(), time.perf_counter()
    for k in range(args.steps):
        step(args.past + 2 + k)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    profile = session.end_profiling()
    events = json.loads(Path(profile).read_text())
    os.remove(profile)
    by_op, by_node = op_totals(events)
    total = sum(by_op.values())
    n = args.steps + 1
    print(
        f"{args.pack}: decode step after {args.past} positions, {args.threads} thread(s), {args.steps} steps; "
        f"per step wall {wall / args.steps * 1000:.1f} ms, this thread's CPU {cpu / args.steps * 1000:.1f} ms; "
        f"load average {os.getloadavg()[0]:.1f}\n"
    )
    print("| op type | kernel time / step | share |\n|---|---|---|")
    for op, us in by_op.most_common(10):
        print(f"| {op} | {us / n / 1000:.2f} ms | {100 * us / total:.1f}% |")
    print("\n| node | kernel time / step |\n|---|---|")
    for node, us in by_node.most_common(5):
        print(f"| {node} | {us / n / 1000:.2f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
