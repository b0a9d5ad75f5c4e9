"""Snapshot restore vs cold start, and the memory of restored copies, through the local Lambda.

Two local Lambdas run side by side in this process, both serving the default model with the real handler
through the real awslambdaric: one plain (every new instance spawns and runs init), one with `--snapshot`
(every new instance is forked from a template and restored). Each round retires the idle instances of
both, then times one embedding invoke on each (boto3, client side): the cold start and the restore are
measured interleaved, in the same run, on the same machine.

Memory: K restored copies (each made to serve) next to one on-demand instance; proportional set size (PSS,
shared pages divided among the processes sharing them) and unique set size (USS, pages only that process
has: what one more copy really adds) from /proc/<pid>/smaps_rollup.

    .venv/bin/python bench/local/snapshot.py [--rounds 10] [--copies 4] [--backend onnx|torch]
"""

from __future__ import annotations

import argparse
import json
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

EVENT = json.dumps({"inputs": ["How fast does a restored copy answer?", "Cold starts cost seconds."]})


def smaps(pid: int) -> dict[str, float]:
    fields: dict[str, float] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1]) / 1024
    return {
        "rss": fields["Rss"],
        "pss": fields["Pss"],
        "uss": fields["Private_Clean"] + fields["Private_Dirty"],
    }


def invoke(client: Any, payload: str = EVENT) -> tuple[float, dict[str, Any], str]:
    t0 = time.perf_counter()
    result = client.invoke(FunctionName="warmstart", Payload=payload, LogType="Tail")
    body = json.loads(result["Payload"].read())
    elapsed = (time.perf_counter() - t0) * 1000
    if result.get("FunctionError"):
        raise RuntimeError(f"invoke failed: {body}")
    import base64

    log = base64.b64decode(result["LogResult"]).decode()
    return elapsed, body, log


def report_field(log: str, name: str) -> float | None:
    for line in log.splitlines():
        if line.startswith("REPORT "):
            for part in line.split("\t"):
                key, _, value = part.partition(": ")
                if key.strip() == name:
                    return float(value.split()[0])
    return None


