"""The int4 decode step's matrix products alone, per quantization scheme, without packing a model: one ONNX graph
holding every MatMulNBits of a Qwen3-0.6B decode step at batch 1 (28 layers' fused q/k/v, o, gate, up and down,
then the 151,936-row LM head), each with weights of its own (the step streams ~0.4 GB of them, as the model does,
instead of re-reading one cache-resident matrix), random values of the exact shapes.

    .venv/bin/python bench/generate/matmul.py [--schemes 32/4,64/4,128/4,64/8,64/4/asym] [--rounds 3] [--threads 2]

A scheme is BLOCK/HEAD_BITS[/asym]: MatMulNBits' block size (accuracy level 4: int8 activations, as the
packer's BUILDER_OPTIONS; symmetric unless /asym: a zero point per block) for every layer, and the LM head's bits
(4, or 8 as llama.cpp keeps its output matrix at 6-8 bits). Per round, in rotated order: CPU time per step of
one intra-op thread (the thread's clock: what 1.7 vCPU, which warmstart runs with one thread, pays; steady under
a loaded host) and wall time per step with --threads. The graphs
are written once under --cache. Needs only onnxruntime and onnx (.venv).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for `bench.runner`

from bench.runner import ROOT, Stat, order, table

HIDDEN, LAYERS, VOCAB = 1024, 28, 151_936
# (name, K, N) per layer: q/k/v fused as onnxruntime-genai's builder fuses them (16 + 2 x 8 heads of 128)
LAYER = (
    ("qkv", HIDDEN, 4096),
    ("o", 2048, HIDDEN),
    ("gate", HIDDEN, 3072),
    ("up", HIDDEN, 3072),
    ("down", 3072, HIDDEN),
)


Scheme = tuple[int, int, bool]  # block size, LM head bits, asymmetric (zero points)


def parse_schemes(text: str) -> list[Scheme]:
    """--schemes "32/4,64/8,64/4/asym": (block size, LM head bits, asymmetric); refused with the valid values."""
    out = []
    for item in (x for x in text.split(",") if x.strip()):
        block, bits, *rest = [*item.split("/"), ""]
        if block not in ("16", "32", "64", "128", "256") or bits not in ("4", "8") or rest[:-1] not in ([], ["asym"]):
            raise SystemExit(
                f"--schemes {item!r}: BLOCK/HEAD_BITS[/asym], BLOCK of 16, 32, 64, 128, 256, HEAD_BITS 4 or 8"
            )
        out.append((int(block), int(bits), rest[:-1] == ["asym"]))
    if not out:
        raise SystemExit("--schemes: at least one BLOCK/HEAD_BITS, e.g. 32/4")
    return out


def label(scheme: Scheme) -> str:
    block, bits, asym = scheme
    return f"block {block}, LM head {bits}-bit" + (", asymmetric" if asym else "")


def specs(layers: int = LAYERS, head_bits: int = 4, vocab: int = VOCAB) -> list[tuple[str, int, int, int]]:
    """(name, K, N, bits) of every product of one decode step."""
    out = [(f"l{i}_{name}", k, n, 4) for i in range(layers) for name, k, n in LAYER]
    return [*out, ("lm_head", HIDDEN, vocab, head_bits)]


def graph(block: int, head_bits: int, layers: int = LAYERS, vocab: int = VOCAB, asym: bool = False) -> Any:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, outs = [], [], []
    for name, k, n, bits in specs(layers, head_bits, vocab):
        blocks = k // block
        weights = rng.integers(0, 256, size=(n, blocks, block * bits // 8), dtype=np.uint8)
        scales = rng.random(n * blocks, dtype=np.float32) * np.float32(0.01)
        inits += [numpy_helper.from_array(weights, name + "_B"), numpy_helper.from_array(scales, name + "_S")]
        attrs = {"K": k, "N": n, "bits": bits, "block_size": block, "accuracy_level": 4}
        inputs = [f"A{k}", name + "_B", name + "_S"]
        if asym:  # a zero point per block, packed `bits` wide (MatMulNBits' uint8 layout: N x ceil(blocks*bits/8))
            points = rng.integers(0, 256, size=(n * ((blocks * bits + 7) // 8),), dtype=np.uint8)
            inits.append(numpy_helper.from_array(points, name + "_Z"))
            inputs.append(name + "_Z")
        nodes.append(helper.make_node("MatMulNBits", inputs, [name + "_Y"], domain="com.microsoft", **attrs))
        outs.append(helper.make_tensor_value_info(name + "_Y", TensorProto.FLOAT, [1, n]))
    ins = [helper.make_tensor_value_info(f"A{k}", TensorProto.FLOAT, [1, k]) for k in sorted({k for _, k, _ in LAYER})]
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    # IR 10: what onnxruntime 1.2x reads (onnx 1.23 writes 11+ by default)
    return helper.make_model(
        helper.make_graph(nodes, "decode_matmuls", ins, outs, inits), ir_version=10, opset_imports=opsets
    )


def written(cache: Path, scheme: Scheme) -> Path:
    import onnx

    block, head_bits, asym = scheme
    path = cache / f"decode-matmuls-b{block}-h{head_bits}{'-asym' if asym else ''}.onnx"
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        model = graph(block, head_bits, asym=asym)
        onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data")
        gc.collect()
    return path


def per_step(path: Path, threads: int, steps: int, clock: str) -> float:
    """ms per decode step's products: `clock` "cpu" (this thread's time, one intra-op thread runs on it) or "wall"."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = {f"A{k}": np.random.default_rng(1).standard_normal((1, k)).astype(np.float32) for k in (1024, 2048, 3072)}
    for _ in range(2):
        session.run(None, feed)
    now = time.thread_time if clock == "cpu" else time.perf_counter
    start = now()
    for _ in range(steps):
        session.run(None, feed)
    return (now() - start) / steps * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemes", default="32/4,64/4,128/4,64/8", help="BLOCK/HEAD_BITS[/asym], comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads of the wall-time figure")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--cache", type=Path, default=ROOT / "build" / "bench" / "decode-matmuls")
    args = ap.parse_args(argv)
    schemes = parse_schemes(args.schemes)
    paths = {s: written(args.cache, s) for s in schemes}
    cpu: dict[Scheme, list[float]] = {s: [] for s in schemes}
    wall: dict[Scheme, list[float]] = {s: [] for s in schemes}
    loads = []
    for rnd in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for s in order(schemes, rnd):
            cpu[s].append(per_step(paths[s], 1, args.steps, "cpu"))
            wall[s].append(per_step(paths[s], args.threads, args.steps, "wall"))
            gc.collect()
    first = statistics.median(cpu[schemes[0]])
    rows = [
        [
            f"block {b}, LM head {h}-bit",
            Stat.of(cpu[(b, h)]).fmt(1, " ms"),
            f"{statistics.median(cpu[(b, h)]) / first:.2f}x",
            Stat.of(wall[(b, h)]).fmt(1, " ms"),
        ]
        for b, h in schemes
    ]
    head = [
        "scheme",
        "CPU / step (1 thread)",
        f"CPU vs {schemes[0][0]}/{schemes[0][1]}",
        f"wall / step ({args.threads})",
    ]
    print(f"{args.rounds} rounds, 1-min load average {Stat.of(loads).fmt(1)}\n")
    print(table(head, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
