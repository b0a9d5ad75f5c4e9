"""Issue 26 item 3: a 0.6B decoder embedder end to end, against sentence-transformers loading the same directory.

The model: Qwen3-Embedding-0.6B's real config with random weights (bench/pack/models.py: 28 layers, hidden 1024,
GQA 16/8 heads, vocab 151,669, tied embeddings; last-token pooling + normalize; 2.4 GB of float32), built once
under build/bench-models/ (never downloaded).

1. Pack: `/usr/bin/time -v python -m infra.cli pack --from DIR --out OUT --force --backends onnx [EXTRA]` per
   variant: elapsed and peak RSS. Variants: float32 (no extra flags) and each `--pack-args NAME='FLAGS'` (e.g.
   `--pack-args int8='--quantize int8'` once the pack CLI has it; flags are passed through as given).
2. The local Lambda at --memory MB (default 3,008: 1.7 vCPU by cgroup quota and a 3,008 MB memory limit, as
   `warmstart local`): per round a fresh function (a cold start) per variant, the variants' order alternating
   round by round: the first invoke's round trip (cold start, spawn included) and REPORT's Init Duration, then
   --calls warm invokes of 1 text and of 8 texts (interleaved 1, 8, 1, 8...), medians of REPORT's Duration.
   Variants: warmstart on each packed model (handler.app, onnx backend), and sentence-transformers loading the
   source directory at init (bench/handlers/naive_st.py) with torch's intra-op threads set to the thread count
   warmstart takes from the same quota (handler.core.cpu: 1 at 1.7 vCPU; BENCH_ST_THREADS); each side's
   normalized embeddings, no prompt.
3. The HTTP host (`python -m handler serve`, no cgroup, this machine's cores): spawn → first 200 of POST
   /invocations, then warm batch 1 / 8; its init report line (backend, threads, dtype/quantization where the
   manifest has them).
The page cache is warm (the files were just written / read): cold start here is process + runtime + model
init, not disk.

Usage: .venv/bin/python bench/pack/big_model.py [--rounds 3] [--calls 10] [--memory 3008]
       [--pack-args int8='--quantize int8'] [--skip-pack] [--skip-lambda] [--skip-http] [--skip-st]
       [--json bench-results/big-model.json]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.pack.memory import pack_measured  # noqa: E402
from bench.pack.models import cached  # noqa: E402
from infra.cli.demo import connect, post  # noqa: E402

MODEL = "qwen3-embedding-0.6b"
WORK = ROOT / "build" / "bench-big"
APP = "handler.app.lambda_handler"
ST = "bench.handlers.naive_st.lambda_handler"
PATH = "/2015-03-31/functions/warmstart/invocations"
# Queries and passages of a search workload: 8 to 60 words.
TEXTS = [
    "how long does a lambda cold start take for a python function",
    "The quick brown fox jumps over the lazy dog near the river bank in the early morning light.",
    "what is the capital of france",
    "Serverless inference trades idle cost for start-up latency; packing the model well keeps the start short, "
    "and mapping weights instead of reading them keeps memory flat while the first request waits.",
    "best hiking trails near berlin",
    "Embeddings map text to vectors so that similar meanings land close together under cosine similarity.",
    "int8 quantization size quality trade-off",
    "A decoder embedder pools the last token: with right padding that is the last real token of each row, "
    "which is why the attention mask decides where pooling reads from in a padded batch of uneven texts.",
]


def st_threads(memory_mb: int) -> int:
    """The intra-op threads warmstart takes under the local Lambda's quota for `memory_mb` (handler.core.cpu)."""
    from handler.core.cpu import cpu_budget

    return cpu_budget({"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(memory_mb)}).cpus


def pack_variants(source: Path, variants: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    results = {}
    for name, extra in variants.items():
        out = WORK / f"packed-{name}"
        elapsed, rss = pack_measured(ROOT, source, out, ["--backends", "onnx", *extra])
        manifest = json.loads((out / "manifest.json").read_text())
        size = sum(f["size"] for f in manifest["files"].values())
        results[name] = {"dir": str(out), "elapsed_s": elapsed, "peak_rss_mb": rss, "packed_mb": size / 2**20}
        print(f"pack {name}: {elapsed:.1f} s, peak {rss:,.0f} MB, {size / 2**20:,.0f} MB on disk", file=sys.stderr)
    return results


def _report(headers: dict[str, str], key: str) -> float | None:
    log = base64.b64decode(headers.get("x-amz-log-result", "")).decode(errors="replace")
    match = re.search(rf"\t{key}: ([0-9.]+) ms", log)
    return float(match.group(1)) if match else None


def lambda_round(name: str, handler: str, env: dict[str, str], memory_mb: int, calls: int) -> dict[str, Any]:
    """One fresh local Lambda function: cold invoke, then `calls` warm invokes of 1 and of 8 texts."""
    from infra.local.config import LocalLambdaConfig
    from infra.local.server import LocalLambda

    config = LocalLambdaConfig(
        handler=handler,
        port=0,
        memory_mb=memory_mb,
        max_concurrency=1,
        init_timeout_s=600.0,
        timeout_s=600.0,
        environment={"HF_HUB_OFFLINE": "1", **env},
    )
    one, eight = json.dumps({"inputs": TEXTS[:1]}).encode(), json.dumps({"inputs": TEXTS}).encode()
    with LocalLambda(config) as local:
        host, port = local.endpoint.removeprefix("http://").split(":")
        conn = connect(host, int(port), timeout=900)
        cold_ms, headers, body = post(conn, PATH, one)
        if "x-amz-function-error" in headers:
            raise SystemExit(f"{name}: the cold invoke failed: {body[:2000]!r}")
        init_ms = _report(headers, "Init Duration")
        warm: dict[int, list[float]] = {1: [], 8: []}
        for i in range(calls + 1):  # the first pair warms the call path and is dropped
            for size, payload in ((1, one), (8, eight)):
                _, headers, body = post(conn, PATH, payload)
                if "x-amz-function-error" in headers:
                    raise SystemExit(f"{name}: a warm invoke failed: {body[:2000]!r}")
                duration = _report(headers, "Duration")
                if i and duration is not None:
                    warm[size].append(duration)
        max_memory = _report_mb(headers)
        conn.close()
    return {"cold_ms": cold_ms, "init_ms": init_ms, "warm1": warm[1], "warm8": warm[8], "max_memory_mb": max_memory}


def _report_mb(headers: dict[str, str]) -> float | None:
    log = base64.b64decode(headers.get("x-amz-log-result", "")).decode(errors="replace")
    match = re.search(r"Max Memory Used: ([0-9]+) MB", log)
    return float(match.group(1)) if match else None


def http_host(packed: Path, calls: int) -> dict[str, Any]:
    """`python -m handler serve` on a free port: spawn → first answer, warm batch 1 / 8, its init report."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WARMSTART_MODEL": str(packed), "PORT": str(port)}
    env.pop("AWS_LAMBDA_RUNTIME_API", None)
    one, eight = json.dumps({"inputs": TEXTS[:1]}).encode(), json.dumps({"inputs": TEXTS}).encode()
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "handler", "serve"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                raise SystemExit(f"the HTTP host did not answer:\n{out[-3000:]}")
            try:
                conn = connect("127.0.0.1", port, timeout=600)
                post(conn, "/invocations", one)
                break
            except OSError:
                time.sleep(0.05)
        cold_ms = (time.perf_counter() - started) * 1000.0
        warm: dict[int, list[float]] = {1: [], 8: []}
        for i in range(calls + 1):
            for size, payload in ((1, one), (8, eight)):
                elapsed, _, _ = post(conn, "/invocations", payload)
                if i:
                    warm[size].append(elapsed)
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    init = next((json.loads(line) for line in out.decode(errors="replace").splitlines() if '"warmstart": "init"' in line
                 or '"warmstart":"init"' in line), None)  # fmt: skip
    return {"cold_ms": cold_ms, "warm1": warm[1], "warm8": warm[8], "init": init}


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _cell(values: list[float]) -> str:
    return f"{_median(values):,.0f} ({min(values):,.0f}..{max(values):,.0f})" if values else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--memory", type=int, default=3008)
    parser.add_argument("--pack-args", action="append", default=[], metavar="NAME='FLAGS'",
                        help="another packed variant: pack flags passed through (repeatable)")  # fmt: skip
    parser.add_argument("--skip-pack", action="store_true", help="reuse build/bench-big/packed-* as they are")
    parser.add_argument("--skip-lambda", action="store_true")
    parser.add_argument("--skip-http", action="store_true")
    parser.add_argument("--skip-st", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    variants: dict[str, list[str]] = {"float32": []}
    for item in args.pack_args:
        name, sep, flags = item.partition("=")
        if not sep or not re.fullmatch(r"[a-z0-9_-]+", name):
            raise SystemExit(f"--pack-args {item!r}; expected NAME='FLAGS' (NAME: a-z 0-9 _ -)")
        variants[name] = shlex.split(flags)
    source = cached(MODEL)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results: dict[str, Any] = {"model": MODEL, "source": str(source), "memory_mb": args.memory}
    if not args.skip_pack:
        results["pack"] = pack_variants(source, variants)
    packed = {name: WORK / f"packed-{name}" for name in variants}
    threads = st_threads(args.memory)
    results["st_threads"] = threads
    if not args.skip_lambda:
        lambdas: dict[str, tuple[str, dict[str, str]]] = {
            f"warmstart {name}": (APP, {"WARMSTART_MODEL": str(path), "WARMSTART_BACKEND": "onnx"})
            for name, path in packed.items()
        }
        if not args.skip_st:
            st_env = {"BENCH_ST_MODEL_DIR": str(source), "BENCH_ST_THREADS": str(threads)}
            lambdas[f"sentence-transformers ({threads} thread)"] = (ST, st_env)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in lambdas}
        for r in range(args.rounds):
            order = list(lambdas) if r % 2 == 0 else list(reversed(lambdas))
            for name in order:
                handler, env = lambdas[name]
                try:
                    run = lambda_round(name, handler, env, args.memory, args.calls)
                except SystemExit as e:  # an out-of-memory kill at this size is a result, not a crash
                    run = {"error": str(e)[:500]}
                runs[name].append(run)
                print(f"round {r + 1} {name}: {json.dumps(run)[:400]}", file=sys.stderr)
        results["lambda"] = runs
        title = f"local Lambda, {args.memory:,} MB ({args.memory / 1769:.2f} vCPU)"
        print(f"\n| {title} | cold start ms | Init Duration ms | warm batch 1 ms | warm batch 8 ms | max memory MB |")
        print("|---|---|---|---|---|---|")
        for name, rounds in runs.items():
            ok = [r for r in rounds if "error" not in r]
            if not ok:
                print(f"| {name} | failed: {rounds[0]['error'][:120]} | | | | |")
                continue
            cells = [
                _cell([r["cold_ms"] for r in ok]),
                _cell([r["init_ms"] for r in ok if r["init_ms"] is not None]),
                _cell([_median(r["warm1"]) for r in ok]),
                _cell([_median(r["warm8"]) for r in ok]),
                _cell([r["max_memory_mb"] for r in ok if r["max_memory_mb"] is not None]),
            ]
            print(f"| {name} | {' | '.join(cells)} |")
    if not args.skip_http:
        hosts = {name: http_host(path, args.calls) for name, path in packed.items()}
        results["http"] = hosts
        print("\n| HTTP host (`python -m handler serve`) | cold start ms | warm batch 1 ms | warm batch 8 ms | init |")
        print("|---|---|---|---|---|")
        for name, host in hosts.items():
            init = host["init"] or {}
            facts = {k: init.get(k) for k in ("backend", "threads", "dtype", "quantization", "weights_mb") if k in init}
            print(f"| {name} | {host['cold_ms']:,.0f} | {_median(host['warm1']):,.1f} | {_median(host['warm8']):,.1f} "
                  f"| {json.dumps(facts)} |")  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
