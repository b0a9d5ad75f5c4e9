"""Serializing an embedding answer: response size and time for 256 x 384 float32 vectors, side by side.

- float64 text: `json.dumps` of `array.tolist()` (what the embedding task answered before: a float32 printed
  through Python's float64 repr, up to 17 significant digits)
- float32 text, naive: `float(str(np.float32(v)))` per value, then `json.dumps`
- float32 text: `handler.api.encode.dumps` of the float32 array (orjson: shortest float32 text, written once)
- base64: `handler.tasks.text.base64_rows` (little-endian float32 bytes), then `json.dumps`

Vectors are the default model's real embeddings of 256 distinct texts (`--synthetic`: normal(0, 0.05),
L2-normalized, no model needed). Times are medians of `--repeat` runs, each the whole conversion + dumps.

Usage: .venv/bin/python bench/bench_serialize.py [--repeat 15] [--synthetic] [--json out]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from handler.api.encode import dumps as edge_dumps  # noqa: E402
from handler.tasks.text import base64_rows  # noqa: E402

ROWS, DIM = 256, 384


def real_vectors() -> npt.NDArray[np.float32]:
    from handler.core.config import Config
    from handler.runtime.invocation import Runtime

    runtime = Runtime.start(Config(model_dir=ROOT / "models" / "default", backend="onnx"), environ={}, emit=None)
    texts = [f"passage {i}: serverless inference keeps model {i % 7} warm, " + "more " * (i % 13) for i in range(ROWS)]
    vectors, _ = runtime.task.embed(texts)  # type: ignore[attr-defined]
    return np.asarray(vectors, dtype=np.float32)


def synthetic_vectors() -> npt.NDArray[np.float32]:
    v = np.random.default_rng(0).normal(0, 0.05, (ROWS, DIM)).astype(np.float32)
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def dumps(embeddings: Any) -> bytes:
    return json.dumps({"embeddings": embeddings, "model": "m@1"}, separators=(",", ":")).encode()


def naive(vectors: npt.NDArray[np.float32]) -> list[list[float]]:
    return [[float(str(v)) for v in row] for row in vectors]


def measure(encode: Callable[[], bytes], repeat: int) -> tuple[int, float]:
    size, times = 0, []
    for _ in range(repeat):
        t = time.perf_counter()
        size = len(encode())
        times.append(time.perf_counter() - t)
    return size, statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--synthetic", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    vectors = synthetic_vectors() if args.synthetic else real_vectors()
    cases: dict[str, Callable[[], bytes]] = {
        "float64 text (before)": lambda: dumps(vectors.tolist()),
        "float32 text, naive str()": lambda: dumps(naive(vectors)),
        "float32 text (encode.dumps)": lambda: edge_dumps({"embeddings": vectors, "model": "m@1"}),
        "base64 float32": lambda: dumps(base64_rows(vectors)),
    }
    # Every text form reads back as the same float32 vectors (the check this benchmark relies on).
    for name in ("float64 text (before)", "float32 text (encode.dumps)"):
        back = np.asarray(json.loads(cases[name]())["embeddings"], dtype=np.float32)
        assert np.array_equal(back, vectors), name
    rows = {}
    print(f"{ROWS} x {DIM} float32 ({'synthetic' if args.synthetic else 'all-MiniLM-L6-v2 embeddings'})")
    print(f"{'form':30} {'bytes':>10} {'ms (median)':>12}")
    for name, encode in cases.items():
        size, ms = measure(encode, args.repeat)
        rows[name] = {"bytes": size, "ms": round(ms, 2)}
        print(f"{name:30} {size:>10,} {ms:>12.1f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
