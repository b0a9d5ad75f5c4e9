"""Cold start under Lambda-sized CPU quotas, with a warm and a cold page cache: spawn → first embedding through
the real awslambdaric, interleaved round by round (a noisy neighbour hurts every variant alike), medians.

Needs root: a cgroup v1 `cpu` controller under /sys/fs/cgroup/cpu (CPU quota via cpu.cfs_quota_us) and
posix_fadvise(DONTNEED) for the cold page cache, which evicts exactly the files a start opens (found once per
variant with strace; pages that other processes have mapped stay resident, as on any shared host).

Variants (--variants, comma-separated):
  ours            handler.app on this checkout (every saving on: docs/coldstart.md)
  main            handler.app as on git ref --ref (default main), same model directory (or --ref-model's):
                  today's product
  main-no-optimized  main on the portable ONNX model (WARMSTART_ORT_OPTIMIZED=0)
  minimal_ort     bench/handlers/minimal_ort.py: ONNX Runtime + tokenizers, defaults
  floor_ort       bench/handlers/floor_ort.py: the tuned hand-written floor (takes the free savings)
  naive_st        bench/handlers/naive_st.py: sentence-transformers loaded at init (10+ s a start)
  ours-no-blas, ours-no-prefetch, ours-no-optimized, ours-no-shortcut, ours+warmup: ours with one switch
                  flipped (warm-up is off by default for an on-demand init)
  ours_torch, main_torch, floor_torch (minimal_torch.py), ours_torch-no-prefetch: the torch backend

Usage: .venv/bin/python bench/bench_coldstart_quota.py [--rounds 5] [--quotas 0.29,0.58,1.0,1.7]
       [--caches warm,cold] [--variants ours,main,minimal_ort,floor_ort] [--out bench-results/quota]
       [--ref main] [--ref-model DIR]  (DIR: a packed model the `main` variants read instead of ours, e.g. a
       default model packed by --ref's packer, to compare two packs of one model)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.runtime_stub import RuntimeStub  # noqa: E402

PORTABLE = ROOT / "models" / "default"
MODEL = ROOT / "build" / "bench" / "model-optimized"  # the default model + `warmstart optimize` (see prepare_model)
REF_MODEL = ROOT / "build" / "bench" / "ref-model-optimized"  # --ref-model's, prepared the same way
EVENT = {"inputs": ["A cold start is the time from nothing to the first answer."]}
# Lambda's memory sizes for these vCPU shares (1 vCPU per 1,769 MB).
QUOTAS = {0.29: 512, 0.58: 1024, 1.0: 1769, 1.7: 3008}
CGROUP = Path("/sys/fs/cgroup/cpu")
APP = "handler.app.lambda_handler"

# name -> (code root: "ours" | "ref", handler, extra environment)
VARIANTS: dict[str, tuple[str, str, dict[str, str]]] = {
    "ours": ("ours", APP, {}),
    "main": ("ref", APP, {}),
    "main-no-optimized": ("ref", APP, {"WARMSTART_ORT_OPTIMIZED": "0"}),
    "minimal_ort": ("ours", "bench.handlers.minimal_ort.lambda_handler", {}),
    "floor_ort": ("ours", "bench.handlers.floor_ort.lambda_handler", {}),
    "naive_st": ("ours", "bench.handlers.naive_st.lambda_handler", {}),
    "ours-no-blas": ("ours", APP, {"WARMSTART_BLAS_THREADS": "default"}),
    "ours-no-prefetch": ("ours", APP, {"WARMSTART_PREFETCH": "off"}),
    "ours-no-optimized": ("ours", APP, {"WARMSTART_ORT_OPTIMIZED": "0"}),
    "ours+warmup": ("ours", APP, {"WARMSTART_WARMUP": "1"}),
    "ours-no-shortcut": ("ours", APP, {"WARMSTART_TOKENIZER_SHORTCUT": "0"}),
    "ours_torch": ("ours", APP, {"WARMSTART_BACKEND": "torch"}),
    "ours_torch-no-prefetch": ("ours", APP, {"WARMSTART_BACKEND": "torch", "WARMSTART_PREFETCH": "off"}),
    "main_torch": ("ref", APP, {"WARMSTART_BACKEND": "torch"}),
    "floor_torch": ("ours", "bench.handlers.minimal_torch.lambda_handler", {}),
}
TARGETS = [
    # (cache, quota, a, b, max ratio a/b, label)
    ("warm", 1.0, "ours", "floor_ort", 1.05, "warm, 1 vCPU: ours / floor <= 1.05"),
    ("warm", 1.0, "ours", "main", 0.75, "warm, 1 vCPU: ours / main <= 0.75 (>= 25% faster)"),
    ("cold", 1.0, "ours", "floor_ort", 0.85, "cold, 1 vCPU: ours / floor <= 0.85"),
    ("warm", 0.29, "ours", "floor_ort", 1.10, "warm, 0.29 vCPU: ours / floor <= 1.10"),
    ("cold", 0.29, "ours", "floor_ort", 1.10, "cold, 0.29 vCPU: ours / floor <= 1.10"),
]


class Quota:
    """A cgroup v1 cpu group with a CFS quota; a child joins it by writing its pid before exec."""

    def __init__(self) -> None:
        self.path = CGROUP / f"warmstart-bench-{os.getpid()}"
        self.path.mkdir(exist_ok=True)
        (self.path / "cpu.cfs_period_us").write_text("100000")

    def set(self, vcpus: float) -> None:
        (self.path / "cpu.cfs_quota_us").write_text(str(int(vcpus * 100000)))

    def wrap(self, argv: list[str]) -> list[str]:
        # sh joins the group, then execs the runtime: the whole start runs under the quota.
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh", *argv]

    def close(self) -> None:
        with contextlib.suppress(OSError):  # a child still in it (killed, not yet reaped): leave it
            self.path.rmdir()


def evict(paths: Iterable[str]) -> int:
    """Drop the files' clean, unmapped pages from the page cache; returns how many files were touched. (Not
    handler.runtime.startfiles.evict: importing `handler` here would set OPENBLAS_NUM_THREADS in this process,
    and every baseline it starts would inherit it.)"""
    n = 0
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        finally:
            os.close(fd)
    return n


def ref_checkout(ref: str, work: Path) -> Path:
    """`handler/` as on `ref`, extracted (no worktree): today's product for the comparison."""
    out = work / f"ref-{re.sub(r'[^A-Za-z0-9_.-]', '_', ref)}"
    if not (out / "handler" / "app.py").is_file():
        out.mkdir(parents=True, exist_ok=True)
        blob = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "handler"], check=True, capture_output=True)
        with tempfile.TemporaryFile() as f:
            f.write(blob.stdout)
            f.seek(0)
            with tarfile.open(fileobj=f) as tar:
                tar.extractall(out, filter="data")
    return out


