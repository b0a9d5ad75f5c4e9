"""Load time of the default packed model from S3 (moto over real HTTP) against local disk.

Each round runs, in rotating order so a noisy neighbour hurts them all alike (medians reported):
  local       Runtime.start over models/default (what an image or a model layer does)
  s3-cold     fetch_model into an empty cache dir (parallel ranged GETs, SHA-256, fsync, rename), then
              Runtime.start over the fetched directory
  s3-warm     fetch_model again, the directory published (one HEAD of manifest.json), then Runtime.start
  s3-cold-1w  (--serial) s3-cold with one worker: what the parallel ranged GETs buy

S3 is moto's ThreadedMotoServer on 127.0.0.1: real HTTP, boto3 and its connection pool, but a Python
server on the same CPUs, so fetch MB/s here is a floor, not Lambda-to-S3 bandwidth (often 50-100+ MB/s per
connection in region). moto also reads the whole object for every ranged GET, under a per-object lock: its
parts cost O(object size) and queue up, so compare --part-mb 8 with --part-mb 128 (one GET per file).
Local files sit in the page cache here; on a real cold start they may not.
One unmeasured round first, so every variant sees onnxruntime already imported.

Usage: .venv/bin/python bench/coldstart/s3load.py [--rounds 5] [--backend onnx|torch|all] [--workers 8]
                                              [--part-mb 8] [--serial] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from handler.core.manifest import load_manifest  # noqa: E402
from handler.models.s3fetch import drop_clients, fetch_model  # noqa: E402
from handler.runtime.invocation import Runtime  # noqa: E402

MODEL = ROOT / "models" / "default"
BUCKET = "warmstart-bench"
PREFIX = "models/all-minilm-l6-v2/0.1.0/"
EVENT = {"inputs": ["Weights from S3, or from local disk: the answer is the same."]}


def start(model: Path, backend: str | None) -> tuple[float, list[float]]:
    t0 = time.perf_counter()
    env = {"WARMSTART_MODEL": str(model), **({"WARMSTART_BACKEND": backend} if backend else {})}
    runtime = Runtime.start(environ=env, emit=None)
    ms = (time.perf_counter() - t0) * 1000
    vector = runtime.infer(EVENT)["embeddings"][0]
    del runtime
    gc.collect()
    return ms, vector


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backend", default="onnx", help="onnx | torch | all (fetch every file; init with onnx)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--part-mb", type=int, default=8)
    ap.add_argument("--serial", action="store_true", help="also a cold fetch with one worker (no parallel GETs)")
    ap.add_argument("--json")
    args = ap.parse_args()
    fetch_backend = None if args.backend == "all" else args.backend
    init_backend = fetch_backend or "onnx"

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per GET otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for key, value in {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        os.environ.setdefault(key, value)
    env = {
        "AWS_ENDPOINT_URL_S3": endpoint,
        "WARMSTART_S3_WORKERS": str(args.workers),
        "WARMSTART_S3_PART_MB": str(args.part_mb),
    }

    import boto3  # type: ignore[import-untyped]

    uploader = boto3.client("s3", endpoint_url=endpoint)
    uploader.create_bucket(Bucket=BUCKET)
    manifest = load_manifest(MODEL)
    for name in [*manifest.files, "manifest.json"]:
        uploader.upload_file(str(MODEL / name), BUCKET, PREFIX + name)
    names = manifest.files_for(fetch_backend) if fetch_backend else list(manifest.files)
    fetched_mb = sum(manifest.files[n].size for n in names) / 1e6
    uri = f"s3://{BUCKET}/{PREFIX}"

    work = Path(tempfile.mkdtemp(prefix="bench-s3load-"))
    cold = ["s3-cold", *(["s3-cold-1w"] if args.serial else [])]
    rows: dict[str, list[dict[str, float]]] = {v: [] for v in ["local", *cold, "s3-warm"]}
    reference: list[float] = []
    try:
        for round_ in range(args.rounds + 1):
            order = ["local", *cold]
            order = order[round_ % len(order) :] + order[: round_ % len(order)]
            order.insert(order.index("s3-cold") + 1, "s3-warm")  # reuses this round's cold fetch
            for variant in order:
                cache = work / f"{round_}-{variant.replace('-warm', '-cold')}"
                if variant.startswith("s3-cold"):
                    drop_clients()  # a new instance: no client yet (warm reuse keeps the instance's client)
                t0 = time.perf_counter()
                if variant == "local":
                    model, fetch_ms = MODEL, 0.0
                else:
                    workers = 1 if variant == "s3-cold-1w" else None
                    model = fetch_model(uri, cache_dir=cache, environ=env, backend=fetch_backend, workers=workers)
                    fetch_ms = (time.perf_counter() - t0) * 1000
                init_ms, vector = start(model, init_backend)
                total_ms = fetch_ms + init_ms  # to a ready runtime (the check inference is not counted)
                reference = reference or vector
                assert vector == reference, f"{variant}: another embedding than the local model's"
                if round_:  # round 0 warms imports and the server
                    rows[variant].append({"fetch_ms": fetch_ms, "init_ms": init_ms, "total_ms": total_ms})
                if variant != "s3-cold":
                    shutil.rmtree(cache, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        server.stop()

    def med(variant: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[variant])

    print(
        f"default model ({manifest.key}), fetch: {len(names)} files {fetched_mb:.1f} MB ({args.backend}), "
        f"{args.workers} workers x {args.part_mb} MiB parts, moto server on {endpoint}; "
        f"medians of {args.rounds} rounds"
    )
    print(f"{'variant':<10} {'fetch ms':>9} {'init ms':>8} {'ready ms':>9} {'fetch MB/s':>11} {'vs local':>9}")
    local = med("local", "total_ms")
    summary: dict[str, Any] = {"fetched_mb": fetched_mb, "workers": args.workers, "part_mb": args.part_mb}
    for variant in rows:
        fetch, init, total = med(variant, "fetch_ms"), med(variant, "init_ms"), med(variant, "total_ms")
        rate = f"{fetched_mb / (fetch / 1000):.0f}" if variant.startswith("s3-cold") else "-"
        print(f"{variant:<10} {fetch:>9.0f} {init:>8.0f} {total:>9.0f} {rate:>11} {total / local:>8.2f}x")
        summary[variant] = {"fetch_ms": fetch, "init_ms": init, "total_ms": total, "rounds": rows[variant]}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
