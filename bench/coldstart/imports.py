"""The import chain of a plain Lambda init (`import handler.app`, one model directory), two checkouts side by
side: how many of warmstart's own modules it loads and what they cost by themselves (`-X importtime` self
times, summed), interleaved round by round; medians. Init itself (session, tokenizer) is in the total, not in
the `handler.*` figure.

Usage: .venv/bin/python bench/coldstart/imports.py --before DIR [--after DIR] [--rounds 15]
(DIR: a checkout, e.g. `git worktree add /tmp/before <ref>`; the model is this checkout's models/default).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)")


def one(tree: Path) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMSTART_")}
    env.update(PYTHONPATH=str(tree), WARMSTART_MODEL=str(ROOT / "models" / "default"), WARMSTART_LOG_LEVEL="ERROR")
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import handler.app"],
        cwd=tree, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    own_us, own_n, top_us = 0, 0, 0
    for m in LINE.finditer(proc.stderr):
        self_us, cumulative, indent, name = int(m[1]), int(m[2]), m[3], m[4]
        # handler.app's own time is init itself (Runtime.start runs in its body): not an import cost.
        if (name == "handler" or name.startswith("handler.")) and name != "handler.app":
            own_us += self_us
            own_n += 1
        if not indent:
            top_us += cumulative
    return {"handler_modules": own_n, "handler_self_ms": own_us / 1000, "all_imports_ms": top_us / 1000}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, default=ROOT)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for name, tree in (("before", args.before), ("after", args.after)):
            runs[name].append(one(tree))
    print(f"{'':8} {'handler modules':>16} {'their own ms (median)':>22} {'import handler.app ms (median)':>31}")
    for name, rows in runs.items():
        n = statistics.median(r["handler_modules"] for r in rows)
        own = statistics.median(r["handler_self_ms"] for r in rows)
        total = statistics.median(r["all_imports_ms"] for r in rows)
        print(f"{name:8} {n:>16.0f} {own:>22.2f} {total:>31.1f}")


if __name__ == "__main__":
    main()
