"""`warmstart warm`: ping N instances of each target at once and prove how many distinct ones answered."""

from __future__ import annotations

import argparse
import os
import sys

from warmers.config import MAX_CONCURRENCY, PAYLOAD_STYLES, ConfigError, WarmerConfig, integer, parse_targets


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("warm", help="keep-warm pings: N parallel, held, verified by distinct instance ids")
    p.add_argument("--function", action="append", required=True, help="function name or ARN (repeatable)")
    p.add_argument("--concurrency", type=int, default=1, help="instances to warm per function (default: 1)")
    p.add_argument("--qualifier", help="version or alias (warm what traffic reaches, not $LATEST)")
    p.add_argument("--endpoint-url", default=os.environ.get("WARMSTART_ENDPOINT"), help="e.g. the local Lambda")
    p.add_argument("--region", help="AWS region (default: the environment's)")
    p.add_argument("--hold-ms", type=int, default=250, help="how long each ping keeps its instance busy")
    p.add_argument("--payload-style", default="warmstart", help=f"one of {', '.join(PAYLOAD_STYLES)}")
    p.add_argument("--prewarm", action="store_true", help="after a deploy: every target once at full concurrency")
    p.add_argument("--history", help='adaptive N: "cloudwatch" or a JSON history file (--concurrency is the ceiling)')
    p.add_argument("--floor", type=int, default=1, help="adaptive N at least this (default: 1)")
    p.add_argument("--percentile", type=float, default=95.0, help="adaptive N percentile (default: 95)")
    p.add_argument("--max-attempts", type=int, default=4, help="attempts per ping, throttles included (default: 4)")
    p.add_argument("--read-timeout", type=float, default=30.0, help="seconds (default: 30)")
    p.add_argument("--connect-timeout", type=float, default=2.0, help="seconds (default: 2)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=run_warm)


def run_warm(args: argparse.Namespace) -> int:
    from warmers.adaptive import Policy, chooser, history_from
    from warmers.fanout import Warmer

    try:
        concurrency = integer("--concurrency", args.concurrency, 1, MAX_CONCURRENCY)
        targets = parse_targets(
            args.function, concurrency=concurrency, qualifier=args.qualifier, style=args.payload_style
        )
        config = WarmerConfig(
            targets=targets,
            hold_ms=args.hold_ms,
            endpoint_url=args.endpoint_url,
            region=args.region,
            connect_timeout_s=args.connect_timeout,
            read_timeout_s=args.read_timeout,
            max_attempts=args.max_attempts,
            history=args.history,
            floor=args.floor,
            percentile=args.percentile,
        )
    except ConfigError as exc:
        print(f"warmstart warm: {exc}", file=sys.stderr)
        return 2
    history = history_from(config)
    pick = chooser(history, Policy.from_config(config)) if history is not None else None
    report = Warmer(config).run(chooser=pick, prewarm=args.prewarm)
    print(report.to_json() if args.json else report.format_table(), flush=True)
    return 0 if report.ok else 1
