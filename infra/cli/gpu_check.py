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

Generation rows (the vllm backend, on a generate pack that has it: `--lm DIR`, or WARMSTART_GPU_CHECK_LM; made
with `warmstart pack --from DIR --backends vllm` or `genai,vllm`), each in its own process as well:
- init (the `load` phase: weights to the GPU, the KV cache sized, the CUDA graphs captured) and vLLM's import;
- the first request's time to its first token vs the steady one's (median), on one 512-token prompt;
- decode tokens/s of one stream (128 greedy tokens), and of LM_STREAMS streams at once (aggregate);
- a restore from the warm standby: sleep (level 1) ms, wake ms, the first token after the wake, and that it serves;
- greedy agreement with the genai engine on the CPU (float32), where the pack has both (`--backends genai,vllm`).
Without vllm installed (the GPU image's vllm stage has it) or without such a pack, the table says why they did
not run.

On a machine without a usable GPU it says why and exits 0 (`--device cpu` runs every embedding row on the CPU
anyway: how the tests exercise this script).

Usage: .venv/bin/python -m infra.cli.gpu_check [--calls 20] [--device auto|cpu] [--lm DIR] [--json out.json]
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
LM_ROW_TIMEOUT_S = 300  # vLLM's import, the weights and the CUDA graphs' capture come first
LM_ENV = "WARMSTART_GPU_CHECK_LM"
LM_PROMPT_TOKENS = 512
LM_DECODE_TOKENS = 128
LM_STREAMS = 8
LM_TEXT = "Serverless inference keeps the model warm between requests. "
LM_CHECK_PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,")


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


def lm_unavailable(directory: Path | None) -> str:
    """Why the generation rows cannot run here ("" when they can)."""
    import importlib.util

    if "vllm" not in sys.modules and importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (the GPU image's vllm stage: infra/deploy/requirements-vllm.txt)"
    if directory is None:
        return f"no generate pack with a vllm backend: pass --lm DIR or set {LM_ENV}"
    try:
        backends = json.loads((directory / "manifest.json").read_text()).get("backends", {})
    except (OSError, ValueError) as e:
        return f"{directory}: no readable manifest ({e})"
    return "" if "vllm" in backends else f"{directory}: not packed for vllm (pack --backends genai,vllm)"


def run_lm_row(directory: Path, calls: int, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The vllm backend on one generate pack, in this process: init, first token vs steady, tokens/s, a restore
    from sleep mode (the warm standby's)."""
    from concurrent.futures import ThreadPoolExecutor

    from handler.core.config import Config
    from handler.runtime.invocation import Runtime

    env = {"WARMSTART_STANDBY_AFTER_S": "3600", **(environ or {})}  # sleep mode on; the check sleeps it itself
    lines: list[dict[str, Any]] = []
    settings: dict[str, Any] = {"model_dir": directory, "backend": "vllm", "warmup": True}
    init_ms, rt = timed(lambda: Runtime.start(Config(**settings), environ=env, emit=lines.append))
    init = next((line for line in lines if line.get("warmstart") == "init"), {})
    phases = init.get("phases_ms") or {}
    task, engine = rt.task, rt.backend
    context = int(rt.manifest.options["context_length"])  # a small model's context may be under the figures
    n_prompt, n_decode = min(LM_PROMPT_TOKENS, context // 2), min(LM_DECODE_TOKENS, context // 4)
    ids = task.tokenizer.encode(LM_TEXT * (n_prompt // 4 + 1), add_special_tokens=False).ids[:n_prompt]
    prompt = task.tokenizer.decode(ids)

    def first_token_ms() -> float:
        started = time.perf_counter()
        stream = task.stream({"prompt": prompt, "temperature": 0, "max_tokens": 8})
        try:
            next(stream)
        finally:
            stream.close()
        return (time.perf_counter() - started) * 1000

    def decode(_: int = 0) -> tuple[int, float]:
        ms, answer = timed(lambda: rt.handle({"prompt": "Once", "temperature": 0, "max_tokens": n_decode}))
        return int(answer["usage"]["completion_tokens"]), ms

    row: dict[str, Any] = {
        "init_ms": round(init_ms, 1),
        "import_ms": phases.get("vllm_import"),
        "load_ms": phases.get("load"),
        "prompt_tokens": len(task.prompt_ids({"prompt": prompt})),
        "first_token_ms": round(first_token_ms(), 2),
        "steady_first_token_ms": round(statistics.median(first_token_ms() for _ in range(calls)), 2),
    }
    made, ms = decode()
    row["tokens_per_s"] = round(made / ms * 1000, 1)
    with ThreadPoolExecutor(LM_STREAMS) as pool:
        started = time.perf_counter()
        total = sum(n for n, _ in pool.map(decode, range(LM_STREAMS)))
        row[f"tokens_per_s_{LM_STREAMS}"] = round(total / (time.perf_counter() - started), 1)
    row["sleep_ms"], slept = timed(engine.sleep)
    row["wake_ms"], woke = timed(engine.wake_up)
    row["after_wake_first_token_ms"] = round(first_token_ms(), 2)
    row["restored"] = bool(slept and woke and decode()[0] > 0)
    row["sleep_ms"], row["wake_ms"] = round(row["sleep_ms"], 1), round(row["wake_ms"], 1)
    row["device"], row["reason"] = engine.describe().get("device"), engine.describe().get("device_reason")
    row["greedy_vs_genai"] = greedy_agreement(directory, rt, n_decode)
    return row


def greedy_agreement(directory: Path, rt: Any, tokens: int) -> float | str:
    """How far vLLM's greedy tokens follow the genai engine's on the CPU (the pack's float32 reference, where the
    pack has both): the mean over LM_CHECK_PROMPTS of the common prefix over the longer answer. vLLM runs a float32
    checkpoint in half precision, so 1.0 is not a given; a low figure is the thing to look into."""
    from handler.core.config import Config
    from handler.runtime.invocation import Runtime

    if "genai" not in json.loads((directory / "manifest.json").read_text()).get("backends", {}):
        return "no genai backend in the pack to compare with"
    settings: dict[str, Any] = {"model_dir": directory, "backend": "genai", "device": "cpu", "warmup": False}
    cpu = Runtime.start(Config(**settings), environ={"WARMSTART_DEVICE": "cpu"}, emit=None)

    def ids(runtime: Any, prompt: str) -> list[int]:
        pieces = runtime.task.stream({"prompt": prompt, "temperature": 0, "max_tokens": tokens})
        return [t for piece in pieces for t in piece["token_ids"]]

    return round(statistics.mean(prefix_share(ids(rt, p), ids(cpu, p)) for p in LM_CHECK_PROMPTS), 4)


def prefix_share(a: list[int], b: list[int]) -> float:
    """The tokens two greedy answers share before they first differ, over the longer answer's length."""
    if not a and not b:
        return 1.0  # both stopped at once: the same answer
    same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return same / max(len(a), len(b))


def lm_row_in_child(directory: Path, calls: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "infra.cli.gpu_check", "--lm-row", "--lm", str(directory), "--calls", str(calls)]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=LM_ROW_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"hung: no answer in {LM_ROW_TIMEOUT_S} s"}
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()
        return {"error": tail[-1] if tail else f"exit {done.returncode}"}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


LM_COLUMNS = [
    ("model", "model"),
    ("device", "device"),
    ("init_ms", "init ms"),
    ("import_ms", "vllm import ms"),
    ("load_ms", "load + graphs ms"),
    ("prompt_tokens", "prompt tokens"),
    ("first_token_ms", "first token ms"),
    ("steady_first_token_ms", "steady first token ms"),
    ("tokens_per_s", "tokens/s (1 stream)"),
    (f"tokens_per_s_{LM_STREAMS}", f"tokens/s ({LM_STREAMS} streams)"),
    ("sleep_ms", "sleep ms"),
    ("wake_ms", "wake ms"),
    ("after_wake_first_token_ms", "first token after wake ms"),
    ("restored", "serves after wake"),
    ("greedy_vs_genai", "greedy agreement vs genai f32 (CPU)"),
]


def lm_table(row: dict[str, Any]) -> str:
    """The generation row as a markdown table; one that did not run says why in its device cell."""
    out = ["| " + " | ".join(title for _, title in LM_COLUMNS) + " |", "|" + "---|" * len(LM_COLUMNS)]
    cells = []
    for key, _ in LM_COLUMNS:
        value = f"not run: {row['error']}" if key == "device" and "error" in row else row.get(key, "")
        cells.append(str(value if value is not None else ""))
    return "\n".join([*out, "| " + " | ".join(cells) + " |"])


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
    ap.add_argument("--lm", type=Path, default=os.environ.get(LM_ENV) or None, help="a generate pack with vllm")
    ap.add_argument("--row", choices=BACKENDS, help=argparse.SUPPRESS)
    ap.add_argument("--lm-row", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.row:
        print(json.dumps(run_row(args.row, args.model, args.device, args.calls)))
        return 0
    if args.lm_row:
        print(json.dumps(run_lm_row(args.lm, args.calls)))
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
    why = lm_unavailable(args.lm) if device == "cuda" else "the vllm backend runs on a CUDA GPU only"
    lm: dict[str, Any] = {"error": why} if why else lm_row_in_child(args.lm, args.calls)
    lm["model"] = str(args.lm or "")
    print(f"\ngeneration (vllm):\n{lm_table(lm)}")
    print(f"\n({time.perf_counter() - started:.0f} s in all; reference: ONNX Runtime float32 on the CPU)")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "generation": lm}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
