"""SnapStart hooks in-process: mode parsing, reseeding, identity, release/reopen, device re-check."""

from __future__ import annotations

import gc
import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.backends.device import CudaProbe
from handler.core.config import Config
from handler.core.errors import ConfigError
from handler.runtime import snapshot
from handler.runtime.invocation import Runtime
from handler.runtime.snapshot import SnapshotHooks, reseed, snapshot_mode
from tests.conftest import invoke

SNAP = {"AWS_LAMBDA_INITIALIZATION_TYPE": "snap-start"}


@pytest.fixture(autouse=True)
def _unfreeze() -> Iterator[None]:
    yield
    gc.unfreeze()  # before_snapshot freezes the collector's view of the whole (test) process


def test_mode_is_none_unless_snap_start() -> None:
    assert snapshot_mode({}) is None
    assert snapshot_mode({"AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand", "WARMSTART_SNAPSHOT": "fork"}) is None
    assert snapshot_mode(SNAP) == "vm"
    assert snapshot_mode({**SNAP, "WARMSTART_SNAPSHOT": "fork"}) == "fork"


def test_unknown_mode_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="valid values: vm, fork"):
        snapshot_mode({**SNAP, "WARMSTART_SNAPSHOT": "criu"})


def test_reseed_breaks_the_shared_sequence() -> None:
    import torch

    def draws() -> tuple[float, float, float]:
        return random.random(), float(np.random.random()), float(torch.rand(1).item())

    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    snapshot = draws()  # what every restored copy would draw without the hook
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    seeded = reseed()
    after = draws()
    assert set(seeded) == {"random", "numpy", "torch"}
    assert all(a != b for a, b in zip(after, snapshot, strict=True))


def runtime(model_dir: Path, environ: dict[str, str]) -> Runtime:
    return Runtime.start(Config(model_dir=model_dir, backend="onnx"), environ=environ, emit=None)


def test_hooks_give_a_restored_instance_a_new_identity(model_dir: Path) -> None:
    rt = runtime(model_dir, SNAP)
    before = invoke(rt, {"inputs": ["same input, same output"]})
    rt.handle({"warmer": True})
    old_id = rt.instance_id
    records: list[dict[str, Any]] = []
    hooks = SnapshotHooks(rt, "vm", SNAP, emit=records.append)
    hooks.before_snapshot()
    hooks.after_restore()
    assert [r["warmstart"] for r in records] == ["snapshot", "restore"]
    snap, restore = records
    assert snap["instance_id"] == old_id == restore["snapshot_instance_id"]
    assert rt.instance_id == restore["instance_id"] != old_id
    assert rt.init_report["restore"]["total_ms"] == restore["total_ms"]
    status = rt.status()
    assert status["instance_id"] == rt.instance_id and status["invocations"]["total"] == 0
    assert status["restore"]["mode"] == "vm"
    ping = rt.handle({"warmer": True})
    assert ping["instance_id"] == rt.instance_id and ping["cold"] is True  # first call of this instance
    assert invoke(rt, {"inputs": ["same input, same output"]})["embeddings"] == before["embeddings"]


def test_fork_template_builds_with_one_thread_and_no_tokenizer_pool(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    rt = Runtime.start(
        Config(model_dir=model_dir, backend="onnx", threads=4),
        environ={**SNAP, "WARMSTART_SNAPSHOT": "fork"},
        emit=None,
    )
    assert rt.init_report["snapshot"] == "fork"
    assert rt.init_report["threads"]["intra_op"] == 1 and rt.init_report["threads"]["bound_by"] == "fork-snapshot"
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"


def test_workers_are_released_before_and_rebuilt_after(model_dir: Path) -> None:
    rt = runtime(model_dir, {**SNAP, "AWS_LAMBDA_MAX_CONCURRENCY": "2"})
    assert rt.workers is not None
    old = rt.workers
    hooks = SnapshotHooks(rt, "vm", SNAP, emit=None)
    hooks.before_snapshot()
    assert hooks.released == ["workers"]
    hooks.after_restore()
    assert rt.workers is not old
    assert len(rt.handle({"inputs": ["served by a rebuilt worker pool"]})["embeddings"]) == 1


def test_a_snapshot_taken_on_cuda_refuses_to_restore_without_it(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime(model_dir, SNAP)
    monkeypatch.setattr(rt, "uses_cuda", lambda: True)  # as if init had put the model on a GPU
    monkeypatch.setattr(snapshot, "probe_cuda", lambda _mode: CudaProbe(False, "no NVIDIA driver"))
    hooks = SnapshotHooks(rt, "vm", SNAP, emit=None)
    hooks.before_snapshot()
    with pytest.raises(RuntimeError, match="the snapshot used CUDA but after restore"):
        hooks.after_restore()
    with pytest.raises(RuntimeError, match="cannot cross fork"):
        SnapshotHooks(rt, "fork", SNAP, emit=None).before_snapshot()


def test_the_models_watcher_thread_stops_before_and_restarts_after(model_dir: Path) -> None:
    rt = Runtime.start(
        Config.from_environ({"WARMSTART_MODEL": str(model_dir), "WARMSTART_IDLE_UNLOAD_S": "60"}),
        environ=SNAP,
        emit=None,
    )
    assert rt.watcher is not None

    def watching() -> bool:
        return any(t.name == "warmstart-models" and t.is_alive() for t in threading.enumerate())

    assert watching()
    hooks = SnapshotHooks(rt, "fork", SNAP, emit=None)
    hooks.before_snapshot()
    assert "models-watcher" in hooks.released and not watching()  # no thread for fork() to lose
    hooks.after_restore()
    assert watching()
    rt.watcher.stop()
