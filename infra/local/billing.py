"""What an instance's REPORT lines say about its start: Init Duration, Restore Duration, INIT billing.

Lambda times init from the runtime's start to its first /next (a restore: from the restore to it), bills
INIT for on-demand functions only, and charges an invocation that met an init that never finished with
what the init took until then.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from infra.local.invocation import Invocation


def _ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0


@dataclass
class InitClock:
    restored_copy: bool  # forked from a snapshot: it ran no init of its own, only a restore
    bill_init: bool
    spawned_at: float = 0.0
    restore_at: float | None = None  # when a snap-start runtime asked for /restore/next
    init_duration_ms: float | None = None
    restore_duration_ms: float | None = None

    def start(self) -> None:
        self.spawned_at = time.perf_counter()

    def restore_started(self) -> None:
        self.restore_at = time.perf_counter()

    def snapshot_taken(self) -> None:
        self.init_duration_ms = _ms_since(self.spawned_at)

    def first_next(self) -> None:
        """The first /next: init (or restore) is over."""
        if self.restored_copy:  # restored, not initialized: Lambda reports only the restore
            self.restore_duration_ms = _ms_since(self.spawned_at)
        elif self.restore_at is not None:
            self.init_duration_ms = (self.restore_at - self.spawned_at) * 1000.0
            self.restore_duration_ms = _ms_since(self.restore_at)
        else:
            self.init_duration_ms = _ms_since(self.spawned_at)

    def charge(self, inv: Invocation) -> None:
        """Put the init (or restore) on the invocation that met it."""
        inv.restore_duration_ms = self.restore_duration_ms
        inv.bill_init = self.bill_init
        if self.restored_copy:
            if inv.restore_duration_ms is None and self.spawned_at:  # restore failed: what it took until now
                inv.restore_duration_ms = _ms_since(self.spawned_at)
            return
        inv.init_duration_ms = self.init_duration_ms
        if inv.init_duration_ms is None:  # init never finished: charge what it took until now
            inv.init_duration_ms = _ms_since(self.spawned_at)
