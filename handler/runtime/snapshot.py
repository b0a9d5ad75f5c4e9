"""SnapStart hooks: make an initialized instance safe to snapshot, and a restored one unique again.

Before the snapshot (after init's warm-up): stop worker threads, drop network clients, collect garbage and
freeze what survives (so a forked copy's collector never writes to the template's pages). After restore:
reseed every RNG in use from fresh entropy, take a new instance id, reopen clients lazily, re-check the
device, and print one `{"warmstart": "restore", ...}` report line.

Two kinds of snapshot, told apart by `WARMSTART_SNAPSHOT`:
- `vm` (default): Lambda SnapStart. Firecracker freezes the whole VM, threads included.
- `fork`: the local Lambda's zygote (`warmstart local --snapshot`). fork() copies only the calling thread,
  so the template must hold no thread pool: the init phase builds the session with one intra-op thread
  and no tokenizer parallelism, and torch's threads are created lazily after restore.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from snapshot_restore_py import register_after_restore, register_before_snapshot

from handler.backends.device import probe_cuda
from handler.core.config import SnapshotMode, snapshot_mode
from handler.core.cpu import cpu_budget
from handler.core.manifest import Manifest
from handler.observability import report

__all__ = ["SnapshotHooks", "Snapshottable", "register", "reseed", "snapshot_mode"]


class Snapshottable(Protocol):
    """What the hooks need of the runtime (a Protocol, so this module does not import handler.runtime.invocation)."""

    config: Any
    instance_id: str

    @property
    def manifest(self) -> Manifest: ...
    @property
    def threads(self) -> int: ...

    def uses_cuda(self) -> bool: ...
    def release_for_snapshot(self) -> list[str]: ...
    def renew_identity(self, instance_id: str) -> None: ...
    def reopen_after_restore(self) -> list[str]: ...
    def restored(self, restore: dict[str, Any]) -> None: ...
    def set_threads(self, n: int) -> int: ...


def thread_count() -> int:
    """Threads alive in this process (what a fork would silently drop)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def reseed() -> list[str]:
    """Fresh entropy for every RNG a restored copy would otherwise share with its siblings."""
    seeded = ["random"]
    random.seed()  # os.urandom; Python reseeds on fork() but not on a VM restore
    # numpy imports numpy.random lazily (~20 ms): if nobody has, its global state does not exist yet and
    # will be seeded from fresh entropy when first used.
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()  # numpy reseeds on neither fork nor restore
        seeded.append("numpy")
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()  # CPU and, when initialized, every CUDA generator
        seeded.append("torch")
    return seeded


class SnapshotHooks:
    """The runtime's before-snapshot and after-restore steps (registered with `snapshot_restore_py`)."""

    def __init__(
        self,
        runtime: Snapshottable,
        mode: SnapshotMode,
        environ: Mapping[str, str] | None = None,
        emit: Callable[[dict[str, Any]], None] | None = report.emit,
    ) -> None:
        self.runtime = runtime
        self.mode = mode
        self.env = os.environ if environ is None else environ
        self.emit = emit
        self.snapshot_at: float | None = None  # wall clock: monotonic clocks do not survive a VM restore
        self.released: list[str] = []

    def before_snapshot(self) -> None:
        rt = self.runtime
        if self.mode == "fork" and rt.uses_cuda():
            # A CUDA context belongs to the process that made it; a forked child cannot use it.
            raise RuntimeError("a CUDA context cannot cross fork(): use WARMSTART_DEVICE=cpu with fork snapshots")
        self.released = rt.release_for_snapshot()
        gc.collect()
        # Objects that survive init live in the permanent generation: the collector no longer walks (and
        # so writes to) them, which keeps a forked copy's pages shared with the template's.
        gc.freeze()
        self.snapshot_at = time.time()
        if self.emit:
            self.emit(
                {
                    "warmstart": "snapshot",
                    "mode": self.mode,
                    "instance_id": rt.instance_id,
                    "released": self.released,
                    "threads_alive": thread_count(),
                    "gc_frozen": gc.get_freeze_count(),
                    **report.memory_mb(),
                }
            )

    def after_restore(self) -> None:
        rt = self.runtime
        timer = report.PhaseTimer()
        previous = rt.instance_id
        with timer.phase("reseed"):
            seeded = reseed()
        with timer.phase("identity"):
            rt.renew_identity(uuid.uuid4().hex)
        with timer.phase("device"):
            device = self._recheck_device()
        with timer.phase("threads"):
            threads = self._restore_threads()
        with timer.phase("clients"):
            reopened = rt.reopen_after_restore()
        restore = {
            "mode": self.mode,
            "phases_ms": dict(timer.phases),
            "total_ms": timer.total_ms(),
            "snapshot_age_ms": round((time.time() - self.snapshot_at) * 1000, 1) if self.snapshot_at else None,
            "reseeded": seeded,
            "device": device,
            "threads": threads,
            "reopened": reopened,
        }
        rt.restored(restore)
        if self.emit:
            self.emit(
                {
                    "warmstart": "restore",
                    "instance_id": rt.instance_id,
                    "snapshot_instance_id": previous,
                    "model": rt.manifest.key,
                    **restore,
                    **report.memory_mb(),
                }
            )

    def _recheck_device(self) -> dict[str, Any]:
        probe = probe_cuda(self.runtime.config.device)
        if self.runtime.uses_cuda() and not probe.usable:
            # The snapshot was taken with a device this host does not have: refuse to serve from it.
            raise RuntimeError(f"the snapshot used CUDA but after restore: {probe.reason}")
        return {"cuda": probe.usable, "reason": probe.reason}

    def _restore_threads(self) -> dict[str, Any]:
        """fork mode: threads the template could not hold are created now, for this copy's CPU share."""
        if self.mode != "fork":
            return {"intra_op": self.runtime.threads}
        budget = cpu_budget(self.env)
        return {"intra_op": self.runtime.set_threads(self.runtime.config.threads or budget.cpus)}


def register(runtime: Snapshottable, environ: Mapping[str, str] | None = None) -> SnapshotHooks | None:
    """Register the hooks when this init will be snapshotted; a no-op (None) otherwise."""
    mode = snapshot_mode(environ)
    if mode is None:
        return None
    hooks = SnapshotHooks(runtime, mode, environ)
    register_before_snapshot(hooks.before_snapshot)
    register_after_restore(hooks.after_restore)
    return hooks
