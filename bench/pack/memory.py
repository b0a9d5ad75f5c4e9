"""What `pack --from` costs in time and peak memory, before and after a change (issue 25: the program export;
issue 26 item 2: bounded pack memory, <= 2.5x the weights at peak).

  before   git ref --ref (default main), extracted with `git archive` into build/bench-ref-COMMIT (or --before DIR)
  after    this checkout

Models (--model; bench/pack/models.py, random weights from transformers' config classes, built once under
build/bench-models/, never downloaded):
  bert-base             hidden 768, 12 layers, 12 heads, intermediate 3072, vocab 30522, 512 positions; 109M
                        parameters, 438 MB of float32; Transformer -> mean Pooling -> Normalize, max_seq_length 256,
                        a WordPiece tokenizer of 30522 tokens
  qwen3-embedding-0.6b  Qwen3-Embedding-0.6B's config (28 layers, hidden 1024, GQA 16/8, vocab 151,669); 596M
                        parameters, 2.4 GB of float32; last-token pooling + normalize
Each round runs both checkouts' CLI, interleaved (the order alternating), each as

  /usr/bin/time -v python -m infra.cli pack --from DIR --out OUT --force [--pack-args]

in its own directory (PYTHONPATH set to it), and reads `Maximum resident set size` and `Elapsed (wall clock)`.
Medians over --rounds (min..max in brackets); peak / weights is the median peak over the safetensors file's size.
--limit-mb kills a pack whose process tree passes that resident size (reported as inf): the old path's 0.6B pack
would not fit a shared machine.

A pack that fails is reported with its peak until then (elapsed nan): main's 0.6B pack fails, protobuf cannot
serialize the 2.4 GB graph it holds in memory.

Usage: .venv/bin/python bench/pack/memory.py [--rounds 3] [--model bert-base] [--ref main | --before DIR]
       [--only before|after] [--limit-mb 12000] [--pack-args '--backends onnx']
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.pack.models import BUILDERS, cached  # noqa: E402

_RSS = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")
_ELAPSED = re.compile(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)")


def pack_measured(
    checkout: Path,
    source: Path,
    out: Path,
    extra: list[str] | None = None,
    limit_mb: float | None = None,
    failure_ok: bool = False,
) -> tuple[float, float]:
    """One `pack --from` in a fresh process from `checkout`: (elapsed s, peak RSS MB). `limit_mb`: the pack is
    killed when its resident memory passes it (a shared machine), the peak then reported as inf. `failure_ok`:
    a pack that fails is reported (elapsed nan, its peak until then) rather than ending the bench."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "HF_HUB_OFFLINE": "1"}
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "infra.cli", "pack"]
    cmd += ["--from", str(source), "--out", str(out), "--force", *(extra or [])]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = False
    if limit_mb is not None:
        while proc.poll() is None:
            if _tree_rss_mb(proc.pid) > limit_mb:
                _kill_tree(proc.pid)
                killed = True
                break
            time.sleep(0.05)
    _, stderr = proc.communicate()
    if killed:
        print(f"{checkout}: pack killed past {limit_mb:,.0f} MB", file=sys.stderr)
        return time.perf_counter() - started, float("inf")
    rss, elapsed = _RSS.search(stderr), _ELAPSED.search(stderr)
    if proc.returncode != 0:
        if not failure_ok or rss is None:
            raise SystemExit(f"{checkout}: pack failed ({proc.returncode}):\n{stderr[-3000:]}")
        # The old path's 0.6B pack: protobuf cannot serialize the 2.4 GB graph it holds (a result, not a crash).
        last = [line for line in stderr.splitlines() if line and not line.startswith(("\t", "Command"))][-1:]
        print(f"{checkout}: pack failed after {time.perf_counter() - started:.0f} s, peak "
              f"{int(rss.group(1)) / 1024:,.0f} MB: {' '.join(last)[:300]}", file=sys.stderr)  # fmt: skip
        return float("nan"), int(rss.group(1)) / 1024
    if rss is None or elapsed is None:
        raise SystemExit(f"no /usr/bin/time -v figures in:\n{stderr[-2000:]}")
    hours, minutes, seconds = elapsed.groups()
    return int(hours or 0) * 3600 + int(minutes) * 60 + float(seconds), int(rss.group(1)) / 1024


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    kids = [int(k) for k in text.split()]
    return kids + [g for k in kids for g in _children(k)]


