"""Issue 35's memory target: where a generate pack's resident memory goes, and its peak against
weights + the request's KV cache + 150 MB.

Per round, in rotated order (bench/runner.py `order`), each variant (an environment for the child) starts a fresh
bench/generate/driver.py `serve ours` under a 1.7 vCPU cgroup quota, as Lambda starts a 3,008 MB function (page
cache warm). At ready (one generated token of a 16-token prompt) and again after a --prompt-tokens prompt with
--max-tokens greedy tokens, the child's /proc/PID/smaps is read and split into

- `file`: pages mapped from files (the pack's weights: page cache shared, not the process's own copy),
- `anon`: the process's own memory (ORT's buffers, prepacked copies, the KV cache, Python and its imports),

each with its largest mappings (the pack's files by name; anonymous mappings by size class), and VmHWM (peak RSS),
after the first request and after the last of --requests (a warm instance's growth).
The target is the pack's weight bytes (the portable decoder's `model.onnx.data`: the weights once, as packed) +
the request's KV cache (2 x layers x kv heads x head dim x 4 bytes x (prompt +
max tokens), the manifest's `kv` facts) + 150 MB (MB here: MiB, as /proc reports them).

Usage: .venv/bin/python bench/generate/rss.py --pack DIR [--variant NAME=ENV=VALUE[,ENV=VALUE...]] [--rounds 3]
       [--prompt-tokens 512] [--max-tokens 64] [--vcpus 1.7] [--requests 1]
(with no --variant: `default`, the pack as the runtime opens it.) A variant's `PACK=DIR` serves that pack instead
of --pack (its target from its own weights): two packs' rounds interleaved, e.g. `--variant
main=PYTHONPATH=/work/main,PACK=DIR`.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for `bench.runner`

from bench.runner import ROOT, Child, Results, lambda_env, need_root, order, parser, peak_rss_mb, quotas, table

DRIVER = str(ROOT / "bench" / "generate" / "driver.py")
MARK = "generate-driver:"
MB = 2**20
_VMA = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")
SLACK_MB = 150
KV_ITEMSIZE = {"float32": 4, "float16": 2}


def split_smaps(text: str) -> dict[str, Any]:
    """RSS (MB) of a /proc/PID/smaps text split into file-backed and anonymous pages, with the largest mappings
    (a file by its name, anonymous memory as [heap] / [anon] / [stack])."""
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # name -> [rss, anonymous]
    name = ""
    for line in text.splitlines():
        head = line.split()
        if not head:
            continue
        if _VMA.match(line):
            path = head[5] if len(head) > 5 else ""
            name = Path(path).name if path.startswith("/") else (path or "[anon]")
        elif head[0] == "Rss:":
            by_name[name][0] += int(head[1]) / 1024
        elif head[0] == "Anonymous:":
            by_name[name][1] += int(head[1]) / 1024
    rss = sum(v[0] for v in by_name.values())
    anon = sum(v[1] for v in by_name.values())
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:6]
    return {"rss_mb": rss, "anon_mb": anon, "file_mb": rss - anon, "top": {k: round(v[0]) for k, v in top}}


def smaps(pid: int) -> dict[str, Any]:
    return split_smaps(Path(f"/proc/{pid}/smaps").read_text())


def parse_variant(spec: str) -> tuple[str, dict[str, str]]:
    """NAME=ENV=VALUE[,ENV=VALUE...] (NAME= alone: no extra environment) -> (NAME, environment)."""
    name, sep, rest = spec.partition("=")
    pairs = [kv.split("=", 1) for kv in rest.split(",") if kv]
    if not name or not sep or any(len(p) != 2 or not p[0] for p in pairs):
        raise SystemExit(f"--variant {spec!r}: expected NAME=ENV=VALUE[,ENV=VALUE...] or NAME=")
    return name, dict((k, v) for k, v in pairs)


def target_mb(pack: Path, tokens: int) -> dict[str, float]:
    """The weights' bytes (the portable decoder's data files: the weights once, as packed; the optimized decoder's
    data file holds the builder's originals beside the prepacked copies) + the KV cache of `tokens` + SLACK_MB."""
    manifest = json.loads((pack / "manifest.json").read_text())
    files = manifest["backends"]["genai"]["files"]
    weights = sum((pack / f).stat().st_size for f in files if not f.endswith((".json", ".onnx")))
    kv = manifest["generation"]["kv"]
    kv_bytes = 2 * kv["layers"] * kv["kv_heads"] * kv["head_dim"] * KV_ITEMSIZE[kv.get("dtype", "float32")] * tokens
    return {"weights_mb": weights / MB, "kv_mb": kv_bytes / MB, "target_mb": (weights + kv_bytes) / MB + SLACK_MB}


