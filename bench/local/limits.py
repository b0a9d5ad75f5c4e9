"""The local Lambda's limits, measured: CPU quota per memory size, Runtime API guard cost, cold-start storms.

    python bench/local/limits.py quota            # CPU-bound wall time at 512 / 1769 MB vs the quota ratio
    python bench/local/limits.py guard [--n 500]  # the Runtime API peer check, per invocation (target <= 0.2 ms)
    python bench/local/limits.py storm [--n 40] [--real]   # N simultaneous cold starts, paced vs not

quota: the fixture handler burns 200 ms of CPU time; its wall time is that divided by the instance's quota
(memory/1,769 vCPU) once the work outlasts a 100 ms CFS period. guard: warm invocations through a local
Lambda with the guard on; the time the guard spent, divided by invocations (it runs once per connection,
and awslambdaric keeps one), and the median round trip with the guard on and off, interleaved. storm: N
invocations at once on a cold function: with init slots (default) and with every init started at once
(`--init-slots N`, the old behaviour), how many succeed and the wall time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from infra.cli.local import lambda_client  # noqa: E402
from infra.local.config import LocalLambdaConfig  # noqa: E402
from infra.local.server import LocalLambda  # noqa: E402
from tests.fixtures.local_support import invoke  # noqa: E402

ECHO = "tests.fixtures.handlers.echo"
REAL = "handler.app.lambda_handler"


def quota(_args: argparse.Namespace) -> None:
    print("memory   quota vCPU   CPU ms   wall ms (median of 5)   wall/CPU   expected")
    for memory in (512, 1769):
        config = LocalLambdaConfig(port=0, handler=ECHO, memory_mb=memory, max_concurrency=1, init_timeout_s=60)
        with LocalLambda(config) as local:
            client = lambda_client(local.endpoint)
            invoke(client, {})
            walls = [invoke(client, {"burn_cpu_ms": 200})[1]["wall_ms"] for _ in range(5)]
            vcpus = min(memory / 1769, 1.0)
            line = f"{memory:>6}   {memory / 1769:>10.2f}   {200:>6}   {statistics.median(walls):>21.0f}"
            print(f"{line}   {statistics.median(walls) / 200:>8.2f}   {1 / vcpus:>8.2f}")
            print(f"         ({local.pool.cgroups.describe(memory).split(';')[0]})")


def guard(args: argparse.Namespace) -> None:
    rounds: dict[bool, list[float]] = {True: [], False: []}
    spent = checks = invocations = 0.0
    locals_ = {
        on: LocalLambda(LocalLambdaConfig(port=0, handler=ECHO, max_concurrency=1, runtime_api_guard=on))
        for on in (True, False)
    }
    clients = {on: lambda_client(local.start()) for on, local in locals_.items()}
    try:
        for on in (True, False):
            invoke(clients[on], {})
        for _ in range(args.n):
            for on in (True, False):
                started = time.perf_counter()
                invoke(clients[on], {})
                rounds[on].append((time.perf_counter() - started) * 1000)
        for inst in locals_[True].pool.instances.values():
            spent += inst.server.guard_seconds
            checks += inst.server.checked
            invocations += inst.invocations
    finally:
        for local in locals_.values():
            local.stop()
    per_check = spent / checks * 1000 if checks else 0.0
    print(f"guard checks: {checks:.0f} for {invocations:.0f} invocations (one per connection)")
    print(f"guard time per check: {per_check:.3f} ms; per invocation: {spent / invocations * 1000:.4f} ms")
    on, off = statistics.median(rounds[True]), statistics.median(rounds[False])
    print(f"warm round trip (boto3, median of {args.n}): guard on {on:.2f} ms, off {off:.2f} ms ({on - off:+.2f} ms)")


def storm(args: argparse.Namespace) -> None:
    handler = REAL if args.real else ECHO
    print(f"{args.n} simultaneous cold starts of {handler} on this host, {args.memory} MB, init limit 10 s")
    for label, slots in (("init slots (default)", 0), (f"all at once (--init-slots {args.n})", args.n)):
        config = LocalLambdaConfig(
            port=0, handler=handler, memory_mb=args.memory, max_concurrency=args.n, init_slots=slots, timeout_s=120
        )
        with LocalLambda(config) as local:
            client = lambda_client(local.endpoint, read_timeout=300)
            event: dict[str, Any] = {"inputs": ["storm"]} if args.real else {}
            started = time.perf_counter()
            with ThreadPoolExecutor(args.n) as pool:
                results = list(pool.map(invoke, [client] * args.n, [event] * args.n))
            wall = time.perf_counter() - started
            ok = sum("FunctionError" not in r for r, _b, _l in results)
            timeouts = sum("Init phase timed out" in str(b) for _r, b, _l in results)
            print(
                f"  {label:<32} ok {ok:>3}/{args.n}  init timeouts {timeouts:>3}  wall {wall:6.1f} s"
                f"  slots {local.pool.slots.slots}, peak {local.pool.slots.peak}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("quota").set_defaults(func=quota)
    g = sub.add_parser("guard")
    g.add_argument("--n", type=int, default=500, help="warm invocations per setting (default: 500)")
    g.set_defaults(func=guard)
    s = sub.add_parser("storm")
    s.add_argument("--n", type=int, default=40, help="simultaneous cold starts (default: 40)")
    s.add_argument("--memory", type=int, default=2048, help="memory size, MB (default: 2048)")
    s.add_argument("--real", action="store_true", help="the real handler on models/default")
    s.set_defaults(func=storm)
    args = parser.parse_args()
    args.func(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