def server_ms(local: LocalLambda) -> float:
    inv = local.history[-1]
    assert inv.ended_at is not None
    return (inv.ended_at - inv.received_at) * 1000


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--copies", type=int, default=4, help="restored copies for the memory figure")
    parser.add_argument("--backend", choices=("onnx", "torch"), default="onnx")
    args = parser.parse_args()

    env = {"WARMSTART_BACKEND": args.backend}
    common: dict[str, Any] = dict(port=0, timeout_s=120, init_timeout_s=120, max_concurrency=args.copies + 2)
    plain = LocalLambda(LocalLambdaConfig(environment=env, **common))
    snap = LocalLambda(LocalLambdaConfig(environment=env, init_type="snap-start", snapshot=True, **common))
    plain.start()
    snap.start()
    try:
        plain_client, snap_client = lambda_client(plain.endpoint), lambda_client(snap.endpoint)
        t0 = time.perf_counter()
        _, first, log = invoke(snap_client)  # makes the template (init + hooks), then the first restore
        template_ms = (time.perf_counter() - t0) * 1000
        template = snap.pool.templates["$LATEST"]
        cold: list[float] = []
        restored: list[float] = []
        init_ms: list[float] = []
        restore_ms: list[float] = []
        cold_server: list[float] = []  # invoke received → answer, inside the local Lambda (no boto3, no HTTP)
        restored_server: list[float] = []
        same = True
        for _ in range(args.rounds):
            plain.retire_idle()
            snap.retire_idle()
            ms, _, log = invoke(plain_client)
            cold.append(ms)
            cold_server.append(server_ms(plain))
            init_ms.append(report_field(log, "Init Duration") or float("nan"))
            ms, body_snap, log = invoke(snap_client)
            restored.append(ms)
            restored_server.append(server_ms(snap))
            restore_ms.append(report_field(log, "Restore Duration") or float("nan"))
            if report_field(log, "Init Duration") is not None or report_field(log, "Restore Duration") is None:
                raise RuntimeError("the snapshot call was not a restore: " + log[-300:])
            same = same and body_snap["embeddings"] == first["embeddings"]
        warm = [invoke(snap_client)[0] for _ in range(20)]

        # Memory: K copies that each served, next to one on-demand instance that served. The sum of PSS
        # over the template and its copies is the memory they use together; its growth from 1 to K copies,
        # per copy, is what each extra copy costs.
        one = [i for i in snap.pool.instances.values() if i.proc is not None]
        assert template.ready_info is not None
        total_1 = smaps(int(template.ready_info["pid"]))["pss"] + sum(smaps(i.proc.pid)["pss"] for i in one)  # type: ignore[union-attr]
        snap.retire_idle()
        with ThreadPoolExecutor(args.copies) as pool:
            ping = json.dumps({"warmer": True, "hold_ms": 500})
            list(pool.map(lambda _: invoke(snap_client, ping), range(args.copies)))
            list(pool.map(lambda _: invoke(snap_client), range(args.copies * 3)))
        copies = [i for i in snap.pool.instances.values() if i.proc is not None]
        served = [i.invocations for i in copies]
        plain_inst = next(i for i in plain.pool.instances.values() if i.proc is not None)
        on_demand = smaps(plain_inst.proc.pid)  # type: ignore[union-attr]
        tmpl = smaps(int(template.ready_info["pid"]))
        per_copy = [smaps(i.proc.pid) for i in copies]  # type: ignore[union-attr]
    finally:
        snap.stop()
        plain.stop()

    c, r = median(cold), median(restored)
    print(f"backend {args.backend}, {args.rounds} rounds interleaved (medians; min-max)")
    print(f"  template made on first invoke (init + hooks + first restore): {template_ms:.0f} ms")
    print(f"  cold start  (spawn + init + first response, client side): {c:7.1f} ms  ({min(cold):.0f}-{max(cold):.0f})")
    print(f"    REPORT Init Duration: {median(init_ms):.1f} ms")
    print(
        f"  restore     (fork + restore + first response, client side): {r:7.1f} ms  "
        f"({min(restored):.0f}-{max(restored):.0f})"
    )
    print(f"    REPORT Restore Duration: {median(restore_ms):.1f} ms")
    cs, rs = median(cold_server), median(restored_server)
    print(f"  inside the local Lambda (received → answer): cold {cs:.1f} ms, restore {rs:.1f} ms ({cs / rs:.1f}x)")
    print(f"  warm call (same function, for scale): p50 {median(warm):.1f} ms")
    print(f"  cold / restore = {c / r:.1f}x  (target >= 10x); restore <= 50 ms: {r <= 50}")
    print(f"  restored answers identical to the first restored copy's: {same}")
    print(f"memory (MB): one on-demand instance  PSS {on_demand['pss']:.1f}  USS {on_demand['uss']:.1f}")
    print(f"  template              RSS {tmpl['rss']:.1f}  PSS {tmpl['pss']:.1f}  USS {tmpl['uss']:.1f}")
    for m, n in zip(per_copy, served, strict=True):
        print(
            f"  restored copy ({n} calls) RSS {m['rss']:.1f}  PSS {m['pss']:.1f} "
            f"({m['pss'] / on_demand['pss']:.0%} of on-demand)  USS {m['uss']:.1f} "
            f"({m['uss'] / on_demand['pss']:.0%})"
        )
    total_k = tmpl["pss"] + sum(m["pss"] for m in per_copy)
    extra = (total_k - total_1) / max(1, len(per_copy) - len(one))
    print(
        f"  template + copies, sum of PSS: {total_1:.1f} MB with {len(one)} copy, {total_k:.1f} MB with "
        f"{len(per_copy)}: each extra copy adds {extra:.1f} MB = {extra / on_demand['pss']:.0%} of an on-demand "
        f"instance's PSS (target <= 20%)"
    )
    pss = [m["pss"] for m in per_copy]
    uss = [m["uss"] for m in per_copy]
    print(
        f"  per copy, median: PSS {median(pss):.1f} MB = {median(pss) / on_demand['pss']:.0%} of an on-demand "
        f"instance's; USS {median(uss):.1f} MB = {median(uss) / on_demand['pss']:.0%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
