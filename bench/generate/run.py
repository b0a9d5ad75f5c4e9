"""Issue 34's figures: a packed chat model served by warmstart against transformers' `generate()` on the same
directory, under the same CPU quota (a cgroup each, 1.7 vCPU: a 3,008 MB Lambda), rounds interleaved.

Per round and variant (the order rotated round by round, bench/runner.py `order`), a fresh long-lived child
(bench/generate/driver.py) under its quota:
- cold: spawn → its first generated token (the child prints its ready line only after one token: imports, model
  load, tokenizer, one prefill and one decode step), and its load time;
- warm: a --prompt-tokens prompt (default 512) with --max-tokens greedy tokens (default 64), twice: time to the
  first token (prefill) and decode tokens/s after it (the second call's);
- peak RSS of the child (VmHWM).
Variants: `ours:NAME=PACK_DIR` (each pack, e.g. float32 and int4) and `transformers` (the source directory,
float32, torch's intra-op threads set to the count warmstart takes from the same quota). The page cache is warm.

The KV budget is derived from AWS_LAMBDA_FUNCTION_MEMORY_SIZE (3,008 MB unless a pack says `NAME=DIR:MB`: a
float32 0.6B model holds 2.9 GB after loading and does not fit 3,008 MB); the CPU quota is --vcpus either way.

Usage: .venv/bin/python bench/generate/run.py --source DIR --pack fp32=DIR[:MB] --pack int4=DIR
       [--rounds 3] [--vcpus 1.7] [--prompt-tokens 512] [--max-tokens 64]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for `bench.runner`

from bench.runner import (
    ROOT,
    Child,
    Results,
    base_env,
    fmt_ratio,
    need_root,
    order,
    parser,
    peak_rss_mb,
    quotas,
    ratios,
    table,
)

DRIVER = str(ROOT / "bench" / "generate" / "driver.py")
MARK = "generate-driver:"


def threads_at(quota: Any, env: dict[str, str]) -> int:
    """The intra-op thread count warmstart takes under `quota` (handler.core.cpu), asked in a child there."""
    code = "from handler.core.cpu import cpu_budget; print(cpu_budget().cpus)"
    out = subprocess.run(quota.wrap([sys.executable, "-c", code]), env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, rounds=3, out="generate")
    ap.add_argument("--source", required=True, help="the Hugging Face directory the packs were made from")
    ap.add_argument("--pack", action="append", default=[], help="NAME=DIR of a packed model (repeatable)")
    ap.add_argument("--vcpus", type=float, default=1.7)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    why = need_root()
    if why:
        raise SystemExit(f"bench/generate/run.py {why}")
    packs = dict(p.split("=", 1) for p in args.pack)
    memory = {n: (d.rsplit(":", 1)[1] if ":" in d else "3008") for n, d in packs.items()}
    packs = {n: d.rsplit(":", 1)[0] if ":" in d else d for n, d in packs.items()}
    variants = [*(f"ours-{n}" for n in packs), "transformers"]
    results = Results("generate", vars(args))
    with quotas(*variants) as qs:
        for q in qs.values():
            q.set(args.vcpus)
        threads = threads_at(qs[variants[0]], base_env())
        for rnd in range(args.rounds):
            for name in order(variants, rnd):
                if name == "transformers":
                    argv_ = [sys.executable, DRIVER, "serve", "transformers", "--model", args.source]
                    argv_ += ["--threads", str(threads)]
                    env = base_env()
                else:
                    model = packs[name.removeprefix("ours-")]
                    argv_ = [sys.executable, DRIVER, "serve", "ours", "--model", model]
                    memory_mb = memory[name.removeprefix("ours-")]
                    env = base_env(WARMSTART_MODEL=model, AWS_LAMBDA_FUNCTION_MEMORY_SIZE=memory_mb)
                child = Child(qs[name].wrap(argv_), env, MARK)
                try:
                    request = {"prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens}
                    child.ask(request)
                    warm = child.ask(request)
                    rss = peak_rss_mb(child.pid)
                finally:
                    child.close()
                results.add(
                    variant=name,
                    round=rnd,
                    cold_first_token_ms=child.ready_ms,
                    load_ms=child.hello["load_ms"],
                    ttft_ms=warm["ttft_ms"],
                    decode_tps=warm["decode_tps"],
                    tokens=warm["tokens"],
                    peak_rss_mb=rss,
                )
                print(
                    name,
                    rnd,
                    f"cold {child.ready_ms:.0f} ms",
                    f"ttft {warm['ttft_ms']:.0f} ms",
                    f"{warm['decode_tps']:.1f} tok/s",
                    f"{rss:.0f} MB",
                    flush=True,
                )
    rows = []
    for name in variants:
        rows.append(
            [
                name,
                results.stat("cold_first_token_ms", variant=name).fmt(0, " ms"),
                results.stat("ttft_ms", variant=name).fmt(0, " ms"),
                results.stat("decode_tps", variant=name).fmt(1),
                results.stat("peak_rss_mb", variant=name).fmt(0, " MB"),
            ]
        )
    lines = [
        f"threads: {threads} (both sides); prompt {args.prompt_tokens} tokens, "
        f"{args.max_tokens} greedy tokens; {args.vcpus} vCPU each",
        "",
        table(
            [
                "variant",
                "spawn → first token",
                f"warm TTFT ({args.prompt_tokens} tokens)",
                "decode tokens/s",
                "peak RSS",
            ],
            rows,
        ),
        "",
    ]
    for name in variants[:-1]:
        for key in ("cold_first_token_ms", "ttft_ms", "decode_tps", "peak_rss_mb"):
            ratio = fmt_ratio(ratios(results.rows, key, name, "transformers"))
            lines.append(f"- {name} / transformers, {key}: {ratio}")
    markdown = "\n".join(lines) + "\n"
    results.save(Path(args.out), markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
