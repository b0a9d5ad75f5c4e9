"""Hot path, side by side in one run (ratios and medians; this machine is shared and noisy).

1. Per-invocation cost: `lambda_handler` (Runtime.handle, direct invoke) vs a minimal hand-written handler
   (tokenize → session.run → list; mean pooling and L2 normalization are in the packed graph) on the same
   ONNX Runtime session and inputs, batch 1 and batch 32, interleaved in blocks.
2. Steady state: tracemalloc growth over N warm invocations, and the pool's hit rate after warm-up.
3. HTTP at concurrency 8: the warmstart host vs a plain starlette app calling the same session, both served
   by one uvicorn process (so they share the session, the loop and the CPUs), a raw-socket keep-alive load
   generator on loopback, bounded in requests and seconds, phases alternated.
Before vs after (a git ref against this tree), per-call overhead at batch 1 and 32: bench/hotpath/overhead.py.

Usage: .venv/bin/python bench/hotpath/run.py [--calls 1000] [--leak-calls 10000] [--http-seconds 6] [--json out]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
MODEL = ROOT / "models" / "default"
SHORT = "How long does a cold start take on Lambda?"
BATCH32 = [
    f"passage {i}: serverless inference keeps the model warm between calls, " + "more " * (i % 9) for i in range(32)
]


def start_runtime() -> Any:
    from handler.core.config import Config
    from handler.runtime.invocation import Runtime

    return Runtime.start(Config(model_dir=MODEL, backend="onnx"), environ={}, emit=None)


def first_output(session: Any) -> Any:
    """`feeds -> the first output` on the backend's session: the C API's (handler.backends.ort_capi, the CPU's) or
    the Python binding's (CUDA, WARMSTART_ORT_CAPI=0)."""
    from handler.backends.ort_capi import Session

    if isinstance(session, Session):
        return lambda feeds: session.run(feeds)[0]
    return lambda feeds: session.run(None, feeds)[0]


def minimal_handler(session: Any) -> Any:
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    tok.enable_truncation(256)
    tok.enable_padding()
    run = first_output(session)

    def handler(event: Any, context: Any) -> Any:
        enc = tok.encode_batch(event["inputs"])
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        return {"embeddings": run({"input_ids": ids, "attention_mask": mask}).tolist()}

    return handler


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def summary(xs: list[float]) -> dict[str, float]:
    p50 = statistics.median(xs)
    return {"n": len(xs), "p50_ms": p50 * 1e3, "p99_ms": pct(xs, 0.99) * 1e3, "p99/p50": pct(xs, 0.99) / p50}


def per_invocation(rt: Any, calls: int) -> dict[str, Any]:
    # handler.app.lambda_handler is `runtime.handle(event, context)`; calling it on our own runtime measures the
    # same path without a second init through the module import.
    minimal = minimal_handler(rt.backend.session)
    out: dict[str, Any] = {}
    for label, texts, n in (("batch1", [SHORT], calls), ("batch32", BATCH32, max(40, calls // 10))):
        event = {"inputs": texts}
        a, b = rt.handle(event, None)["embeddings"], minimal(event, None)["embeddings"]
        assert max(abs(x - y) for va, vb in zip(a, b, strict=True) for x, y in zip(va, vb, strict=True)) < 1e-4
        times: dict[str, list[float]] = {"warmstart": [], "minimal": []}
        fns = {"warmstart": rt.handle, "minimal": minimal}
        block = 10
        for i in range(0, n, block):
            order = ("warmstart", "minimal") if (i // block) % 2 == 0 else ("minimal", "warmstart")
            for name in order:
                fn = fns[name]
                for _ in range(block):
                    t0 = time.perf_counter()
                    fn(event, None)
                    times[name].append(time.perf_counter() - t0)
        ws, mn = summary(times["warmstart"]), summary(times["minimal"])
        out[label] = {"warmstart": ws, "minimal": mn, "ratio_p50": ws["p50_ms"] / mn["p50_ms"]}
    return out


def _site(d: Any) -> str:
    frame = d.traceback[0]
    return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} {d.size_diff / 1024:+.1f} KB"


def steady_state(rt: Any, calls: int) -> dict[str, Any]:
    texts = [SHORT, "a second, slightly longer query about warm starts", "hi"]
    for i in range(200):  # warm-up: every shape class seen once
        rt.handle({"inputs": [texts[i % 3]]}, None)
    before = rt.pool.stats()
    gc.collect()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    snap0 = tracemalloc.take_snapshot()
    for i in range(calls):
        rt.handle({"inputs": [texts[i % 3]]}, None)
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    top = tracemalloc.take_snapshot().compare_to(snap0, "lineno")[:5]
    tracemalloc.stop()
    after = rt.pool.stats()
    hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
    return {
        "invocations": calls,
        "growth_kb": (current - base) / 1024,
        "peak_kb_over_start": (peak - base) / 1024,
        "top_growth": [
            f"{d.traceback[0].filename.rsplit('/', 1)[-1]}:{d.traceback[0].lineno} {d.size_diff / 1024:+.1f} KB"
            for d in top
        ],
        "pool_hit_rate": hits / max(1, hits + misses),
        "pool_hits": hits,
        "pool_misses": misses,
        "pool_high_water_bytes": after["high_water_bytes"],
    }


# ---- HTTP ----


def serve(port: int) -> None:
    """Both apps in one uvicorn process: /ws/* is the warmstart host, /plain/invocations the plain app."""
    import numpy as np
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Mount, Route
    from tokenizers import Tokenizer

    from handler.http_host.host import Host
    from handler.http_host.routes import create_app

    rt = start_runtime()
    host = Host(lambda: rt)
    host.start()  # init before serving: a mounted app's lifespan does not run
    run = first_output(rt.backend.session)
    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    tok.enable_truncation(256)
    tok.enable_padding()

    async def plain_endpoint(request: Request) -> JSONResponse:
        body = await request.json()

        # The usual way: blocking work in starlette's thread pool (an async endpoint would block the loop).
        def work() -> list[Any]:
            enc = tok.encode_batch(body["inputs"])
            ids = np.array([e.ids for e in enc], dtype=np.int64)
            mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
            out: list[Any] = run({"input_ids": ids, "attention_mask": mask}).tolist()
            return out

        from starlette.concurrency import run_in_threadpool

        return JSONResponse({"embeddings": await run_in_threadpool(work)})

    app = Starlette(
        routes=[Route("/plain/invocations", plain_endpoint, methods=["POST"]), Mount("/ws", app=create_app(host))]
    )
    print("ready", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


async def _load(port: int, path: str, body: bytes, conns: int, seconds: float, max_requests: int) -> dict[str, Any]:
    request = (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds
    sent = 0

    async def conn() -> None:
        nonlocal errors, sent
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < deadline and sent < max_requests:
                sent += 1
                t0 = time.perf_counter()
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                latencies.append(time.perf_counter() - t0)
                if not head.startswith(b"HTTP/1.1 200"):
                    errors += 1
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(conn() for _ in range(conns))), seconds + 30)
    wall = time.perf_counter() - t0
    return {"requests": len(latencies), "errors": errors, "rps": len(latencies) / wall, "latencies": latencies}


def http_bench(seconds: float, rounds: int, conns: int = 8) -> dict[str, Any]:
    port = 18000 + os.getpid() % 1000
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "ready"
        # The server logs a JSON record per request on stdout: keep reading it, or a full pipe stalls the server.
        threading.Thread(target=server.stdout.read, daemon=True).start()
        time.sleep(1.0)
        body = json.dumps({"inputs": [SHORT]}).encode()
        paths = {"warmstart": "/ws/invocations", "plain": "/plain/invocations"}
        for path in paths.values():  # warm both routes
            asyncio.run(_load(port, path, body, conns, 1.0, 200))
        per: dict[str, dict[str, list[float]]] = {k: {"rps": [], "lat": []} for k in paths}
        errors = {k: 0 for k in paths}
        for r in range(rounds):
            order = list(paths) if r % 2 == 0 else list(reversed(paths))
            for name in order:
                res = asyncio.run(_load(port, paths[name], body, conns, seconds, 100_000))
                per[name]["rps"].append(res["rps"])
                per[name]["lat"].extend(res["latencies"])
                errors[name] += res["errors"]
        out: dict[str, Any] = {}
        for name, d in per.items():
            out[name] = {
                "rps_median": statistics.median(d["rps"]),
                "rps_rounds": [round(x, 1) for x in d["rps"]],
                **summary(d["lat"]),
                "errors": errors[name],
            }
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ws/status") as r:
            out["workers"] = json.load(r)["workers"]
        out["throughput_ratio"] = out["warmstart"]["rps_median"] / out["plain"]["rps_median"]
        out["p99_ratio"] = out["warmstart"]["p99_ms"] / out["plain"]["p99_ms"]
        return out
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--leak-calls", type=int, default=10_000)
    ap.add_argument("--http-seconds", type=float, default=6.0)
    ap.add_argument("--http-rounds", type=int, default=3)
    ap.add_argument("--skip-http", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return
    os.environ.setdefault("WARMSTART_MODEL", str(MODEL))
    rt = start_runtime()
    results: dict[str, Any] = {"threads": rt.init_report["threads"]}
    results["per_invocation"] = per_invocation(rt, args.calls)
    for label, r in results["per_invocation"].items():
        ws, mn = r["warmstart"], r["minimal"]
        print(
            f"{label:8s} warmstart p50 {ws['p50_ms']:.3f} ms p99 {ws['p99_ms']:.3f} (p99/p50 {ws['p99/p50']:.2f}) | "
            f"minimal p50 {mn['p50_ms']:.3f} ms p99 {mn['p99_ms']:.3f} (p99/p50 {mn['p99/p50']:.2f}) | "
            f"ratio {r['ratio_p50']:.3f}x  [n={ws['n']}]",
            flush=True,
        )
    s = results["steady_state"] = steady_state(rt, args.leak_calls)
    print(
        f"steady   {s['invocations']} warm invocations: tracemalloc growth {s['growth_kb']:.1f} KB "
        f"(peak +{s['peak_kb_over_start']:.1f} KB); pool hit rate {s['pool_hit_rate'] * 100:.3f}% "
        f"({s['pool_hits']} hits, {s['pool_misses']} misses); top: {s['top_growth'][:3]}",
        flush=True,
    )
    if not args.skip_http:
        h = results["http"] = http_bench(args.http_seconds, args.http_rounds)
        for name in ("warmstart", "plain"):
            d = h[name]
            print(
                f"http c=8 {name:9s} {d['rps_median']:.1f} req/s (rounds {d['rps_rounds']}) "
                f"p50 {d['p50_ms']:.2f} ms p99 {d['p99_ms']:.2f} ms errors {d['errors']}"
            )
        print(f"http     warmstart workers at the end: {h['workers']}")
        print(f"http     throughput ratio {h['throughput_ratio']:.3f}x, p99 ratio {h['p99_ratio']:.3f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
