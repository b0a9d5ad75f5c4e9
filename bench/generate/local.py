"""Issue 34's local-Lambda figure: spawn → first streamed token of a packed chat model, as AWS would run it.

Per round and pack, a fresh local Lambda (infra.local: real processes, a cgroup CPU quota and memory limit from
--memory, 3,008 MB = 1.7 vCPU) whose instance runs `python -m handler` (the shim's streaming Runtime API loop);
one `InvokeWithResponseStream` of a chat request with `"stream": true`: the time from the invoke (the instance is
spawned by it: a cold start) to the first PayloadChunk holding a generated token, to the end, and REPORT's Init
Duration (from the tail of the log in InvokeComplete). Then --warm invokes on the same instance: time to the
first token. The page cache is warm.

Usage: .venv/bin/python bench/generate/local.py --pack NAME=DIR [--pack ...] [--rounds 3] [--memory 3008]
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for infra.local

from infra.cli.local import lambda_client
from infra.local.config import LocalLambdaConfig
from infra.local.server import LocalLambda

MESSAGES = [{"role": "user", "content": "Write one sentence about the sea."}]


def streamed(client: Any, max_tokens: int) -> dict[str, Any]:
    body = json.dumps({"messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0, "stream": True})
    t0 = time.perf_counter()
    events = client.invoke_with_response_stream(FunctionName="warmstart", Payload=body, LogType="Tail")["EventStream"]
    first = None
    log = ""
    data = b""
    for item in events:
        if "PayloadChunk" in item:
            data += item["PayloadChunk"]["Payload"]
            if first is None and b'"token_ids":[' in data and b'"token_ids":[]' not in data.split(b"\n\n")[0]:
                first = time.perf_counter()
        elif "InvokeComplete" in item:
            log = base64.b64decode(item["InvokeComplete"].get("LogResult", "")).decode("utf-8", "replace")
    end = time.perf_counter()
    init = re.search(r"Init Duration: ([\d.]+) ms", log)
    return {
        "first_ms": ((first or end) - t0) * 1000,
        "end_ms": (end - t0) * 1000,
        "init_ms": float(init.group(1)) if init else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pack", action="append", required=True, help="NAME=DIR")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--memory", type=int, default=3008)
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    packs = dict(p.split("=", 1) for p in args.pack)
    rows: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        names = list(packs) if rnd % 2 == 0 else list(packs)[::-1]
        for name in names:
            env = {"WARMSTART_MODEL": str(Path(packs[name]).resolve())}
            config = LocalLambdaConfig(
                port=0,
                command=("python", "-m", "handler"),
                memory_mb=args.memory,
                environment=env,
                timeout_s=300.0,
                init_timeout_s=300.0,
            )
            local = LocalLambda(config)
            local.start()
            client = lambda_client(local.endpoint, read_timeout=300)
            try:
                cold = streamed(client, args.max_tokens)
                warm = [streamed(client, args.max_tokens)["first_ms"] for _ in range(args.warm)]
            finally:
                client.close()
                local.stop()
            row = {"pack": name, "round": rnd, **cold, "warm_first_ms": statistics.median(warm)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{args.memory} MB local Lambda, `python -m handler`, {args.max_tokens} greedy tokens; medians (min-max):")
    print("| pack | invoke → first token (cold) | Init Duration | warm invoke → first token |\n|---|---|---|---|")
    for name in packs:
        mine = [r for r in rows if r["pack"] == name]

        def cell(key: str, rows_: list[dict[str, Any]] = mine) -> str:
            xs = [r[key] for r in rows_ if r[key] is not None]
            return f"{statistics.median(xs):,.0f} ms ({min(xs):,.0f}-{max(xs):,.0f})" if xs else "-"

        print(f"| {name} | {cell('first_ms')} | {cell('init_ms')} | {cell('warm_first_ms')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
