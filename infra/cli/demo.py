"""`warmstart demo`: one cold invocation and several warm ones through the local Lambda, explained."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from infra.cli.local import add_function_options, config_from_args
from infra.local.config import REPO_ROOT

DEFAULT_TEXTS = ["Cold starts should cost what the model costs, and not a millisecond more."]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser("demo", help="cold start then warm calls of the default model through the local Lambda")
    add_function_options(demo)
    demo.add_argument("--text", action="append", help="input text (repeatable)")
    demo.add_argument("--warm", type=int, default=20, help="warm invocations after the cold one (default: 20)")
    demo.set_defaults(func=run)


class Progress:
    """One status line on stderr: redrawn with elapsed time on a terminal, plain lines otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()

    @contextmanager
    def step(self, label: str) -> Iterator[None]:
        start = time.perf_counter()
        done = threading.Event()
        ticker = None
        if self.tty:

            def tick() -> None:
                while not done.wait(0.1):
                    sys.stderr.write(f"\r\x1b[K… {label} {time.perf_counter() - start:5.1f} s")
                    sys.stderr.flush()

            ticker = threading.Thread(target=tick, daemon=True)
            ticker.start()
        else:
            sys.stderr.write(f"… {label}\n")
            sys.stderr.flush()
        try:
            yield
        finally:
            done.set()
            if ticker is not None:
                ticker.join()
            elapsed = time.perf_counter() - start
            sys.stderr.write(("\r\x1b[K" if self.tty else "") + f"✓ {label} ({elapsed:.1f} s)\n")
            sys.stderr.flush()


