"""Our int4 MatMul kernel (handler/backends/native/ws_q4_kernels.c: the pack's MatMulNBits bytes as they are, no
prepack) against ONNX Runtime's MatMulNBits (MLAS, CompInt8: accuracy_level 4, its weights prepacked at session
creation), on the Qwen3-0.6B decode step's layer shapes, one thread on one CPU each.

    .venv/bin/python bench/generate/q4kern.py [--shapes qkv,o,gate,down] [--rows 1,8,32,64] [--rounds 5]
        [--isa best|avx512vnni|avx2|scalar] [--mbytes 32] [--cpu N] [--head] [--head-rows 1,8,64]

Per shape, `--mbytes` of distinct weights (several matrices of the shape, each with its own random bytes and
scales) are run in turn per call, so that the weights stream from beyond L2 as the model's ~300 MB do, not from
a cache-resident matrix; ONNX Runtime runs them as one graph of that many MatMulNBits nodes on the same A (one
Run per call), ours as that many ctypes calls (their overhead counted against us). Both sides use the same bytes.
Rounds interleave the two sides (alternating which goes first); the figures are the calling thread's CPU time
per matrix (ORT runs a 1-thread session's kernels on the calling thread), medians and ranges over rounds, and
the per-round ratio MLAS time / ours (> 1: ours faster). The process is pinned to one CPU (taskset's effect).

Also, before timing: the largest difference between the two sides' outputs (same bytes, same A) and between
ours and a float64 product of the dequantized weights with A quantized as the kernel does; and the load cost:
ONNX Runtime's session creation per weight matrix with prepacking (the default) and with
session.disable_prepacking, where ours has nothing to do (it reads the bytes as ONNX Runtime maps them); with
--head also the 8-bit LM head (blocks of 128, 1024 -> 151,936): its load cost, and our 8-bit kernel
(handler/backends/native/ws_q8_kernels.c, the engine's Q8MatMul) against MLAS on it at --head-rows, timed as above
(one matrix of ~155 MB: it streams from memory by itself).
The library is built with gcc into build/native/. Needs onnxruntime, onnx, numpy (.venv).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for `bench.runner`

from bench.generate.ws_q4 import ISAS, WsQ4, build
from bench.runner import ROOT, Stat, csv, fmt_ratio, order, table

# the decode step's int4 products (K -> N), as the 0.6B pack's 141 MatMulNBits hold them (gate and up share one)
SHAPES = {"qkv": (1024, 4096), "o": (2048, 1024), "gate": (1024, 3072), "down": (3072, 1024)}
HIDDEN, VOCAB = 1024, 151_936
PER_MODEL = {"qkv": 28, "o": 28, "gate": 56, "down": 28}  # matrices of each shape in the 28 layers
SIDES = ("ours", "mlas")


def weights(k: int, n: int, seed: int) -> tuple[Any, Any]:
    """Random int4 bytes [N, K/32, 16] and scales [N, K/32] (of the size a packed model's scales have)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(n, k // 32, 16), dtype=np.uint8)
    s = (rng.random((n, k // 32), dtype=np.float32) * np.float32(0.02) + np.float32(0.001)).astype(np.float32)
    return b, s


def graph(k: int, n: int, mats: list[tuple[Any, Any]], bits: int = 4, block: int = 32) -> bytes:
    """One MatMulNBits node per matrix, all on input A [M, K] (M dynamic), as the packer writes them."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, outs = [], [], []
    for i, (b, s) in enumerate(mats):
        inits += [numpy_helper.from_array(b, f"B{i}"), numpy_helper.from_array(s, f"S{i}")]
        attrs = {"K": k, "N": n, "bits": bits, "block_size": block, "accuracy_level": 4}
        nodes.append(
            helper.make_node("MatMulNBits", ["A", f"B{i}", f"S{i}"], [f"Y{i}"], domain="com.microsoft", **attrs)
        )
        outs.append(helper.make_tensor_value_info(f"Y{i}", TensorProto.FLOAT, ["M", n]))
    ins = [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])]
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(helper.make_graph(nodes, "q4", ins, outs, inits), ir_version=10, opset_imports=opsets)
    return bytes(model.SerializeToString())


def session(model: bytes, prepack: bool = True) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def reference(a: Any, b: Any, s: Any) -> Any:
    """float64 A @ W^T with A quantized per block of 32 as the kernel (and MLAS) does: the exact int32 sums."""
    import numpy as np

    m, k = a.shape
    blocks = a.reshape(m, k // 32, 32)
    amax = np.abs(blocks).max(-1)
    sa = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(amax != 0, np.float32(127) / np.where(amax != 0, amax, np.float32(1)), np.float32(0))
    q = np.rint(blocks * inv[..., None]).astype(np.float64)
    w = np.empty((*b.shape[:2], 32), np.float64)
    w[..., 0::2], w[..., 1::2] = b & 15, b >> 4
    dots = np.einsum("mbk,nbk->mnb", q, w - 8)
    return (sa[:, None, :].astype(np.float64) * s[None].astype(np.float64) * dots).sum(-1)


class Shape:
    """One layer shape's matrices, ORT session and our call arguments."""

    def __init__(self, name: str, lib: WsQ4, mbytes: float, mmax: int) -> None:
        import numpy as np

        self.name, self.lib = name, lib
        self.k, self.n = SHAPES[name]
        one = self.n * self.k // 2 + self.n * self.k // 32 * 4
        self.copies = max(1, math.ceil(mbytes * 2**20 / one))
        self.mats = [weights(self.k, self.n, seed) for seed in range(self.copies)]
        self.model = graph(self.k, self.n, self.mats)
        self.sess = session(self.model)
        self.a = np.random.default_rng(99).standard_normal((mmax, self.k)).astype(np.float32)
        self.c = np.zeros((self.copies, mmax, self.n), np.float32)
        self.scratch = np.empty(lib.lib.ws_q4_scratch_size(mmax, self.k), np.uint8)

    def ours(self, m: int) -> None:
        f, a, scr = self.lib.lib.ws_q4_matmul, self.a.ctypes.data, self.scratch.ctypes.data
        for i, (b, s) in enumerate(self.mats):
            c = self.c[i, :m]  # a contiguous [m, N] view
            f(a, m, self.k, b.ctypes.data, s.ctypes.data, self.n, c.ctypes.data, scr, 0, self.n)

    def mlas(self, m: int) -> None:
        self.sess.run(None, {"A": self.a[:m]})

    def timed(self, side: str, m: int, budget: float) -> float:
        """CPU seconds of this thread per matrix, over enough calls to fill `budget` seconds."""
        call = self.ours if side == "ours" else self.mlas
        call(m)  # warm: pages, caches, ORT's first-run allocations
        t = time.thread_time()
        call(m)
        once = max(time.thread_time() - t, 1e-6)
        reps = max(1, min(200, int(budget / once)))
        t = time.thread_time()
        for _ in range(reps):
            call(m)
        return (time.thread_time() - t) / reps / self.copies

    def check(self, m: int) -> tuple[float, float, float]:
        """(max |ours - MLAS| / max |C|, max |ours - float64| / max |C|, max |MLAS - float64| / max |C|)."""
        import numpy as np

        self.ours(m)
        got = self.c[0, :m]
        theirs = self.sess.run(["Y0"], {"A": self.a[:m]})[0]
        ref = reference(self.a[:m], *self.mats[0])
        scale = float(np.abs(ref).max())
        return (
            float(np.abs(got - theirs).max()) / scale,
            float(np.abs(got - ref).max()) / scale,
            float(np.abs(theirs - ref).max()) / scale,
        )

    def load_ms(self, prepack: bool, rounds: int) -> list[float]:
        return load_ms(graph(self.k, self.n, self.mats[:1]), prepack, rounds)


def load_ms(model: bytes, prepack: bool, rounds: int) -> list[float]:
    """Session creation of `model`, CPU ms of the process (steadier than wall time on a shared host)."""
    out = []
    for _ in range(rounds):
        t = time.process_time()
        sess = session(model, prepack)
        out.append((time.process_time() - t) * 1000)
        del sess
        gc.collect()
    return out


def head_weights() -> tuple[Any, Any]:
    """The 0.6B's LM head as the int4 pack holds it (8-bit, blocks of 128, 1024 -> 151,936), random bytes."""
    import numpy as np

    rng = np.random.default_rng(7)
    b = rng.integers(0, 256, size=(VOCAB, HIDDEN // 128, 128), dtype=np.uint8)
    s = (rng.random((VOCAB, HIDDEN // 128), dtype=np.float32) * np.float32(0.01)).astype(np.float32)
    return b, s


def head_model() -> bytes:
    return graph(HIDDEN, VOCAB, [head_weights()], bits=8, block=128)


class Head:
    """The LM head: our 8-bit kernel (ws_q8_matmul) and MLAS's MatMulNBits bits 8 on the same bytes."""

    def __init__(self, lib: WsQ4, mmax: int) -> None:
        import numpy as np

        self.lib, self.copies = lib, 1
        self.b, self.s = head_weights()
        self.sess = session(graph(HIDDEN, VOCAB, [(self.b, self.s)], bits=8, block=128))
        self.a = np.random.default_rng(98).standard_normal((mmax, HIDDEN)).astype(np.float32)
        self.c = np.zeros((mmax, VOCAB), np.float32)
        self.scratch = np.empty(lib.lib.ws_q8_scratch_size(mmax, HIDDEN, 128), np.uint8)

    def ours(self, m: int) -> None:
        self.lib.lib.ws_q8_matmul(
            self.a.ctypes.data, m, HIDDEN, 128, self.b.ctypes.data, self.s.ctypes.data, VOCAB, self.c.ctypes.data,
            self.scratch.ctypes.data, 0, VOCAB,
        )  # fmt: skip

    def mlas(self, m: int) -> None:
        self.sess.run(None, {"A": self.a[:m]})

    timed = Shape.timed

    def agreement(self, m: int) -> float:
        """max |ours - MLAS| / max |MLAS| at M = m."""
        import numpy as np

        self.ours(m)
        theirs = self.sess.run(None, {"A": self.a[:m]})[0]
        return float(np.abs(self.c[:m] - theirs).max() / np.abs(theirs).max())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--rows", default="1,8,32,64", help="M values (rows of A: 1 = one decode stream)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--isa", default="best", help=f"our code path: best or one of {', '.join(ISAS)}")
    ap.add_argument("--mbytes", type=float, default=32.0, help="distinct weights per shape, MiB (beyond L2)")
    ap.add_argument("--budget", type=float, default=0.15, help="seconds of calls per measurement")
    ap.add_argument("--cpu", type=int, default=None, help="the one CPU both sides run on (default: the last)")
    ap.add_argument("--build", type=Path, default=ROOT / "build" / "native")
    ap.add_argument("--head", action="store_true", help="also the 8-bit LM head (~155 MB): load cost, products")
    ap.add_argument("--head-rows", default="1,8,64", help="M values of the LM head's products (with --head)")
    args = ap.parse_args(argv)
    shapes = csv(args.shapes, SHAPES, "shapes")
    try:
        rows = [int(x) for x in args.rows.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--rows {args.rows!r}: comma-separated positive integers, e.g. 1,8,32,64") from None
    if not rows or min(rows) < 1:
        raise SystemExit(f"--rows {args.rows!r}: comma-separated positive integers, e.g. 1,8,32,64")
    cpu = args.cpu if args.cpu is not None else max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})  # both sides on the same single CPU (ORT's 1-thread session runs here too)

    lib = WsQ4(build(args.build))
    if args.isa != "best":
        lib.set_isa(args.isa)  # refuses a path this CPU lacks, naming the ones it has
    by = {name: Shape(name, lib, args.mbytes, max(rows)) for name in shapes}
    print(f"our path: {lib.isa} (this CPU runs {', '.join(lib.supported())}); CPU {cpu}")

    print("\nAgreement at M=8 (max abs difference over max |C|):\n")
    print(
        table(
            ["shape", "ours vs MLAS", "ours vs float64", "MLAS vs float64"],
            ([name, *(f"{x:.1e}" for x in by[name].check(min(8, max(rows))))] for name in shapes),
        )
    )

    cases = [(name, m) for name in shapes for m in rows]
    cpu_s: dict[tuple[str, str, int], list[float]] = {(s, n, m): [] for s in SIDES for n, m in cases}
    ratio: dict[tuple[str, int], list[float]] = {c: [] for c in cases}
    loads = []
    for rnd in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for name, m in cases:
            got = {side: by[name].timed(side, m, args.budget) for side in order(SIDES, rnd)}
            for side in SIDES:
                cpu_s[(side, name, m)].append(got[side])
            ratio[(name, m)].append(got["mlas"] / got["ours"])

    def us(side: str, name: str, m: int) -> str:
        return Stat.of(x * 1e6 for x in cpu_s[(side, name, m)]).fmt(1)

    def gmacs(side: str, name: str, m: int) -> str:
        k, n = SHAPES[name]
        med = Stat.of(cpu_s[(side, name, m)]).median
        return f"{m * k * n / med / 1e9:.1f}"

    out = []
    for name, m in cases:
        k, n = SHAPES[name]
        per_row = Stat.of(cpu_s[("ours", name, m)]).median / m * 1e9
        row = [f"{name} {k}->{n}", m, us("ours", name, m), us("mlas", name, m), fmt_ratio(ratio[(name, m)])]
        out.append([*row, f"{per_row:,.0f}", gmacs("ours", name, m), gmacs("mlas", name, m)])
    head = ["shape K->N", "M", "ours µs", "MLAS µs", "MLAS/ours", "ours ns/row", "ours GMAC/s", "MLAS GMAC/s"]
    print(f"\n{args.rounds} rounds, CPU time per matrix, 1-min load average {Stat.of(loads).fmt(1)}\n")
    print(table(head, out))

    if set(shapes) == set(SHAPES):
        step = []
        for m in rows:
            tot = {
                side: sum(Stat.of(cpu_s[(side, name, m)]).median * PER_MODEL[name] for name in shapes) for side in SIDES
            }
            step.append(
                [m, f"{tot['ours'] * 1e3:.1f}", f"{tot['mlas'] * 1e3:.1f}", f"{tot['mlas'] / tot['ours']:.2f}x"]
            )
        print("\nThe 28 layers' 140 int4 products of one step (medians x matrices per shape; no LM head), CPU ms:\n")
        print(table(["M", "ours", "MLAS", "MLAS/ours"], step))

    print("\nLoad: ONNX Runtime session creation of one matrix (CPU ms, median and range); ours: no work\n")
    load_rows, total = [], 0.0
    for name in shapes:
        pre, raw = by[name].load_ms(True, args.rounds), by[name].load_ms(False, args.rounds)
        extra = Stat.of(pre).median - Stat.of(raw).median
        total += extra * PER_MODEL[name]
        load_rows.append([name, Stat.of(pre).fmt(2), Stat.of(raw).fmt(2), f"{extra:.2f}", PER_MODEL[name]])
    print(table(["shape", "prepack (default)", "disable_prepacking", "prepack's cost", "in the 0.6B"], load_rows))
    print(f"\nprepack's cost x the 0.6B model's matrices of these shapes: {total:.0f} ms")
    if args.head:
        model = head_model()
        pre, raw = load_ms(model, True, args.rounds), load_ms(model, False, args.rounds)
        extra = Stat.of(pre).median - Stat.of(raw).median
        head = f"prepack {Stat.of(pre).fmt(0)} ms, disable_prepacking {Stat.of(raw).fmt(0)} ms"
        print(f"\nThe LM head (8-bit, blocks of 128; MLAS's), CPU: {head}, prepack's cost {extra:.0f} ms")
        del model
        gc.collect()
        head_products(lib, args)
    return 0


def head_products(lib: WsQ4, args: argparse.Namespace) -> None:
    """Our 8-bit kernel against MLAS on the LM head, rounds interleaved as the int4 shapes'."""
    try:
        rows = [int(x) for x in args.head_rows.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--head-rows {args.head_rows!r}: comma-separated positive integers, e.g. 1,8,64") from None
    if not rows or min(rows) < 1:
        raise SystemExit(f"--head-rows {args.head_rows!r}: comma-separated positive integers, e.g. 1,8,64")
    head = Head(lib, max(rows))
    agree = ", ".join(f"M={m} {head.agreement(m):.1e}" for m in rows)
    print(f"\nThe LM head 1024->151936, 8-bit: ours vs MLAS, max abs difference over max |C|: {agree}")
    cpu_s: dict[tuple[str, int], list[float]] = {(side, m): [] for side in SIDES for m in rows}
    ratio: dict[int, list[float]] = {m: [] for m in rows}
    loads = []
    for rnd in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for m in rows:
            got = {side: head.timed(side, m, args.budget) for side in order(SIDES, rnd)}
            for side in SIDES:
                cpu_s[(side, m)].append(got[side])
            ratio[m].append(got["mlas"] / got["ours"])
    out = []
    for m in rows:
        med = {side: Stat.of(cpu_s[(side, m)]).median for side in SIDES}
        out.append(
            [
                m,
                Stat.of(x * 1e3 for x in cpu_s[("ours", m)]).fmt(2),
                Stat.of(x * 1e3 for x in cpu_s[("mlas", m)]).fmt(2),
                fmt_ratio(ratio[m]),
                f"{m * HIDDEN * VOCAB / med['ours'] / 1e9:.1f}",
                f"{m * HIDDEN * VOCAB / med['mlas'] / 1e9:.1f}",
            ]
        )
    print(f"\n{args.rounds} rounds, CPU ms per call, 1-min load average {Stat.of(loads).fmt(1)}\n")
    print(table(["M", "ours ms", "MLAS ms", "MLAS/ours", "ours GMAC/s", "MLAS GMAC/s"], out))


if __name__ == "__main__":
    sys.exit(main())