def command(
    name: str, quota: float, ref_root: Path | None, ref_model: Path = MODEL
) -> tuple[list[str], dict[str, str], Path]:
    where, handler, extra = VARIANTS[name]
    root = ROOT if where == "ours" else ref_root
    assert root is not None
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WARMSTART_", "OPENBLAS_", "OMP_"))},
        "AWS_LAMBDA_FUNCTION_NAME": "bench",
        "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",  # as Lambda sets it for a cold start
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(QUOTAS.get(quota, int(quota * 1769))),
        "WARMSTART_MODEL": str(MODEL if where == "ours" else ref_model),
        # The code root first: the ref's `handler` package, not this checkout's (installed editable).
        "PYTHONPATH": str(root) if root == ROOT else f"{root}:{ROOT}",
        "HF_HUB_OFFLINE": "1",
        **extra,
    }
    return [sys.executable, "-m", "awslambdaric", handler], env, root


def start(argv: list[str], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    with RuntimeStub() as stub:
        env = {**env, "AWS_LAMBDA_RUNTIME_API": stub.address}
        t0 = time.perf_counter()
        # Its own process group: strace's tracees (and sh's child) are killed with it, or they would hold
        # the output pipe open forever.
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            outcome = stub.invoke(EVENT, timeout=600)
            first_ms = (time.perf_counter() - t0) * 1000
            cpu_ms = cpu_time_ms(proc.pid)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
        logs = proc.communicate()[0].decode(errors="replace")
    if outcome.kind != "response":
        raise RuntimeError(f"{argv}: {outcome.body[:500]!r}\n{logs[-3000:]}")
    init = next((json.loads(line) for line in logs.splitlines() if line.startswith('{"warmstart":"init"')), None)
    return {"first_ms": first_ms, "cpu_ms": cpu_ms, "init": init}


def cpu_time_ms(pid: int) -> float:
    """CPU time the start used so far, all live threads (ns from schedstat): far steadier than wall time on a
    shared host, and under a quota wall time >= CPU time / quota. (Under strace: the tracer's own pid.)"""
    total = 0
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e6


def opened_files(name: str, ref_root: Path | None, ref_model: Path = MODEL) -> set[str]:
    """Every regular file a start of `name` opens (strace), plus the interpreter: what a cold start reads."""
    argv, env, cwd = command(name, 1.0, ref_root, ref_model)
    with tempfile.NamedTemporaryFile(prefix="strace-", suffix=".txt") as trace:
        start(["strace", "-f", "-qq", "-e", "trace=openat,open", "-o", trace.name, *argv], env, cwd)
        text = Path(trace.name).read_text(errors="replace")
    files = {os.path.realpath(sys.executable)}
    for m in re.finditer(r'open(?:at)?\([^"]*"([^"]+)"[^)]*\)\s*=\s*\d+', text):
        path = m.group(1)
        if not path.startswith(("/proc", "/sys", "/dev")) and os.path.isfile(path):
            files.add(os.path.realpath(path))
    return files


def prepare_model(portable: Path = PORTABLE, model: Path = MODEL) -> None:
    """An optimized copy of a packed model (portable files linked, not copied), as an image build makes it:
    every variant reads the same portable files; only warmstart's finds the optimized ones."""
    import shutil

    from infra.pack.optimize import optimize
    from infra.pack.wordpiece import prove

    raw = json.loads((portable / "manifest.json").read_text())
    stamp = model / ".source-manifest.json"
    if stamp.is_file() and stamp.read_text() == json.dumps(raw):
        return
    shutil.rmtree(model, ignore_errors=True)
    model.mkdir(parents=True)
    for name in raw["files"]:
        os.link(portable / name, model / name)
    (model / "manifest.json").write_text(json.dumps(raw))
    optimize(model)
    prove(model)
    stamp.write_text(json.dumps(raw))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quotas", default="0.29,0.58,1.0,1.7")
    ap.add_argument("--caches", default="warm,cold")
    ap.add_argument("--variants", default="ours,main,minimal_ort,floor_ort")
    ap.add_argument("--ref", default="main", help="git ref of today's product (the `main` variants)")
    ap.add_argument("--ref-model", type=Path, default=None, help="packed model the `main` variants read (default ours)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results" / "quota")
    args = ap.parse_args()
    if os.geteuid() != 0 or not CGROUP.is_dir():
        print("needs root and a cgroup v1 cpu controller at /sys/fs/cgroup/cpu", file=sys.stderr)
        return 2
    quotas = [float(q) for q in args.quotas.split(",")]
    caches = args.caches.split(",")
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        print(f"unknown variants {unknown}; valid: {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    prepare_model()
    ref_model = MODEL
    if args.ref_model is not None:
        ref_model = REF_MODEL
        prepare_model(args.ref_model.resolve(), REF_MODEL)
    ref_root = ref_checkout(args.ref, ROOT / "build" / "bench") if any(VARIANTS[n][0] == "ref" for n in names) else None
    # Bytecode compiled once up front, as an image build does (infra/deploy/Dockerfile): no start compiles.
    for tree in [ROOT / "handler", ROOT / "bench" / "handlers", *([ref_root / "handler"] if ref_root else [])]:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree)], check=True)
    evicted: set[str] = set()
    if "cold" in caches:
        for n in names:
            evicted |= opened_files(n, ref_root, ref_model)
        print(f"cold cache: evicting {len(evicted)} files before each cold start", file=sys.stderr)
    quota = Quota()
    runs: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            for q in quotas:
                quota.set(q)
                for cache in caches:
                    for n in names:
                        argv, env, cwd = command(n, q, ref_root, ref_model)
                        if cache == "cold":
                            evict(evicted)
                        else:
                            start(quota.wrap(argv), env, cwd)  # a run just before: everything is cached
                        result = start(quota.wrap(argv), env, cwd)
                        runs.append({"round": r, "quota": q, "cache": cache, "variant": n, **result})
                        print(
                            f"round {r + 1}/{args.rounds} {q:4} vCPU {cache} {n:24s} {result['first_ms']:8.0f} ms",
                            file=sys.stderr,
                        )
    finally:
        quota.close()
    (args.out / "runs.json").write_text(json.dumps(runs, indent=1, default=str))
    table = summarize(runs, quotas, caches, names)
    (args.out / "results.md").write_text(table)
    print(table)
    plot(runs, quotas, caches, names, args.out / "coldstart_quota.png")
    return 0


