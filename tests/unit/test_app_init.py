"""handler.app's init: the cyclic GC paused while it runs and back on after, and what it no longer imports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


IMPORTER = """
import sys
class Finder:
    def find_spec(self, name, path, target=None):
        if name == "numpy" and "numpy" not in sys.modules:
            # find_spec <- _find_spec <- _find_and_load_unlocked <- _find_and_load <- the importing module
            print("importer", sys._getframe(4).f_globals.get("__name__"), flush=True)
        return None
sys.meta_path.insert(0, Finder())
import handler.app
"""


IMPORT = "import handler.app"


def _init_env(model_dir: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("WARMSTART_", "OPENBLAS_", "AWS_"))}
    return {**base, "WARMSTART_MODEL": str(model_dir), "WARMSTART_BACKEND": "onnx", "WARMSTART_WARMUP": "0"}


def test_numpy_is_imported_by_the_entry_module_itself(model_dir: Path) -> None:
    # From the depth the chain below would reach it at, numpy's import tree ran across the end of CPython's
    # 16 KiB frame chunks hundreds of times (a mmap + munmap + page fault each); handler.app imports it first
    # (at a start that is not lean: a lean one imports it on its own thread, tests/functional/test_lean_start.py).
    proc = subprocess.run(
        [sys.executable, "-c", IMPORTER],
        cwd=ROOT,
        env={**_init_env(model_dir), "WARMSTART_LEAN_START": "0"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "importer handler.app" in proc.stdout.splitlines(), proc.stdout[-2000:]


@pytest.mark.skipif(shutil.which("strace") is None, reason="counts the start's system calls with strace")
def test_init_does_not_map_and_unmap_frame_chunks_over_and_over(model_dir: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=mmap,munmap", "-o", str(trace), sys.executable, "-c", IMPORT],
        cwd=ROOT,
        env=_init_env(model_dir),
        capture_output=True,
        timeout=120,
        check=True,
    )
    # An anonymous 16 KiB mapping is a frame chunk (Python's arenas are 256 KiB): a start makes a couple; a
    # chunk boundary inside numpy's import tree made 71 here (656 under awslambdaric's deeper stack).
    chunks = trace.read_text().count("mmap(NULL, 16384, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0)")
    assert chunks <= 8, chunks
