"""Figures for graceful shutdown: SIGTERM on `python -m handler` with N requests running and M queued.

    .venv/bin/python bench/load/drain.py [--running 2] [--queued 6] [--sleep-s 1.5] [--drain-s 8] [--repeat 3]

Prints, per run, each answer's status and its time after the signal, and the process's exit time; the
issue's targets: queued all 503 JSON within 100 ms, in-flight all 200, exit within drain + 1 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.fixtures import drain_scenario  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--running", type=int, default=2)
    p.add_argument("--queued", type=int, default=6)
    p.add_argument("--sleep-s", type=float, default=1.5, help="how long each request runs")
    p.add_argument("--drain-s", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    print("| run | in-flight (status, ms after SIGTERM) | queued: statuses | queued: max ms after SIGTERM | exit ms |")
    print("|---|---|---|---|---|")
    worst_queued, exits = [], []
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            out = drain_scenario.run(Path(tmp), args.running, args.queued, args.sleep_s, args.drain_s)
        running, queued = out.answers[: args.running], out.answers[args.running :]
        q_ms = max(out.after_signal_ms(a) for a in queued)
        worst_queued.append(q_ms)
        exits.append(out.exit_ms)
        flights = ", ".join(f"{a.status} @ {out.after_signal_ms(a):.0f}" for a in running)
        statuses = sorted({a.status for a in queued})
        print(f"| {i + 1} | {flights} | {len(queued)} x {statuses} | {q_ms:.1f} | {out.exit_ms:.0f} |")
    print(
        f"\nqueued answered within {statistics.median(worst_queued):.1f} ms (median of worst), "
        f"exit {statistics.median(exits):.0f} ms after SIGTERM (drain {args.drain_s} s, requests {args.sleep_s} s)"
    )


if __name__ == "__main__":
    main()
