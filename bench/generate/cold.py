"""Generation cold start: spawn → first token of warmstart's runtime on a generate pack, beside onnxruntime-genai's
own loop on the same pack (the engine without warmstart around it), under one CPU quota, rounds interleaved.
Needs no llama.cpp (bench/generate/peers.py speed adds it); the pack is peers.py's (`prepare`).

    .venv/bin/python bench/generate/cold.py [--vcpus 1.7] [--rounds 5] [--variants ours,ours-lambda,genai]
        [--ref main] [--model DIR] [--before-model DIR] [--own-cpus] [--cache warm|cold]

variants: ours (handler.app's runtime as an HTTP host or a provisioned Lambda starts it: the warm-up generation at
init), ours-lambda (as Lambda starts it on demand: AWS_LAMBDA_INITIALIZATION_TYPE=on-demand, no init warm-up, the
first request pays the first run), genai (the engine's own loop), and with --ref REF the same two of ours as on
git ref REF (`before-ours`, `before-ours-lambda`: handler/ extracted from REF, bench/runner.py's ref_checkout),
on --before-model where the pack changed too.
Each start is a fresh child (bench/generate/driver.py) in a cgroup of its own with the quota; the figure is spawn →
its first generated token (a 16-token prompt, 1 token), the page cache warm (`--cache cold`: every file of the
start's pack evicted before it, posix_fadvise DONTNEED; the code stays cached). Ours' init phases (the init report's
phases_ms) are kept per start. Ratios are taken within a round against genai, and against before-* with --ref.
--own-cpus raises the groups' cpu.shares (bench.runner.Quota.own): on a host saturated by other jobs a group
otherwise gets about one task's share, so a start whose threads overlap (the engine's load beside the tokenizer's
parse) measures as if it had one CPU; a Lambda's vCPUs are its own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for `bench.runner`

from bench.runner import (
    LAMBDA_MB,
    ROOT,
    Child,
    Results,
    Stat,
    base_env,
    compile_bytecode,
    csv,
    evict,
    fmt_ratio,
    need_root,
    order,
    parser,
    peak_rss_mb,
    quotas,
    ratios,
    ref_checkout,
    table,
)

DRIVER = str(ROOT / "bench" / "generate" / "driver.py")
MARK = "generate-driver:"
PACK = ROOT / "build" / "bench" / "peers-gen" / "qwen3-0.6b" / "ours-int4"
VARIANTS = ("ours", "ours-lambda", "genai")


def child(
    variant: str, model: Path, vcpus: float, threads: int, before: Path | None
) -> tuple[list[str], dict[str, str]]:
    """argv and environment of one variant's driver child."""
    if variant == "genai":
        return [sys.executable, DRIVER, "serve", "genai", "--model", str(model), "--threads", str(threads)], base_env()
    memory = str(LAMBDA_MB.get(vcpus, round(vcpus * 1769)))
    extra = {"WARMSTART_MODEL": str(model), "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": memory}
    if variant.endswith("-lambda"):
        extra |= {"AWS_LAMBDA_FUNCTION_NAME": "bench", "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand"}
    env = base_env(**extra)
    if variant.startswith("before-"):
        assert before is not None
        env["PYTHONPATH"] = f"{before}{os.pathsep}{ROOT}"  # REF's handler/ first, the bench's own code after
    return [sys.executable, DRIVER, "serve", "ours", "--model", str(model)], env


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, rounds=5, out="generate-cold")
    ap.add_argument("--vcpus", type=float, default=1.7)
    ap.add_argument("--threads", type=int, default=1, help="genai's intra-op threads (ours takes the quota's)")
    ap.add_argument("--variants", default="ours,ours-lambda,genai", help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--ref", default=None, help="also run ours as on this git ref (before/after)")
    ap.add_argument("--model", type=Path, default=PACK)
    ap.add_argument("--before-model", type=Path, default=None, help="the before-* variants' pack (default --model)")
    ap.add_argument(
        "--own-cpus",
        action="store_true",
        help="each child's quota its own (cpu.shares raised: the host's other jobs yield, as on a Lambda)",
    )
    ap.add_argument(
        "--cache",
        default="warm",
        choices=("warm", "cold"),
        help="cold: the start's pack evicted from the page cache before each start (the code stays cached)",
    )
    args = ap.parse_args(argv)
    why = need_root()
    if why:
        raise SystemExit(f"bench/generate/cold.py {why}")
    if not (args.model / "manifest.json").is_file():
        raise SystemExit(f"{args.model}: no pack (run `bench/generate/peers.py prepare --pairs int4`)")
    names = csv(args.variants, VARIANTS)
    before = ref_checkout(args.ref) if args.ref else None
    if before is not None:
        names += [f"before-{n}" for n in names if n != "genai"]
    compile_bytecode(ROOT / "handler", *([before / "handler"] if before else []))
    results = Results("generate-cold", {k: str(v) for k, v in vars(args).items()})
    with quotas(*names) as qs:
        for q in qs.values():
            q.set(args.vcpus)
            if args.own_cpus:
                q.own()
        for rnd in range(args.rounds):
            for name in order(names, rnd):
                load = os.getloadavg()[0]
                model = args.before_model if name.startswith("before-") and args.before_model else args.model
                argv_, env = child(name, model, args.vcpus, args.threads, before)
                if args.cache == "cold":
                    evict(str(f) for f in model.iterdir() if f.is_file())
                c = Child(qs[name].wrap(argv_), env, MARK)
                try:
                    rss = peak_rss_mb(c.pid)
                finally:
                    c.close()
                results.add(
                    variant=name,
                    round=rnd,
                    load=load,
                    cold_first_token_ms=c.ready_ms,
                    load_ms=c.hello["load_ms"],
                    peak_rss_mb=rss,
                    init=c.hello.get("init"),
                )
    results.meta["load_end"] = [round(x, 1) for x in os.getloadavg()]
    results.save(args.out, markdown(results.rows, args, names))
    return 0


def markdown(rows: list[dict[str, Any]], args: Any, names: list[str]) -> str:
    loads = Stat.of(r["load"] for r in rows)
    out = [
        f"**{args.vcpus:g} vCPU**{' (each quota its own: cpu.shares raised)' if args.own_cpus else ''}, "
        f"page cache {args.cache}, "
        f"{max(r['round'] for r in rows) + 1} rounds, 1-min load average {loads.fmt(1)}:",
        "",
    ]
    phases = sorted({p for r in rows for p in ((r.get("init") or {}).get("phases_ms") or {})})
    body = []
    for n in names:
        pick = [r for r in rows if r["variant"] == n]
        cells = [n, Stat.of(r["cold_first_token_ms"] for r in pick).fmt(0, " ms")]
        cells.append(Stat.of(r["peak_rss_mb"] for r in pick).fmt(0, " MB"))
        for p in phases:
            xs = [((r.get("init") or {}).get("phases_ms") or {}).get(p) for r in pick]
            cells.append(Stat.of(x for x in xs if x is not None).fmt(0) if any(x is not None for x in xs) else "")
        body.append(cells)
    out += [table(["variant", "spawn → first token", "peak RSS", *(f"{p} ms" for p in phases)], body), ""]
    pairs = [(n, "genai") for n in names if n != "genai" and "genai" in names]
    pairs += [(n, f"before-{n}") for n in names if f"before-{n}" in names]
    out.append(
        table(
            ["ratio (within a round)", "spawn → first token"],
            [[f"{a} / {b}", fmt_ratio(ratios(rows, "cold_first_token_ms", a, b))] for a, b in pairs],
        )
    )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
