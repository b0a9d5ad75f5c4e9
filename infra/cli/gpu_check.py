"""`make gpu-check`: the CUDA paths on a machine with an NVIDIA GPU, in one table, in under 5 minutes.

Rows: backend (onnx, torch) x dtype (float32, float16). Each row runs in its own process (a hung CUDA init
cannot stall the rest; each row's CUDA context is its own, as an instance's is) and reports:
- init: total ms and the `device` phase (the CUDA warm-up: context, arena, cuBLAS), and what the backend got
  (provider list, device, why not CUDA when it is not: a CPU-only torch build, a missing cuDNN, ...);
- first inference vs steady (median of --calls) at batch 1 and batch 32;
- the answers' cosine against the CPU float32 reference on the same texts (a device must not change answers);
- a snapshot's restore: the SnapStart hooks' before-snapshot and after-restore run in process, then the
  device re-check's verdict and one more inference.

float16 rows serve a copy of the default model packed with `--dtype float16` under build/gpu-check (packed
once, reused); where the pack refuses (the backend has no float16 path), the row says so with the message.

On a machine without a usable GPU it says why and exits 0 (`--device cpu` runs every row on the CPU anyway:
how the tests exercise this script).

Usage: .venv/bin/python -m infra.cli.gpu_check [--calls 20] [--device auto|cpu] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "models" / "default"
BUILD = ROOT / "build" / "gpu-check"
BACKENDS = ("onnx", "torch")
DTYPES = ("float32", "float16")
TEXTS = [
    "How long does a cold start take on Lambda?",
    "",
    "   ",
    "GPU 上的首次推理比稳定状态慢多少",
    "emoji 🚀🔥 and numbers 3.14159 2026",
    "def handler(event, context): return {'ok': True}",
    "a long passage " + "about serverless inference and keeping models warm " * 40,
]
BATCH32 = [f"passage {i}: " + TEXTS[i % len(TEXTS)] for i in range(32)]
ROW_TIMEOUT_S = 120  # a row that takes longer is reported as hung (5 minutes for the whole table)


def model_dir(dtype: str) -> tuple[Path | None, str]:
    """The packed model for a dtype, and why not when there is none."""
    if dtype == "float32":
        return DEFAULT, ""
    out = BUILD / dtype
    if (out / "manifest.json").is_file():
        return out, ""
    cmd = [sys.executable, "-m", "infra.cli", "pack", "--default", "--dtype", dtype, "--out", str(out), "--force"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return None, f"pack --dtype {dtype} refused: {lines[-1] if lines else done.returncode}"
    return out, ""


def timed(fn: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t) * 1000, out


def run_row(backend: str, directory: Path, device: str, calls: int) -> dict[str, Any]:
    """One backend on one model, in this process: init, first vs steady, the restore's device re-check."""
    from handler.core.config import Config
    from handler.runtime.invocation import Runtime
    from handler.runtime.snapshot import SnapshotHooks

    env = {"WARMSTART_DEVICE": device}
    lines: list[dict[str, Any]] = []
    # A row's backend is a name from the command line: Config checks it (a closed set) at init.
    settings: dict[str, Any] = {"model_dir": directory, "backend": backend, "device": device, "warmup": False}
    init_ms, rt = timed(lambda: Runtime.start(Config(**settings), environ=env, emit=lines.append))
    init = next((line for line in lines if line.get("warmstart") == "init"), {})
    facts = rt.backend.describe()

    def embed(texts: list[str]) -> list[list[float]]:
        out = rt.handle({"inputs": texts})
        if "embeddings" not in out:
            raise RuntimeError(f"no embeddings: {json.dumps(out)[:300]}")
        return list(out["embeddings"])

    row: dict[str, Any] = {
        "init_ms": round(init_ms, 1),
        "device_ms": (init.get("phases_ms") or {}).get("device"),
        "device": facts.get("device"),
        "providers": facts.get("providers"),
        "reason": facts.get("device_reason"),
    }
    for name, texts in (("b1", TEXTS[:1]), ("b32", BATCH32)):
        first, _ = timed(lambda texts=texts: embed(texts))
        steady = [timed(lambda texts=texts: embed(texts))[0] for _ in range(calls)]
        row[f"{name}_first_ms"] = round(first, 2)
        row[f"{name}_steady_ms"] = round(statistics.median(steady), 2)
    row["answers"] = embed(TEXTS)
    hooks = SnapshotHooks(rt, "vm", env, emit=lines.append)
    hooks.before_snapshot()
    try:
        hooks.after_restore()
        restore = next(line for line in reversed(lines) if line.get("warmstart") == "restore")
        row["restore_device"] = restore.get("device")
        row["after_restore_ok"] = len(embed(TEXTS[:1])) == 1
    except RuntimeError as e:  # the re-check refused to serve: that is its answer, reported
        row["restore_device"] = {"refused": str(e)}
        row["after_restore_ok"] = False
    return row


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else float(na == nb)


