"""What a cold start reads from disk: spawn → first embedding through awslambdaric (as bench/coldstart/run.py
starts each variant) with every file it opens evicted, then `mincore` over those files: the bytes the start
brought into the page cache, readahead included. Variants interleaved round by round; medians (min-max).

    .venv/bin/python bench/coldstart/reads.py [--rounds 3] [--quotas 1.0] [--variants ours,floor_ort]
        [--model DIR] [--other-model DIR]

"weights MB" is the model's data files (`*.data` under the variant's model directory), "all MB" every file the
start opens. `--model` is the packed, optimized model `ours` variants read (default: run.py's, made by
`warmstart optimize` under build/bench); `--other-model DIR` adds each `ours` variant again as `NAME@other`,
reading DIR (another layout of the same model, made before: it is read as it is), in the same rounds.
`--session`: no Lambda start, only what the layout changes: a child process creates the optimized model's ONNX
Runtime session (one thread, graph optimization off, as init loads it) and runs one embedding, its data file
evicted first (no prefetch); the ms of each and the MB read, for `ours` and `ours@other`. Needs root (eviction,
the CPU quota).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import runner  # noqa: E402
from bench.coldstart import run  # noqa: E402
from handler.runtime.startrecord import PAGE, resident  # noqa: E402


def read_mb(files: set[str], under: Path) -> tuple[float, float]:
    """(MB of the model's data files, MB of every file) resident now."""
    weights = total = 0
    for path in files:
        try:
            n = sum(resident(path)) * PAGE
        except OSError:
            continue
        total += n
        if path.endswith(".data") and Path(path).is_relative_to(under):
            weights += n
    return weights / 2**20, total / 2**20


def out_of(out: dict[str, Any]) -> dict[str, float]:
    return {k: out[k] for k in ("first_ms", "cpu_ms")}


SESSION_CHILD = r"""
import sys, time
import numpy as np, onnxruntime as ort
t0 = time.perf_counter()
options = ort.SessionOptions()
options.intra_op_num_threads = 1
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
t1 = time.perf_counter()
ids = np.array([[101, 1037, 3147, 2707, 2003, 1996, 2051, 2013, 2498, 2000, 1996, 2034, 3437, 1012, 102]], np.int64)
session.run(None, {n.name: ids if n.name == "input_ids" else np.ones_like(ids) for n in session.get_inputs()})
print((t1 - t0) * 1000, (time.perf_counter() - t1) * 1000)
"""


def session_rounds(models: dict[str, Path], quotas: list[float], rounds: int, res: runner.Results) -> None:
    """Each model's session + first run from a cold data file, interleaved round by round."""
    from infra.pack.optimize import OPT_DATA, OPT_FILE

    with runner.Quota() as cgroup:
        for rnd in range(rounds):
            for q in quotas:
                cgroup.set(q)
                for name in runner.order(list(models), rnd):
                    runner.evict(str(m / OPT_DATA) for m in models.values())
                    argv = cgroup.wrap([sys.executable, "-c", SESSION_CHILD, str(models[name] / OPT_FILE)])
                    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
                    session_ms, run_ms = float(out[0]), float(out[1])
                    weights = sum(resident(str(models[name] / OPT_DATA))) * PAGE / 2**20
                    res.add(
                        round=rnd,
                        quota=q,
                        variant=name,
                        session_ms=session_ms,
                        run_ms=run_ms,
                        total_ms=session_ms + run_ms,
                        weights_mb=weights,
                    )


def summarize_sessions(res: runner.Results, quotas: list[float], where: str) -> str:
    keys = (("weights_mb", 1), ("session_ms", 0), ("run_ms", 0), ("total_ms", 0))
    names = ["ours", "ours@other"]
    rows = [[f"{q:g}", n, *(res.stat(k, variant=n, quota=q).fmt(d) for k, d in keys)] for q in quotas for n in names]
    header = ["vCPU", "model", "weights MB", "session ms", "first run ms", "both ms"]
    ratio_rows = [
        [f"{q:g}", *(runner.fmt_ratio(runner.ratios(res.pick(quota=q), k, *names)) for k, _ in keys[1:])]
        for q in quotas
    ]
    ratios = runner.table(["vCPU", "ours / ours@other: session", "first run", "both"], ratio_rows)
    return f"{where}, session + first run only\n\n{runner.table(header, rows)}\n\n{ratios}\n"


def summarize(res: runner.Results, quotas: list[float], names: list[str], where: str) -> str:
    keys = (("weights_mb", 1), ("all_mb", 1), ("first_ms", 0), ("cpu_ms", 0))
    rows = [[f"{q:g}", n, *(res.stat(k, variant=n, quota=q).fmt(d) for k, d in keys)] for q in quotas for n in names]
    header = ["vCPU", "variant", "weights MB", "all MB", "first embedding ms", "CPU ms"]
    pairs = [(x, y) for x in names for y in names if x != y and y in ("floor_ort", f"{x}@other")]
    ratio_rows = [
        [f"{q:g}", f"{x} / {y}", *(runner.fmt_ratio(runner.ratios(res.pick(quota=q), k, x, y)) for k, _ in keys[2:])]
        for q in quotas
        for x, y in pairs
    ]
    ratio_table = runner.table(["vCPU", "within rounds", "first embedding", "CPU"], ratio_rows)
    return f"{where}\n\n{runner.table(header, rows)}\n\n{ratio_table}\n"


def main() -> int:
    ap = runner.parser(__doc__, rounds=3, out="coldstart-reads")
    ap.add_argument("--quotas", default="1.0", help="vCPUs, comma-separated")
    ap.add_argument("--variants", default="ours,floor_ort,ours-no-prefetch")
    ap.add_argument("--model", type=Path, default=None, help="the optimized model `ours` variants read")
    ap.add_argument("--other-model", type=Path, default=None, help="adds the `ours` variants on this model")
    ap.add_argument("--session", action="store_true", help="only the session and its first run, no Lambda start")
    args = ap.parse_args()
    base = runner.csv(args.variants, run.VARIANTS)
    quotas = [float(q) for q in args.quotas.split(",")]
    other = args.other_model.resolve() if args.other_model else None
    names = base + ([f"{n}@other" for n in base if n not in run.FLOOR_BUILT] if other else [])
    if why := runner.need_root():
        print(why, file=sys.stderr)
        return 2
    if any(run.VARIANTS[n][0] == "ref" for n in base):
        print("reads.py compares this checkout's variants only", file=sys.stderr)
        return 2
    runner.prepare_optimized()
    model = args.model.resolve() if args.model else None
    where = f"model {model or runner.OPTIMIZED}" + (f", @other: {other}" if other else "")
    if args.session:
        if other is None:
            print("--session compares two layouts: give --other-model", file=sys.stderr)
            return 2
        res = runner.Results("bench/coldstart/reads.py")
        session_rounds({"ours": model or runner.OPTIMIZED, "ours@other": other}, quotas, args.rounds, res)
        res.save(args.out, summarize_sessions(res, quotas, where))
        return 0
    if run.FLOOR_BUILT & set(names):
        runner.prepare_floor()

    def command(name: str, quota: float) -> tuple[list[str], dict[str, str], Path]:
        variant = name.removesuffix("@other")
        argv, env, cwd = run.command(variant, quota, None, runner.OPTIMIZED)
        if variant not in run.FLOOR_BUILT:
            chosen = other if name.endswith("@other") else model
            if chosen is not None:
                env["WARMSTART_MODEL"] = str(chosen)
        return argv, env, cwd

    runner.compile_bytecode(ROOT / "handler", ROOT / "bench" / "handlers")
    opened = {n: runner.opened_files(*command(n, 1.0)) for n in names}
    every = set().union(*opened.values())
    res = runner.Results("bench/coldstart/reads.py")
    with runner.Quota() as cgroup:
        for rnd in range(args.rounds):
            for q in quotas:
                cgroup.set(q)
                for n in runner.order(names, rnd):
                    argv, env, cwd = command(n, q)
                    runner.evict(every)
                    out: dict[str, Any] = runner.lambda_start(cgroup.wrap(argv), env, cwd)
                    weights, total = read_mb(opened[n], Path(env["WARMSTART_MODEL"]).resolve())
                    res.add(round=rnd, quota=q, variant=n, weights_mb=weights, all_mb=total, **out_of(out))
    res.save(args.out, summarize(res, quotas, names, where))
    return 0


if __name__ == "__main__":
    sys.exit(main())