def connect(host: str, port: int, timeout: float) -> http.client.HTTPConnection:
    """A keep-alive connection with TCP_NODELAY: http.client sends headers and body in two writes, which
    Nagle + delayed ACK would turn into a 40 ms stall per request (curl and urllib3 set it too)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    conn.connect()
    assert conn.sock is not None
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def post(conn: http.client.HTTPConnection, path: str, body: bytes) -> tuple[float, dict[str, str], bytes]:
    start = time.perf_counter()
    conn.request("POST", path, body, {"Content-Type": "application/json", "X-Amz-Log-Type": "Tail"})
    response = conn.getresponse()
    data = response.read()
    elapsed = (time.perf_counter() - start) * 1000.0
    return elapsed, {k.lower(): v for k, v in response.getheaders()}, data


def run(args: argparse.Namespace) -> int:
    from infra.local.server import LocalLambda

    if args.handler == "handler.app.lambda_handler" and not args.model:
        manifest = Path(os.environ.get("WARMSTART_MODEL") or Path(REPO_ROOT, "models", "default")) / "manifest.json"
        if not manifest.exists():
            print(f"no packed model at {manifest.parent}: run `warmstart pack --default` first", file=sys.stderr)
            return 2
    # A demo on a busy laptop should not trip Lambda's 10 s init limit.
    config = config_from_args(args, port=0, init_timeout_s=max(args.init_timeout, 120.0))
    event = json.dumps({"inputs": args.text or DEFAULT_TEXTS}).encode()
    progress = Progress()
    local = LocalLambda(config)
    with progress.step("starting the local Lambda"):
        endpoint = local.start()
    try:
        url = urlsplit(endpoint)
        conn = connect(url.hostname or "127.0.0.1", url.port or 80, timeout=config.timeout_s + 130)
        path = f"/2015-03-31/functions/{config.function_name}/invocations"
        with progress.step("cold invocation (spawning an instance, running init)"):
            cold_ms, headers, body = post(conn, path, event)
        cold = next(i for i in local.history if i.request_id == headers.get("x-amzn-requestid"))
        if "x-amz-function-error" in headers:
            print(f"the cold invocation failed: {body.decode('utf-8', 'replace')}", file=sys.stderr)
            sys.stderr.write(cold.log.decode("utf-8", "replace"))
            return 1
        warm_ms: list[float] = []
        with progress.step(f"{args.warm} warm invocations"):
            for _ in range(args.warm):
                elapsed, headers, _body = post(conn, path, event)
                warm_ms.append(elapsed)
        warm = [i for i in local.history if not i.cold and not i.is_async][-args.warm :]
        snapshot = None
        if config.snapshot:
            template = local.pool.templates[cold.version]
            local.retire_idle()  # so the next invocation is a new copy restored from the snapshot
            with progress.step("restore (forking a new instance from the snapshot)"):
                restore_ms, headers, _body = post(conn, path, event)
            restored = next(i for i in local.history if i.request_id == headers.get("x-amzn-requestid"))
            snapshot = (template.instance, restore_ms, restored)
        conn.close()
    finally:
        with progress.step("stopping (killing instance process groups)"):
            local.stop()
    durations = [i.duration_ms for i in warm]
    template_instance = snapshot[0] if snapshot is not None else None
    print_report(config.handler, cold_ms, cold, json.loads(body), warm_ms, durations, template_instance)
    if snapshot is not None:
        _, restore_ms, restored = snapshot
        print("\nrestore: a new instance forked from the snapshot" + " " * 9 + "ms")
        print(f"  {'Restore Duration (fork → first /next)':<42}{restored.restore_duration_ms or 0.0:>9.1f}")
        print(f"  {'first invocation Duration':<42}{restored.duration_ms:>9.1f}")
        print(f"  {'first response, as the client saw it':<42}{restore_ms:>9.1f}")
        print(f"\nrestored first response / warm median: {restore_ms / statistics.median(warm_ms):.1f}x")
    return 0


def init_report(log: bytes) -> dict[str, Any] | None:
    for line in log.decode("utf-8", "replace").splitlines():
        if line.startswith("{") and '"warmstart"' in line:
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if isinstance(report, dict) and report.get("warmstart") == "init":
                return report
    return None


def print_report(
    handler: str,
    cold_ms: float,
    cold: Any,
    response: Any,
    warm_ms: list[float],
    warm_durations: list[float],
    template: Any = None,
) -> None:
    """`template`: with --snapshot the first invocation waited for the template's init, then a restore."""
    report = init_report(bytes(template.logs.init_log if template is not None else cold.log))
    init_ms = (template.init_duration_ms if template else cold.init_duration_ms) or 0.0
    rows: list[tuple[str, float]] = []
    if report is not None:
        phases = report.get("phases_ms", {})
        handler_total = float(report.get("total_ms", sum(phases.values())))
        outside = "python, awslambdaric, snapshot hooks" if template is not None else "spawn → python + awslambdaric up"
        rows.append((outside, max(0.0, init_ms - handler_total)))
        rows.extend((f"  init: {name}", float(ms)) for name, ms in phases.items())
        rows.append(("  init total (handler's own report)", handler_total))
        print(
            f"\nmodel {report.get('model', '?')} on {report.get('backend', '?')} ({handler}),"
            f" providers {report.get('providers', '-')}"
        )
    else:
        print(f"\n{handler} printed no init report line; only the platform's figures follow")
    if template is not None:
        rows.append(("Init Duration (template: spawn → snapshot)", init_ms))
        rows.append(("Restore Duration (first copy)", cold.restore_duration_ms or 0.0))
    else:
        rows.append(("Init Duration (spawn → first /next)", init_ms))
    rows.append(("first invocation Duration", cold.duration_ms))
    rows.append(("first response, as the client saw it", cold_ms))
    print("\ncold start" + " " * 36 + "ms")
    for label, ms in rows:
        print(f"  {label:<42}{ms:>9.1f}")
    if isinstance(response, dict) and "embeddings" in response:
        vectors = response["embeddings"]
        print(
            f"  → {len(vectors)} embedding(s) x {len(vectors[0]) if vectors else 0} dims from {response.get('model')}"
        )
    if warm_ms:
        print(f"\nwarm ({len(warm_ms)} invocations){' ' * 19}median      p90")
        for label, values in (("client round trip", warm_ms), ("Duration (REPORT)", warm_durations)):
            if values:
                p90 = sorted(values)[min(len(values) - 1, int(0.9 * len(values)))]
                print(f"  {label:<36}{statistics.median(values):>9.2f}{p90:>9.2f}")
        print(f"\ncold first response / warm median: {cold_ms / statistics.median(warm_ms):.0f}x")
