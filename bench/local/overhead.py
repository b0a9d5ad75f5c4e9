"""What the local Lambda costs: warm-invocation overhead over an in-process call, and concurrent cold starts.

    python bench/local/overhead.py            # fixture echo handler (no model needed)
    python bench/local/overhead.py --real     # handler.app.lambda_handler on models/default

Overhead = median round trip through the local Lambda (HTTP client -> Invoke API -> Runtime API ->
awslambdaric -> handler -> back) minus the median in-process `handler(event, context)` on the same event,
the two interleaved call by call. The local Lambda runs as `warmstart local` in its own process; the client
is a keep-alive http.client connection with TCP_NODELAY (what curl/urllib3 do); boto3's own client-side
cost is shown separately. Then N concurrent invocations on a cold function must land on exactly N
instances, each reporting Init Duration.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import importlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from infra.cli.demo import connect, post  # noqa: E402
from infra.cli.local import lambda_client  # noqa: E402
from infra.local.config import LocalLambdaConfig  # noqa: E402
from infra.local.server import LocalLambda  # noqa: E402

ECHO = "tests.fixtures.handlers.echo"
REAL = "handler.app.lambda_handler"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def load_in_process(config: LocalLambdaConfig) -> Callable[[Any], float]:
    """The same handler, imported here with the instance's Lambda variables (the memory size decides the
    handler's thread count, so it must match) and called with a real awslambdaric LambdaContext."""
    from awslambdaric.lambda_context import LambdaContext

    env = config.instance_environ(version="$LATEST", runtime_api="127.0.0.1:9", instance_id="in-process")
    os.environ.update({k: v for k, v in env.items() if k.startswith(("AWS_", "LAMBDA_", "_HANDLER"))})
    module, name = config.handler.rsplit(".", 1)
    handler = getattr(importlib.import_module(module), name)

    def call(event: Any) -> float:
        context = LambdaContext(str(uuid.uuid4()), None, None, int((time.time() + 300) * 1000), "arn:local")
        start = time.perf_counter()
        handler(event, context)
        return (time.perf_counter() - start) * 1000.0

    return call


@contextmanager
def local_lambda_process(config: LocalLambdaConfig) -> Iterator[str]:
    """`warmstart local` in its own process, as users run it; an in-thread server would share our GIL and
    add ~0.5 ms of handoff to every round trip that no real deployment has."""
    cmd = [sys.executable, "-m", "infra.cli", "local", "--port", "0", "--quiet", "--handler", config.handler]
    cmd += ["--memory", str(config.memory_mb), "--max-concurrency", "1", "--init-timeout", "120"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True) as server:
        assert server.stdout is not None
        match = re.search(r"at (http://\S+)", server.stdout.readline())
        try:
            if match is None:
                raise RuntimeError("warmstart local did not print its endpoint")
            yield match.group(1)
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(30)


def warm_pairs(config: LocalLambdaConfig, event: Any, n: int, boto_n: int) -> dict[str, list[float]]:
    """Interleaved: one in-process call, then one through the local Lambda, n times. On a noisy shared
    machine this keeps both sides under the same conditions; separate blocks drift by 20 % run to run."""
    direct = load_in_process(config)
    body = json.dumps(event).encode()
    with local_lambda_process(config) as endpoint:
        host, port = endpoint.removeprefix("http://").split(":")
        conn = connect(host, int(port), timeout=120)
        path = "/2015-03-31/functions/warmstart/invocations"
        in_proc, client_ms, durations = [], [], []
        for i in range(n + 20):  # the first 20 of each warm caches and are dropped
            a = direct(event)
            b, headers, _ = post(conn, path, body)
            if i >= 20:
                in_proc.append(a)
                client_ms.append(b)
                durations.append(report_duration(headers))
        conn.close()
        client = lambda_client(endpoint)
        boto_ms = []
        for i in range(boto_n + 5):
            start = time.perf_counter()
            client.invoke(FunctionName="warmstart", Payload=body)["Payload"].read()
            if i >= 5:
                boto_ms.append((time.perf_counter() - start) * 1000.0)
    pairs = [c - d for c, d in zip(client_ms, in_proc, strict=True)]
    return {"in_process": in_proc, "client": client_ms, "duration": durations, "boto3": boto_ms, "pairs": pairs}


def report_duration(headers: dict[str, str]) -> float:
    log = base64.b64decode(headers.get("x-amz-log-result", "")).decode()
    match = re.search(r"\tDuration: ([0-9.]+) ms", log)
    return float(match.group(1)) if match else float("nan")