def evict(pack: Path) -> None:
    """Every file of `pack` evicted from the page cache before any round, so the first start fills it as an
    instance's start does (its prefetch, the load's reads and faults) and the later rounds find what that start
    left. The pages a fault maps depend on how the file came into the cache: a fault on a large folio maps all of
    it, so the tied embedding's rows cost ~2 MiB after a start filled the cache and 18-20 MiB after a `cat` or a
    fresh write of the file (docs/benchmarks.md, "The 8-bit head in blocks of 128"). The first round's times
    include the disk."""
    for path in sorted(p for p in pack.iterdir() if p.is_file()):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # a pack just written: its dirty pages cannot be evicted
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, rounds=3, out="generate-rss")
    ap.add_argument("--pack", required=True, type=Path, help="a packed generate model")
    ap.add_argument("--variant", action="append", default=[], help="NAME=ENV=VALUE[,ENV=VALUE...] (repeatable)")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--vcpus", type=float, default=1.7)
    ap.add_argument("--requests", type=int, default=1, help="requests after ready (the peak after the first and last)")
    args = ap.parse_args(argv)
    why = need_root()
    if why:
        raise SystemExit(f"bench/generate/rss.py {why}")
    variants: dict[str, dict[str, str]] = {"default": {}} if not args.variant else {}
    for spec in args.variant:
        name, env = parse_variant(spec)
        variants[name] = env
    pack = args.pack.resolve()
    results = Results("generate-rss", {k: str(v) for k, v in vars(args).items()})
    tokens = args.prompt_tokens + args.max_tokens
    served_packs = {Path(env["PACK"]).resolve() if "PACK" in env else pack for env in variants.values()}
    for each in sorted(served_packs):
        evict(each)
    with quotas(*variants) as qs:
        for q in qs.values():
            q.set(args.vcpus)
        for rnd in range(args.rounds):
            for name in order(list(variants), rnd):
                own = dict(variants[name])
                served = Path(own.pop("PACK")).resolve() if "PACK" in own else pack
                env = lambda_env(args.vcpus, served, **own)
                argv_ = [sys.executable, DRIVER, "serve", "ours", "--model", str(served)]
                child = Child(qs[name].wrap(argv_), env, MARK)
                try:
                    ready = smaps(child.pid)
                    ready_peak = peak_rss_mb(child.pid)
                    done = child.ask({"prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens})
                    first_peak = peak_rss_mb(child.pid)
                    for _ in range(args.requests - 1):  # the same request again: what a warm instance keeps growing
                        child.ask({"prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens})
                    after = smaps(child.pid)
                    peak = peak_rss_mb(child.pid)
                finally:
                    child.close()
                used = ((child.hello.get("init") or {}).get("coldstart") or {}).get("genai_optimized") or {}
                row = results.add(
                    variant=name,
                    round=rnd,
                    first_token_ms=child.ready_ms,
                    ttft_ms=done["ttft_ms"],
                    ttft_cpu_ms=done.get("ttft_cpu_ms", math.nan),  # a driver from before it: not known
                    decode_tps=done["decode_tps"],
                    tokens=done["tokens"],
                    ready_peak_mb=ready_peak,
                    ready_file_mb=ready["file_mb"],
                    ready_anon_mb=ready["anon_mb"],
                    first_peak_mb=first_peak,
                    peak_rss_mb=peak,
                    file_mb=after["file_mb"],
                    anon_mb=after["anon_mb"],
                    top=after["top"],
                    optimized=bool(used.get("used")),
                    pack=str(served),
                    **target_mb(served, tokens),
                )
                print(json.dumps(row), file=sys.stderr)
    lines = [
        f"{args.vcpus} vCPU (a cgroup per variant), AWS_LAMBDA_FUNCTION_MEMORY_SIZE for it; ready: one generated "
        f"token of a 16-token prompt; then {args.requests} x a {args.prompt_tokens}-token prompt and {args.max_tokens} "
        "greedy tokens; "
        f"target = weights + KV of {tokens} tokens + {SLACK_MB} MB",
        "",
    ]
    header = [
        "variant",
        "first token (spawn)",
        "peak RSS at ready",
        "file / anon at ready",
        "peak RSS after the first",
        "peak RSS after",
        "file / anon after",
        "target",
        "TTFT",
        "TTFT CPU",
        "decode tok/s",
    ]
    rows = []
    for name in variants:
        s = results.stat
        rows.append(
            [
                name,
                s("first_token_ms", variant=name).fmt(0, " ms"),
                s("ready_peak_mb", variant=name).fmt(0, " MB"),
                f"{s('ready_file_mb', variant=name).fmt(0)} / {s('ready_anon_mb', variant=name).fmt(0)} MB",
                s("first_peak_mb", variant=name).fmt(0, " MB"),
                s("peak_rss_mb", variant=name).fmt(0, " MB"),
                f"{s('file_mb', variant=name).fmt(0)} / {s('anon_mb', variant=name).fmt(0)} MB",
                s("target_mb", variant=name).fmt(0, " MB"),
                s("ttft_ms", variant=name).fmt(0, " ms"),
                s("ttft_cpu_ms", variant=name).fmt(0, " ms"),
                s("decode_tps", variant=name).fmt(1),
            ]
        )
    lines += [table(header, rows), ""]
    results.save(Path(args.out), "\n".join(lines) + "\n")
    print(json.dumps({"load": results.meta["load"]}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
