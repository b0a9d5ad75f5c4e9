"""handler.app's init: the cyclic GC paused while it runs and back on after, and what it no longer imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import gc, json, sys
runs = []
gc.callbacks.append(lambda phase, info: runs.append(info["generation"]) if phase == "start" else None)
import handler.app
print(json.dumps({"collections": len(runs), "enabled": gc.isenabled(), "frozen": gc.get_freeze_count(),
                  "modules": sorted(m for m in ("dataclasses",) if m in sys.modules)}))
"""


def test_init_runs_without_collections_then_the_gc_is_back_on_with_init_frozen(model_dir: Path) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("WARMSTART_", "OPENBLAS_", "AWS_"))}
    env = {**base, "WARMSTART_MODEL": str(model_dir), "WARMSTART_BACKEND": "onnx", "WARMSTART_WARMUP": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    # Before the pause, the imports up to handler.app's first line set off a few young collections at most;
    # with it off, init's own hundreds of thousands of allocations set off dozens.
    assert seen["collections"] <= 3, seen
    assert seen["enabled"] and seen["frozen"] > 10_000, seen
    assert seen["modules"] == [], "the init path imports these again: " + ", ".join(seen["modules"])