def min_cosine(rows: list[list[float]], ref: list[list[float]]) -> float:
    return min(cosine(a, b) for a, b in zip(rows, ref, strict=True))


def row_in_child(backend: str, directory: Path, device: str, calls: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "infra.cli.gpu_check", "--row", backend, "--model", str(directory), "--device", device]
    cmd += ["--calls", str(calls)]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=ROW_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"hung: no answer in {ROW_TIMEOUT_S} s"}
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()
        return {"error": tail[-1] if tail else f"exit {done.returncode}"}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


COLUMNS = [
    ("backend", "backend"),
    ("dtype", "dtype"),
    ("device", "device"),
    ("init_ms", "init ms"),
    ("device_ms", "warm-up ms"),
    ("b1_first_ms", "b1 first"),
    ("b1_steady_ms", "b1 steady"),
    ("b32_first_ms", "b32 first"),
    ("b32_steady_ms", "b32 steady"),
    ("cosine", "min cos vs CPU f32"),
    ("restore", "after restore"),
]


def restore_cell(row: dict[str, Any]) -> str:
    got = row.get("restore_device")
    if not isinstance(got, dict):
        return ""
    if "refused" in got:
        return f"refused: {got['refused']}"
    return f"cuda={got.get('cuda')}, {'serves' if row.get('after_restore_ok') else 'does not serve'}"


def table(rows: list[dict[str, Any]]) -> str:
    """One markdown table; a row that could not run says why in its device cell."""
    out = ["| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = []
        for key, _ in COLUMNS:
            if key == "device" and "error" in row:
                value: Any = f"not run: {row['error']}"
            elif key == "cosine":
                value = f"{row['cosine']:.6f}" if isinstance(row.get("cosine"), float) else ""
            elif key == "restore":
                value = restore_cell(row)
            else:
                value = row.get(key, "")
            cells.append(str(value if value is not None else ""))
        out.append("| " + " | ".join(cells) + " |")
    reasons = {f"{r['backend']}: {r['reason']}" for r in rows if r.get("reason") and r.get("device") != "cuda"}
    if reasons:
        out += ["", *(f"- not on the GPU: {reason}" for reason in sorted(reasons))]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20, help="steady-state calls per batch size (median)")
    ap.add_argument("--device", choices=("auto", "cpu"), default="auto", help="cpu: run the rows without a GPU")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--row", choices=BACKENDS, help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.row:
        print(json.dumps(run_row(args.row, args.model, args.device, args.calls)))
        return 0

    from handler.backends.device import probe_cuda

    probe = probe_cuda(args.device)
    if args.device == "auto" and not probe.usable:
        print(f"gpu-check: no usable NVIDIA GPU here ({probe.reason}); nothing to check")
        return 0
    device = "cuda" if probe.usable else "cpu"
    print(f"gpu-check: {probe.reason} {probe.devices}; rows on {device}", flush=True)
    started = time.perf_counter()
    ref = row_in_child("onnx", DEFAULT, "cpu", 1)
    rows: list[dict[str, Any]] = []
    for dtype in DTYPES:
        directory, why = model_dir(dtype)
        for backend in BACKENDS:
            row: dict[str, Any] = (
                {"error": why} if directory is None else row_in_child(backend, directory, device, args.calls)
            )
            row.update(backend=backend, dtype=dtype)
            if "answers" in row and "answers" in ref:
                row["cosine"] = min_cosine(row.pop("answers"), ref["answers"])
            rows.append(row)
            print(f"  {backend} {dtype}: {row.get('error', 'ran')}", flush=True)
    print(table(rows))
    print(f"\n({time.perf_counter() - started:.0f} s in all; reference: ONNX Runtime float32 on the CPU)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
