"""Issue 35 item 3's figures: loading a big generative pack. Spawn → first generated token and peak RSS, on a cold
and a warm page cache, for

- `NAME-builder`: the pack as onnxruntime-genai's builder writes it (tensors end to end in model.onnx.data: ORT
  reads each into a buffer of its own, and prepacks MatMul weights into a second copy at load);
- `NAME-laid`: the same pack through infra.pack.lm_layout (weights at page offsets, mapped in place; the decoder
  saved optimized with prepacked weights, mapped as they are; the start's prefetch reads the recorded ranges while
  the imports run), copied once into build/bench-models/NAME-laid;
- `safetensors`: plain transformers loading of the source directory (AutoModelForCausalLM.from_pretrained,
  float32, its own tokenizer), the reference the issue names.

Per round, in a rotated order (bench/runner.py `order`), each variant starts twice in a fresh child
(bench/generate/driver.py: ready after one generated token) under the same CPU quota: first with its files
evicted from the page cache (posix_fadvise DONTNEED on the pack's or the source's files: the code stays cached, the
weights come from disk), then again at once (warm). Peak RSS is the child's VmHWM once ready; RssFile/RssAnon say
how much of it is mapped file pages (shared with the page cache) and how much the process's own.

Usage: .venv/bin/python bench/generate/load.py --source DIR --pack NAME=DIR[:MB] [--pack ...] [--rounds 3]
       [--vcpus 1.7] [--no-safetensors] [--optimized auto|off]
(MB: the Lambda memory size the KV budget is derived from, default 3008.)
"""

from __future__ import annotations

import json
import shutil
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
    evict,
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
CACHES = ("cold", "warm")


def laid_copy(pack: Path, out: Path) -> Path:
    """`pack` copied to `out` and laid out (prepacked decoder included), once: a stamp holds the source manifest."""
    raw = (pack / "manifest.json").read_text()
    stamp = out / ".source-manifest.json"
    if stamp.is_file() and stamp.read_text() == raw:
        return out
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(pack, out)
    code = (
        "import json, sys; from pathlib import Path; from infra.pack.lm_layout import relayout; "
        "r = relayout(Path(sys.argv[1]), optimize=True); print(json.dumps(r['optimized_reason']))"
    )
    done = subprocess.run([sys.executable, "-c", code, str(out)], env=base_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"laying out {out} failed:\n{done.stderr[-3000:]}")
    print(f"laid out {out}: {done.stdout.strip()}", file=sys.stderr)
    stamp.write_text(raw)
    return out


def rss_split(pid: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in ("RssAnon", "RssFile"):
            out[key.lower() + "_mb"] = int(line.split()[1]) / 1024
    return out


def files_of(path: Path) -> list[str]:
    return [str(p) for p in path.rglob("*") if p.is_file()]


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, rounds=3, out="generate-load")
    ap.add_argument("--source", required=True, type=Path, help="the Hugging Face directory the packs were made from")
    ap.add_argument("--pack", action="append", default=[], help="NAME=DIR[:MB] of a builder-made pack (repeatable)")
    ap.add_argument("--vcpus", type=float, default=1.7)
    ap.add_argument("--no-safetensors", action="store_true", help="leave out the transformers reference")
    ap.add_argument("--optimized", choices=("auto", "off"), default="auto", help="WARMSTART_GENAI_OPTIMIZED (laid)")
    args = ap.parse_args(argv)
    why = need_root()
    if why:
        raise SystemExit(f"bench/generate/load.py {why}")
    dirs: dict[str, Path] = {}
    memory: dict[str, str] = {}
    for spec in args.pack:
        name, _, rest = spec.partition("=")
        path, _, mb = rest.partition(":")
        pack = Path(path).resolve()
        dirs[f"{name}-builder"] = pack
        dirs[f"{name}-laid"] = laid_copy(pack, pack.with_name(pack.name + "-laid"))
        memory[f"{name}-builder"] = memory[f"{name}-laid"] = mb or "3008"
    variants = [*dirs, *([] if args.no_safetensors else ["safetensors"])]
    results = Results("generate-load", {k: str(v) for k, v in vars(args).items()})
    with quotas(*variants) as qs:
        for q in qs.values():
            q.set(args.vcpus)
        for rnd in range(args.rounds):
            for name in order(variants, rnd):
                if name == "safetensors":
                    argv_ = [sys.executable, DRIVER, "serve", "transformers", "--model", str(args.source)]
                    argv_ += ["--threads", str(max(1, round(args.vcpus)))]
                    env = base_env()
                    files = [str(p) for p in args.source.iterdir() if p.is_file()]
                else:
                    model = dirs[name]
                    argv_ = [sys.executable, DRIVER, "serve", "ours", "--model", str(model)]
                    env = base_env(
                        WARMSTART_MODEL=str(model),
                        AWS_LAMBDA_FUNCTION_MEMORY_SIZE=memory[name],
                        WARMSTART_GENAI_OPTIMIZED=args.optimized,
                    )
                    files = files_of(model)
                for cache in CACHES:
                    if cache == "cold":
                        evict(files)
                    child = Child(qs[name].wrap(argv_), env, MARK)
                    try:
                        row: dict[str, Any] = {
                            "variant": name,
                            "cache": cache,
                            "round": rnd,
                            "first_token_ms": child.ready_ms,
                            "load_ms": child.hello["load_ms"],
                            "peak_rss_mb": peak_rss_mb(child.pid),
                            **rss_split(child.pid),
                        }
                    finally:
                        child.close()
                    results.add(**row)
    lines = [
        f"{args.vcpus} vCPU each (a cgroup per variant); spawn → first generated token (a 16-token prompt); "
        "cold: the variant's model files evicted from the page cache first",
        "",
    ]
    header = ["variant", "cache", "spawn → first token", "load", "peak RSS", "RssFile / RssAnon at ready"]
    rows = []
    for name in variants:
        for cache in CACHES:
            m = {"variant": name, "cache": cache}
            rows.append(
                [
                    name,
                    cache,
                    results.stat("first_token_ms", **m).fmt(0, " ms"),
                    results.stat("load_ms", **m).fmt(0, " ms"),
                    results.stat("peak_rss_mb", **m).fmt(0, " MB"),
                    f"{results.stat('rssfile_mb', **m).fmt(0)} / {results.stat('rssanon_mb', **m).fmt(0)} MB",
                ]
            )
    lines += [table(header, rows), ""]
    for name in [v for v in variants if v.endswith("-laid")]:
        base = name.removesuffix("-laid") + "-builder"
        others = [base] + ([] if args.no_safetensors else ["safetensors"])
        for other in others:
            for cache in CACHES:
                t = fmt_ratio(ratios(results.rows, "first_token_ms", name, other, cache=cache))
                r = fmt_ratio(ratios(results.rows, "peak_rss_mb", name, other, cache=cache))
                lines.append(f"- {name} / {other}, {cache} cache: first token {t}, peak RSS {r}")
    results.save(Path(args.out), "\n".join(lines) + "\n")
    print(json.dumps({"load": results.meta["load"]}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
