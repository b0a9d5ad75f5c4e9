"""Issue 32: activation memory per padded token, and the worst request under 1 GiB, on the default model and on a
BERT-base-shaped one (hidden 768, 12 layers, 12 heads, intermediate 3072; random weights, 438 MB of float32).

1. `--per-token`: for each model and shape (rows x sequence), a fresh process loads the model as init does
   (handler.models.loader, one intra-op thread, warm-up run), runs one model run of that shape, and reports the
   peak RSS (VmHWM) above the RSS after warm-up, per padded token: what handler.core.memory's formula is fitted to.
2. `--worst`: `python -m handler` in a 1 GiB memory cgroup (2 CPUs, 2 workers), the batch tokens derived from
   that limit (no WARMSTART_BATCH_TOKENS), and the worst request the limits allow (max inputs x max chars of CJK
   with a prompt): status, cgroup peak, margin, and the init report's `limits`.

The BERT-base model is built once under build/bench-models/ (bench/pack/models.py) and packed onnx-only beside it.

Usage: .venv/bin/python bench/hotpath/memory_budget.py [--per-token] [--worst] [--models default,bert-base]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
SHAPES = ((16, 256), (32, 256), (64, 128), (128, 64), (64, 256))
LONG = ((16, 512), (4, 512))  # past both models' 256-token truncation: does attention (seq x seq a head) show?

_CHILD = r"""
import json, sys
from pathlib import Path
import numpy as np
from handler.core.config import Config
from handler.models.loader import load_model
from handler.observability.report import PhaseTimer

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

rows, seq = int(sys.argv[2]), int(sys.argv[3])
loaded = load_model(Path(sys.argv[1]), Config(model_dir=Path(sys.argv[1]), backend="onnx", threads=1), {},
                    PhaseTimer(), warmup=True)
feeds = {}
for spec in loaded.manifest.inputs:
    value = np.ones if spec.name == "attention_mask" else np.zeros
    feeds[spec.name] = value((rows, seq), dtype=np.int64)
before = status("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM to the current RSS
loaded.backend.run(feeds)
peak = status("VmHWM:")
print(json.dumps({"rss_after_init": before, "peak_above": peak - before}))
"""


def bert_base_packed() -> Path:
    from bench.pack.models import CACHE, cached
    from infra.pack.hf_pack import pack_from

    out = CACHE / "bert-base-packed"
    if not (out / "manifest.json").is_file():
        pack_from(cached("bert-base"), out, model_id="bert-base-random", backends=["onnx"], force=True)
    return out


def model_dirs(names: list[str]) -> dict[str, Path]:
    return {n: ROOT / "models" / "default" if n == "default" else bert_base_packed() for n in names}


def per_token(models: dict[str, Path], shapes: tuple[tuple[int, int], ...] = SHAPES) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    results = []
    for name, path in models.items():
        for rows, seq in shapes:
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, str(path), str(rows), str(seq)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            got = json.loads(out.stdout.strip().splitlines()[-1])
            row = {"model": name, "rows": rows, "seq": seq, **got, "per_token": got["peak_above"] / (rows * seq)}
            print(
                f"{name:9} {rows:4} x {seq:3}: after init {got['rss_after_init'] / 2**20:5.0f} MB, "
                f"peak +{got['peak_above'] / 2**20:6.1f} MB, {row['per_token'] / 1024:5.1f} KB a padded token",
                flush=True,
            )
            results.append(row)
    return results


def worst(models: dict[str, Path]) -> list[dict[str, Any]]:
    from handler.core.config import Config
    from infra.local.cgroups import Cgroups
    from tests.fixtures.drain_scenario import _request, free_port

    cgroups = Cgroups.detect()
    results = []
    for name, path in models.items():
        group = cgroups.create(f"membench-{uuid.uuid4().hex[:8]}", 1024)
        assert group is not None, cgroups.reason
        cpu = "cpu.max" if group.mode == "v2" else "cpu.cfs_quota_us"
        (group.dirs[0] / cpu).write_text("200000 100000" if group.mode == "v2" else "200000")
        peak_file = "memory.peak" if group.mode == "v2" else "memory.max_usage_in_bytes"
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("WARMSTART_", "AWS_LAMBDA_", "K_"))}
        env.update(PYTHONPATH=str(ROOT), PORT=str(port), HOST="127.0.0.1", WARMSTART_MODEL=str(path))
        env.update(WARMSTART_HOST="knative", WARMSTART_WORKERS_MAX="2")
        stderr = open(f"/tmp/membench-{name}.stderr", "w")  # noqa: SIM115 (the child's, closed below)
        proc = subprocess.Popen(
            group.wrap([sys.executable, "-m", "handler"]), cwd=ROOT, env=env, stdout=stderr, stderr=stderr
        )
        try:
            deadline = time.monotonic() + 300
            while True:
                assert proc.poll() is None, Path(stderr.name).read_text()[-3000:]
                try:
                    if _request(port, "GET", "/ping", timeout=2).status == 200:
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, "no /ping"
                time.sleep(0.5)
            lines = Path(stderr.name).read_text().splitlines()
            init = next(json.loads(line) for line in lines if line.startswith('{"warmstart":"init"'))
            after_init = int(group.read(peak_file))
            limits = Config(model_dir=path, backend=None)
            half = limits.max_chars // 2
            body = {"inputs": ["文" * half] * limits.max_inputs, "prompt": "中" * half}
            started = time.monotonic()
            answer = _request(port, "POST", "/invocations", json.dumps(body, ensure_ascii=False).encode(), timeout=900)
            took = time.monotonic() - started
            alive = _request(port, "GET", "/ping", timeout=10).status == 200 and proc.poll() is None
            peak = int(group.read(peak_file))
            row = {
                "model": name,
                "status": answer.status,
                "alive": alive,
                "oom_killed": group.oom_killed(),
                "seconds": round(took, 1),
                "after_init_mb": round(after_init / 2**20),
                "peak_mb": round(peak / 2**20),
                "margin_mb": round((2**30 - peak) / 2**20),
                "limits": init.get("limits"),
            }
            print(json.dumps(row), flush=True)
            results.append(row)
        finally:
            proc.kill()
            proc.wait()
            stderr.close()
            group.kill()
            cgroups.release(group)
    cgroups.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-token", action="store_true")
    parser.add_argument("--worst", action="store_true")
    parser.add_argument("--long", action="store_true", help="also 512-token rows (LONG)")
    parser.add_argument("--models", default="default,bert-base")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    models = model_dirs(args.models.split(","))
    out: dict[str, Any] = {}
    if args.per_token:
        out["per_token"] = per_token(models, SHAPES + LONG if args.long else SHAPES)
    if args.worst:
        out["worst"] = worst(models)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
