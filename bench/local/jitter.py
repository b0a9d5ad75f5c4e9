"""Keep-warm spreading under routing jitter: serverless-plugin-warmup's pings vs `warmstart warm`.

    python bench/local/jitter.py                  # N = 16, jitter 0 / 20 / 50 ms (uniform), 3 rounds each
    python bench/local/jitter.py --n 8 --jitter 0,100 --rounds 5 --dist exponential

Lambda's front end does not deliver N parallel invokes at the same instant. With the local Lambda's
routing jitter on (each invoke waits a random delay first), a ping that answers at once frees its instance
for a ping that arrives later, so N pings reach fewer than N instances. For each jitter: a fresh local
Lambda (max concurrency N, the fixture ping handler), one `warmstart warm` run to make N instances, then
--rounds rounds of each style on the warm pool: serverless-plugin-warmup's payload (N parallel invokes,
no hold: what the plugin sends) and `warmstart warm` (N parallel, each held --hold-ms). Reported:
distinct instances / pings asked, averaged over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from infra.local.config import JITTERS, LocalLambdaConfig  # noqa: E402
from infra.local.server import LocalLambda  # noqa: E402
from warmers.config import Target, WarmerConfig  # noqa: E402
from warmers.fanout import Warmer  # noqa: E402

PING = "tests.fixtures.ping_handler.handler"


def spread(endpoint: str, n: int, style: str, hold_ms: int) -> tuple[int, int]:
    warmer = Warmer(WarmerConfig(endpoint_url=endpoint, hold_ms=hold_ms, max_attempts=1))
    report = warmer.run([Target("warmstart", n, payload_style=style)]).targets[0]  # type: ignore[arg-type]
    return report.distinct, report.asked


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=16, help="pings (and instances) (default: 16)")
    p.add_argument("--jitter", default="0,20,50", help="jitter scales, ms (default: 0,20,50)")
    p.add_argument("--dist", choices=JITTERS, default="uniform", help="jitter distribution (default: uniform)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per style (default: 3)")
    p.add_argument("--hold-ms", type=int, default=250, help="warmstart warm's hold (default: 250)")
    args = p.parse_args()
    print(f"N = {args.n}, jitter {args.dist}, {args.rounds} rounds on a warm pool; distinct / asked")
    print(
        f"{'jitter ms':>9}  {'serverless-plugin-warmup':>25}  {'warmstart warm (hold ' + str(args.hold_ms) + ')':>26}"
    )
    for jitter in (float(j) for j in args.jitter.split(",")):
        config = LocalLambdaConfig(
            port=0, handler=PING, max_concurrency=args.n, jitter_ms=jitter, jitter=args.dist, init_timeout_s=60
        )
        with LocalLambda(config, seed=17) as local:
            spread(local.endpoint, args.n, "warmstart", args.hold_ms)  # make N instances
            plugin = [spread(local.endpoint, args.n, "serverless-plugin-warmup", 0) for _ in range(args.rounds)]
            ours = [spread(local.endpoint, args.n, "warmstart", args.hold_ms) for _ in range(args.rounds)]
        p_mean = statistics.mean(d for d, _ in plugin)
        o_mean = statistics.mean(d for d, _ in ours)
        print(
            f"{jitter:>9g}  {p_mean:>12.1f}/{args.n:<3} ({100 * p_mean / args.n:>4.0f}%)"
            f"  {o_mean:>13.1f}/{args.n:<3} ({100 * o_mean / args.n:>4.0f}%)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
