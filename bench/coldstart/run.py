"""Cold start: spawn → first embedding through the real awslambdaric, under Lambda-sized CPU quotas, with a warm
or a cold page cache, variants interleaved round by round (bench/runner.py), medians (min-max).

    .venv/bin/python bench/coldstart/run.py [--rounds 5] [--quotas 0.29,0.58,1.0,1.7] [--caches warm,cold]
        [--variants ours,main,minimal_ort,floor_ort] [--ref main] [--ref-model DIR] [--warm-calls 0]

Quotas and the cold cache need root (cgroup v1 `cpu`; posix_fadvise DONTNEED on exactly the files a start
opens, found once per variant with strace); `--quotas none` runs without a cgroup (Lambda's 2 vCPU memory size).
Before any timing, every variant that answers with embeddings is started once and its answer compared with
the first such variant's (floor_ort's when it runs): a variant that answers differently is not timed.
"ours" reads an optimized copy of the default model (`warmstart optimize`, as an image build makes it, under
build/bench); the baselines read the portable files of the same model.

Variants (--variants):
  ours            handler.app on this checkout
  ours+sha        ours with WARMSTART_VERIFY_SHA256=1 (what hashing at init costs)
  main            handler.app as on git ref --ref, same model directory (or --ref-model's): today's product
  main-no-optimized  main on the portable model (WARMSTART_ORT_OPTIMIZED=0)
  minimal_ort     bench/handlers/minimal_ort.py: ONNX Runtime + tokenizers, defaults
  floor_ort       bench/handlers/floor_ort.py: the tuned hand-written floor, on its build step's files
                  (bench/handlers/floor_ort_build.py, made once under build/bench/floor-ort)
  naive_st        bench/handlers/naive_st.py: sentence-transformers loaded at init (10+ s a start)
  ours-no-blas, ours-no-prefetch, ours-no-bundle, ours-no-optimized, ours-no-shortcut, ours+warmup: one
                  switch flipped
  ours_torch, main_torch, floor_torch (minimal_torch.py), ours_torch-no-prefetch: the torch backend
  imports_only_onnx, imports_only_torch: warmstart's imports, no model (the peak-RSS baselines)
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import runner  # noqa: E402

REF_MODEL = ROOT / "build" / "bench" / "ref-model-optimized"  # --ref-model's, prepared the same way
APP = "handler.app.lambda_handler"
BASE = "bench.handlers."

# name -> (code root: "ours" | "ref", handler, extra environment)
VARIANTS: dict[str, tuple[str, str, dict[str, str]]] = {
    "ours": ("ours", APP, {}),
    "ours+sha": ("ours", APP, {"WARMSTART_VERIFY_SHA256": "1"}),
    "main": ("ref", APP, {}),
    "main-no-optimized": ("ref", APP, {"WARMSTART_ORT_OPTIMIZED": "0"}),
    "minimal_ort": ("ours", BASE + "minimal_ort.lambda_handler", {}),
    "floor_ort": ("ours", BASE + "floor_ort.lambda_handler", {}),
    "naive_st": ("ours", BASE + "naive_st.lambda_handler", {}),
    "ours-no-blas": ("ours", APP, {"WARMSTART_BLAS_THREADS": "default"}),
    "ours-no-prefetch": ("ours", APP, {"WARMSTART_PREFETCH": "off"}),
    "ours-no-bundle": ("ours", APP, {"WARMSTART_CODE_BUNDLE": "off"}),
    "ours-no-optimized": ("ours", APP, {"WARMSTART_ORT_OPTIMIZED": "0"}),
    "ours+warmup": ("ours", APP, {"WARMSTART_WARMUP": "1"}),
    "ours-no-shortcut": ("ours", APP, {"WARMSTART_TOKENIZER_SHORTCUT": "0"}),
    "ours_torch": ("ours", APP, {"WARMSTART_BACKEND": "torch"}),
    "ours_torch-no-prefetch": ("ours", APP, {"WARMSTART_BACKEND": "torch", "WARMSTART_PREFETCH": "off"}),
    "main_torch": ("ref", APP, {"WARMSTART_BACKEND": "torch"}),
    "floor_torch": ("ours", BASE + "minimal_torch.lambda_handler", {}),
    "imports_only_onnx": ("ours", BASE + "imports_only_onnx.lambda_handler", {}),
    "imports_only_torch": ("ours", BASE + "imports_only_torch.lambda_handler", {}),
}
FLOOR_BUILT = {"floor_ort"}  # variants that read the floor's build step's files (runner.prepare_floor)
TOLERANCE = 1e-4  # max |a - b| over every embedding component: the same answer, up to float summation order
TARGETS = [
    # (cache, quota, a, b, max ratio a/b, label): issue 38's, against the tuned floor
    ("warm", 1.0, "ours", "floor_ort", 1.0, "warm, 1 vCPU: ours / tuned floor <= 1.0"),
    ("cold", 1.0, "ours", "floor_ort", 0.9, "cold, 1 vCPU: ours / tuned floor <= 0.9"),
    ("warm", 0.5, "ours", "floor_ort", 1.0, "warm, 0.5 vCPU: ours / tuned floor <= 1.0"),
    ("cold", 0.5, "ours", "floor_ort", 0.9, "cold, 0.5 vCPU: ours / tuned floor <= 0.9"),
    ("warm", 1.0, "ours", "main", 0.75, "warm, 1 vCPU: ours / main <= 0.75 (>= 25% faster)"),
    ("warm", None, "naive_st", "ours", None, "no quota: naive_st / ours"),
]


def command(
    name: str, vcpus: float | None, ref_root: Path | None, ref_model: Path
) -> tuple[list[str], dict[str, str], Path]:
    """A variant's argv, environment and working directory, as Lambda starts it at `vcpus`' memory size."""
    where, handler, extra = VARIANTS[name]
    root = ROOT if where == "ours" else ref_root
    assert root is not None
    model = runner.FLOOR if name in FLOOR_BUILT else runner.OPTIMIZED if where == "ours" else ref_model
    env = runner.lambda_env(vcpus or 2.0, model, **extra)
    # The code root first: the ref's `handler` package, not this checkout's (installed editable).
    env["PYTHONPATH"] = str(root) if root == ROOT else f"{root}:{ROOT}"
    return [sys.executable, "-m", "awslambdaric", handler], env, root


def differs(a: bytes, b: bytes, tolerance: float = TOLERANCE) -> str | None:
    """Why two answers (JSON bodies) are not the same embeddings within `tolerance`, or None when they are."""
    ea, eb = (json.loads(x).get("embeddings") for x in (a, b))
    if not isinstance(ea, list) or not isinstance(eb, list):
        return "not both embeddings"
    if [len(v) for v in ea] != [len(v) for v in eb]:
        return f"shapes differ: {[len(v) for v in ea]} vs {[len(v) for v in eb]}"
    worst = max((abs(x - y) for va, vb in zip(ea, eb, strict=True) for x, y in zip(va, vb, strict=True)), default=0.0)
    return None if worst <= tolerance else f"max |difference| {worst:.3g} > {tolerance:g}"


def check_same(names: list[str], ref_root: Path | None, ref_model: Path) -> list[str]:
    """Start each variant once (warm, no quota) and compare its embeddings with the floor's (or the first
    embedding variant's); returns what differs, one line a variant."""
    bodies = {n: runner.lambda_start(*command(n, None, ref_root, ref_model))["body"] for n in names}
    embedders = [n for n in names if b'"embeddings"' in bodies[n]]
    if not embedders:
        return []
    base = "floor_ort" if "floor_ort" in embedders else embedders[0]
    problems = [f"{n} vs {base}: {why}" for n in embedders if (why := differs(bodies[n], bodies[base]))]
    print(f"same answer as {base}: {', '.join(n for n in embedders if n != base) or '-'} checked", file=sys.stderr)
    return problems