def _tree_rss_mb(pid: int) -> float:
    total = 0.0
    for p in [pid, *_children(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            pass
    return total


def _kill_tree(pid: int) -> None:
    for p in reversed([pid, *_children(pid)]):
        with contextlib.suppress(OSError):
            os.kill(p, 9)


def _cell(values: list[float], digits: int) -> str:
    return f"{statistics.median(values):,.{digits}f} ({min(values):,.{digits}f}..{max(values):,.{digits}f})"


def checkout_of(ref: str) -> Path:
    """build/bench-ref-REF: `git archive REF` extracted (no worktree), made once."""
    commit = subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, capture_output=True, text=True, check=True)
    where = ROOT / "build" / f"bench-ref-{commit.stdout.strip()}"
    if not (where / "infra" / "cli").is_dir():
        where.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", choices=sorted(BUILDERS), default="bert-base", help="(default: %(default)s)")
    parser.add_argument("--ref", default="main", help="git ref measured as 'before' (default: %(default)s)")
    parser.add_argument("--before", type=Path, help="a checkout to measure as 'before' instead of --ref's")
    parser.add_argument("--after", type=Path, default=ROOT, help="checkout to measure (default: this one)")
    parser.add_argument("--limit-mb", type=float, help="kill a pack past this resident size (reported as >limit)")
    parser.add_argument("--pack-args", default="", help="more pack flags for both, e.g. '--backends onnx'")
    parser.add_argument("--only", choices=("before", "after"), help="measure one side only")
    args = parser.parse_args(argv)
    variants: dict[str, Path] = {}
    if args.only != "after":
        before = args.before.resolve() if args.before else checkout_of(args.ref)
        variants[f"before ({args.before or args.ref})"] = before
    if args.only != "before":
        variants["after (this checkout)"] = args.after.resolve()
    for name, checkout in variants.items():
        if not (checkout / "infra" / "cli").is_dir():
            raise SystemExit(f"{name}: {checkout} is not a warmstart checkout")
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    started = time.perf_counter()
    source = cached(args.model)
    weights = (source / "model.safetensors").stat().st_size / 2**20
    took = time.perf_counter() - started
    print(f"{args.model}: {source} ({weights:,.0f} MB of weights), {took:.1f} s", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bench-pack-", dir=ROOT / "build") as tmp:
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in order:
                out = Path(tmp) / f"out-{r}-{list(variants).index(name)}"
                elapsed, rss = pack_measured(
                    variants[name], source, out, args.pack_args.split(), args.limit_mb, failure_ok=True
                )
                results[name].append((elapsed, rss))
                print(f"round {r + 1} {name}: {elapsed:.1f} s, {rss:,.0f} MB", file=sys.stderr)
                shutil.rmtree(out, ignore_errors=True)
    rows: list[dict[str, Any]] = []
    print(f"| pack --from ({args.model}, {weights:,.0f} MB of weights) | elapsed s, median (min..max) "
          "| peak RSS MB, median (min..max) | peak / weights |")  # fmt: skip
    print("|---|---|---|---|")
    for name, runs in results.items():
        times, peaks = [t for t, _ in runs], [m for _, m in runs]
        rows.append({"variant": name, "elapsed_s": times, "peak_rss_mb": peaks, "weights_mb": weights})
        ratio = statistics.median(peaks) / weights
        failed = " (failed: peak until then)" if any(t != t for t in times) else ""  # nan: the pack failed
        print(f"| {name}{failed} | {_cell(times, 1)} | {_cell(peaks, 0)} | {ratio:.2f}x |")
    print(json.dumps(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
