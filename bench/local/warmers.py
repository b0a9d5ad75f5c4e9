"""Does the warmer reach N distinct instances, and how long does a warm run take?

    python bench/local/warmers.py                 # fixture ping handler (tests/fixtures/ping_handler.py)
    python bench/local/warmers.py --real          # handler.app.lambda_handler on models/default

For N = 4, 8, 16, on a fresh local Lambda (max concurrency = N, so a single stray placement shows as a
shortfall rather than hiding in spare capacity): one cold run, then --repeat warm runs. Reported: distinct /
asked (target 100%), cold instances, and warm-run wall time against the budget hold_ms + 300 ms (the target
for N = 8 once instances exist). The local Lambda runs in this process, on its own thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from infra.local.config import LocalLambdaConfig  # noqa: E402
from infra.local.server import LocalLambda  # noqa: E402
from warmers.config import Target, WarmerConfig  # noqa: E402
from warmers.fanout import Warmer  # noqa: E402

PING = "tests.fixtures.ping_handler.handler"
REAL = "handler.app.lambda_handler"


def bench(n: int, *, handler: str, hold_ms: int, repeat: int) -> list[str]:
    config = LocalLambdaConfig(port=0, handler=handler, max_concurrency=n, timeout_s=60, init_timeout_s=60)
    rows = []
    with LocalLambda(config) as local:
        warmer = Warmer(WarmerConfig(endpoint_url=local.endpoint, hold_ms=hold_ms))
        cold = warmer.run([Target(config.function_name, n)]).targets[0]
        rows.append(
            f"{n:>3}  {'cold':<5} {cold.distinct:>3}/{cold.asked:<3} {100 * cold.distinct / n:>5.0f}%  {cold.cold:>4}"
            f"  {cold.duration_ms:>8.0f}  {'-':>8}  {'-':>6}  {len(cold.errors):>6}"
        )
        walls, reached, errors = [], [], 0
        for _ in range(repeat):
            warm = warmer.run([Target(config.function_name, n)]).targets[0]
            walls.append(warm.duration_ms)
            reached.append(warm.distinct)
            errors += len(warm.errors)
        budget = hold_ms + 300
        verdict = "ok" if max(walls) <= budget else "OVER"
        rows.append(
            f"{n:>3}  {'warm':<5} {min(reached):>3}/{n:<3} {100 * min(reached) / n:>5.0f}%  {0:>4}"
            f"  {statistics.median(walls):>8.0f}  {max(walls):>8.0f}  {budget:>6}  {errors:>6}  {verdict}"
        )
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--real", action="store_true", help="the real handler (needs models/default)")
    p.add_argument("--hold-ms", type=int, default=250)
    p.add_argument("--repeat", type=int, default=5, help="warm runs per N (default: 5)")
    p.add_argument("--sizes", default="4,8,16")
    args = p.parse_args()
    handler = REAL if args.real else PING
    print(f"warmer on the local Lambda: handler {handler}, hold_ms {args.hold_ms}, {args.repeat} warm runs per N")
    print(
        f"{'N':>3}  {'run':<5} {'reached':>7} {'pct':>6}  {'cold':>4}  {'p50 ms':>8}  {'max ms':>8}  {'budget':>6}"
        f"  {'errors':>6}"
    )
    for n in (int(s) for s in args.sizes.split(",")):
        for row in bench(n, handler=handler, hold_ms=args.hold_ms, repeat=args.repeat):
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