def summarize(res: runner.Results, quotas: list[float | None], caches: list[str], names: list[str]) -> str:
    def label(q: float | None) -> str:
        return "none" if q is None else f"{q:g} ({runner.LAMBDA_MB.get(q, '?')} MB)"

    cells = [(c, q) for c in caches for q in quotas]
    parts = []
    for key, what, digits in (
        ("first_ms", "Spawn → first embedding (ms)", 0),
        ("cpu_ms", "CPU time of the start, all threads (ms)", 0),
        ("init_ms", "Init Duration: spawn → the runtime's first `GET /next` (ms)", 0),
        ("peak_rss_mb", "Peak RSS at the first answer (MB)", 0),
        ("warm_ms", "Warm call after the first, round trip through the stub (ms)", 2),
    ):
        if not any(res.stat(key, variant=n).n for n in names):
            continue
        rows = [
            [c, label(q), *(res.stat(key, variant=n, quota=q, cache=c).fmt(digits) for n in names)] for c, q in cells
        ]
        parts += [f"{what}:", "", runner.table(["cache", "vCPU (Lambda MB)", *names], rows), ""]
    target_rows = []
    for cache, q, a, b, limit, text in TARGETS:
        ma, mb = (
            res.stat("first_ms", variant=a, quota=q, cache=cache),
            res.stat("first_ms", variant=b, quota=q, cache=cache),
        )
        if ma.n and mb.n:
            within = runner.ratios(res.pick(quota=q, cache=cache), "first_ms", a, b)
            r = runner.fmt_ratio(within)
            # Judged on the ratio shown (the rounds' median): the ratio of the two medians can fall on the other
            # side of the limit when one side's slow rounds are other rounds than the other's.
            met = "-" if limit is None or not within else ("yes" if runner.Stat.of(within).median <= limit else "NO")
            target_rows.append([text, f"{r} ({ma.median:.0f} / {mb.median:.0f} ms)", met])
    if target_rows:
        parts += [runner.table(["ratio (within rounds)", "measured", "target met"], target_rows), ""]
    phases = [r["init"]["phases_ms"] for r in res.pick(variant="ours") if r.get("init")]
    if phases:
        parts.append(
            "ours, init phases (median ms, all quotas and caches): "
            + ", ".join(f"{k} {statistics.median(p.get(k, 0) for p in phases):.1f}" for k in phases[0])
        )
    return "\n".join(parts)