def concurrent_cold(config: LocalLambdaConfig, n: int, hold_event: Any) -> dict[str, Any]:
    config = dataclasses.replace(config, max_concurrency=n)
    body = json.dumps(hold_event).encode()
    with LocalLambda(config) as local:
        host, port = local.endpoint.removeprefix("http://").split(":")
        gate = threading.Barrier(n)

        def call(_i: int) -> tuple[float, dict[str, str]]:
            conn = connect(host, int(port), timeout=180)
            gate.wait()
            elapsed, headers, _ = post(conn, "/2015-03-31/functions/warmstart/invocations", body)
            conn.close()
            return elapsed, headers

        start = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            results = list(pool.map(call, range(n)))
        wall = (time.perf_counter() - start) * 1000.0
        invs = list(local.history)
        errors = sum("x-amz-function-error" in h for _, h in results)
    inits = [i.init_duration_ms for i in invs if i.init_duration_ms is not None]
    return {
        "n": n,
        "instances": len({i.instance_id for i in invs}),
        "with_init_duration": len(inits),
        "init_median": statistics.median(inits) if inits else 0.0,
        "init_max": max(inits) if inits else 0.0,
        "wall": wall,
        "errors": errors,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", action="store_true", help=f"use {REAL} (needs models/default)")
    parser.add_argument("--handler", help="any other handler path")
    parser.add_argument("-n", type=int, default=300, help="warm invocations (default: 300)")
    parser.add_argument("--boto3-n", type=int, default=100, help="warm invocations through boto3 (default: 100)")
    parser.add_argument("--concurrency", type=int, nargs="*", default=[4, 8], help="cold fan-outs (default: 4 8)")
    parser.add_argument("--memory", type=int, default=3008, help="memory size, MB (sets the handler's threads)")
    parser.add_argument("--hold-ms", type=int, default=1500, help="how long each fan-out call holds its instance")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    handler_path = args.handler or (REAL if args.real else ECHO)
    if handler_path == REAL:
        event: Any = {"inputs": ["What does a warm invocation cost beyond the model itself?"]}
        hold: Any = {"warmer": True, "hold_ms": args.hold_ms}
    else:
        event = {"hello": "world", "n": 1}
        hold = {"sleep_ms": args.hold_ms}

    config = LocalLambdaConfig(
        port=0, handler=handler_path, memory_mb=args.memory, max_concurrency=1, init_timeout_s=120, timeout_s=120
    )
    print(f"handler {handler_path}, memory {args.memory} MB, {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    runs = warm_pairs(config, event, args.n, args.boto3_n)

    rows = [
        ("in-process handler(event, context)", runs["in_process"]),
        ("local Lambda, Duration (REPORT)", runs["duration"]),
        ("local Lambda, http.client round trip", runs["client"]),
        ("local Lambda, boto3 invoke", runs["boto3"]),
    ]
    print(f"\nwarm invocations (n={args.n}; boto3 n={args.boto3_n})      median ms    p90 ms")
    for label, values in rows:
        print(f"  {label:<44}{statistics.median(values):>9.3f}{percentile(values, 0.9):>10.3f}")
    overhead = statistics.median(runs["client"]) - statistics.median(runs["in_process"])
    paired = statistics.median(runs["pairs"])
    verdict = "ok" if overhead <= 2.0 else "OVER the 2 ms target"
    print(f"  overhead: median round trip - median in-process{overhead:>7.3f}   target <= 2 ms: {verdict}")
    print(f"  overhead: median of paired differences        {paired:>9.3f}{percentile(runs['pairs'], 0.9):>10.3f}")

    print(f"\nconcurrent invocations on a cold function (each holds its instance {args.hold_ms} ms)")
    print("     N  instances  with Init Duration  init median ms  init max ms   wall ms  errors")
    ok = True
    for n in args.concurrency:
        r = concurrent_cold(config, n, hold)
        ok &= r["instances"] == n and r["with_init_duration"] == n and r["errors"] == 0
        print(
            f"  {n:>4}{r['instances']:>11}{r['with_init_duration']:>20}{r['init_median']:>16.1f}"
            f"{r['init_max']:>13.1f}{r['wall']:>10.0f}{r['errors']:>8}",
            flush=True,
        )
    print("\nexactly N instances, each with Init Duration:", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