def med(runs: list[dict[str, Any]], q: float, cache: str, n: str) -> float | None:
    xs = [x["first_ms"] for x in runs if x["quota"] == q and x["cache"] == cache and x["variant"] == n]
    return statistics.median(xs) if xs else None


def summarize(runs: list[dict[str, Any]], quotas: list[float], caches: list[str], names: list[str]) -> str:
    rounds = max((x["round"] for x in runs), default=-1) + 1
    lines = [
        f"Spawn → first embedding (ms), median of {rounds} interleaved rounds; real awslambdaric; "
        f"cgroup v1 CPU quota; host {os.cpu_count()} cores (shared).",
        "",
        "| cache | vCPU (Lambda MB) | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for cache in caches:
        for q in quotas:
            cells = []
            for n in names:
                m = med(runs, q, cache, n)
                xs = [x["first_ms"] for x in runs if x["quota"] == q and x["cache"] == cache and x["variant"] == n]
                cells.append("-" if m is None else f"{m:.0f} ({min(xs):.0f}-{max(xs):.0f})")
            lines.append(f"| {cache} | {q} ({QUOTAS.get(q, '?')}) | " + " | ".join(cells) + " |")
    lines += [
        "",
        "CPU time of the start, spawn → first embedding (ms, median; all threads), the same runs:",
        "",
        "| cache | vCPU | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for cache in caches:
        for q in quotas:
            cells = []
            for n in names:
                xs = [x["cpu_ms"] for x in runs if x["quota"] == q and x["cache"] == cache and x["variant"] == n]
                cells.append(f"{statistics.median(xs):.0f}" if xs else "-")
            lines.append(f"| {cache} | {q} | " + " | ".join(cells) + " |")
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for cache, q, a, b, limit, label in TARGETS:
        ma, mb = med(runs, q, cache, a), med(runs, q, cache, b)
        if ma is None or mb is None:
            continue
        ratio = ma / mb
        lines.append(f"| {label} | {ratio:.2f}x ({ma:.0f} / {mb:.0f} ms) | {'yes' if ratio <= limit else 'NO'} |")
    phases = [x["init"]["phases_ms"] for x in runs if x["variant"] == "ours" and x["init"] and x["quota"] == 1.0]
    if phases:
        keys = list(phases[0])
        lines += [
            "",
            "ours, 1 vCPU, init phases (median ms, warm and cold together): "
            + ", ".join(f"{k} {statistics.median(p.get(k, 0) for p in phases):.1f}" for k in keys),
        ]
    return "\n".join(lines) + "\n"


def plot(runs: list[dict[str, Any]], quotas: list[float], caches: list[str], names: list[str], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (dev extra): no plot", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, len(caches), figsize=(6 * len(caches), 4.5), squeeze=False, sharey=True)
    for ax, cache in zip(axes[0], caches, strict=True):
        for n in names:
            ys = [med(runs, q, cache, n) for q in quotas]
            pts = [(q, y) for q, y in zip(quotas, ys, strict=True) if y is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=n)
        ax.set_title(f"{cache} page cache")
        ax.set_xlabel("vCPU (cgroup CPU quota)")
        ax.set_xticks(quotas)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("spawn → first embedding, median ms")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"plot: {out}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