def main() -> int:
    ap = runner.parser(__doc__, rounds=5, out="coldstart")
    ap.add_argument("--quotas", default="0.29,0.58,1.0,1.7", help="vCPUs, comma-separated, or none")
    ap.add_argument("--caches", default="warm,cold")
    ap.add_argument("--variants", default="ours,main,minimal_ort,floor_ort")
    ap.add_argument("--ref", default="main", help="git ref of today's product (the `main` variants)")
    ap.add_argument("--ref-model", type=Path, default=None, help="packed model the `main` variants read (default ours)")
    ap.add_argument("--warm-calls", type=int, default=0, help="warm calls after each cold start (their median)")
    args = ap.parse_args()
    names = runner.csv(args.variants, VARIANTS)
    caches = runner.csv(args.caches, ("warm", "cold"), "caches")
    quotas: list[float | None] = [None] if args.quotas == "none" else [float(q) for q in args.quotas.split(",")]
    if (any(q is not None for q in quotas) or "cold" in caches) and (why := runner.need_root()):
        print(f"{why} (or --quotas none --caches warm)", file=sys.stderr)
        return 2
    runner.prepare_optimized()
    if FLOOR_BUILT & set(names):
        runner.prepare_floor()
    ref_model = runner.OPTIMIZED
    if args.ref_model is not None:
        ref_model = runner.prepare_optimized(args.ref_model.resolve(), REF_MODEL)
    ref_root = runner.ref_checkout(args.ref) if any(VARIANTS[n][0] == "ref" for n in names) else None
    # Bytecode compiled once up front, as an image build does (infra/deploy/Dockerfile): no start compiles.
    for tree in [ROOT / "handler", ROOT / "bench" / "handlers", *([ref_root / "handler"] if ref_root else [])]:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree)], check=True)
    if problems := check_same(names, ref_root, ref_model):
        print("not timed, the answers differ:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    evicted: set[str] = set()
    if "cold" in caches:
        for n in names:
            evicted |= runner.opened_files(*command(n, 1.0, ref_root, ref_model))
        print(f"cold cache: evicting {len(evicted)} files before each cold start", file=sys.stderr)
    res = runner.Results("bench/coldstart/run.py")
    quota = runner.Quota() if any(q is not None for q in quotas) else None
    try:
        for rnd in range(args.rounds):
            for q in quotas:
                if quota is not None and q is not None:
                    quota.set(q)
                for cache in caches:
                    for n in runner.order(names, rnd):
                        argv, env, cwd = command(n, q, ref_root, ref_model)
                        wrapped = quota.wrap(argv) if quota is not None and q is not None else argv
                        if cache == "cold":
                            runner.evict(evicted)
                        else:
                            runner.lambda_start(wrapped, env, cwd)  # a start just before: everything is cached
                        out: dict[str, Any] = runner.lambda_start(wrapped, env, cwd, warm_calls=args.warm_calls)
                        out.pop("body")
                        res.add(round=rnd, quota=q, cache=cache, variant=n, **out)
    finally:
        if quota is not None:
            quota.close()
    res.save(args.out, summarize(res, quotas, caches, names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
