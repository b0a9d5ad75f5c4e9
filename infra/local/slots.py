"""Init slots: how much instance init this host runs at once. They ration CPU, not wall time.

An instance waits here before its init clock starts: N cold starts on a small host then each run under
their quota (as on Lambda, where every sandbox has its CPU) instead of all sharing the host's cores and
timing out together. But an init that sleeps or blocks (a download, a lock, a `time.sleep`) uses no CPU,
and on Lambda it would not hold anyone else back: holding its slot would serialize such inits, failing N of
them at T, 2T, ... NT instead of all at T. So each holder's CPU time is sampled every `window_s`; one that
used under `idle_share` of its quota in the last window does not count, and the next waiting init starts.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

CpuProbe = Callable[[], float | None]  # a holder's CPU seconds so far (None: no process yet)


class Slot:
    """One init holding (or waiting for) a slot, and whether it used CPU in the last window."""

    def __init__(self, cpu: CpuProbe) -> None:
        self.cpu = cpu
        self.active = True  # until a whole window shows otherwise
        self._last: tuple[float, float] | None = None  # (monotonic time, CPU seconds) at the last sample

    def sample(self, min_cpu_share: float) -> None:
        """Active: used at least `min_cpu_share` of one CPU since the last sample (or not measurable yet)."""
        cpu, now = self.cpu(), time.monotonic()
        if cpu is None:
            self.active, self._last = True, None
            return
        if self._last is not None and now > self._last[0]:
            self.active = (cpu - self._last[1]) / (now - self._last[0]) >= min_cpu_share
        self._last = (now, cpu)


class InitSlots:
    def __init__(self, slots: int, *, vcpus: float = 1.0, window_s: float = 0.2, idle_share: float = 0.1) -> None:
        self.slots = slots
        self.window_s = window_s
        self.min_cpu_share = idle_share * vcpus  # of one CPU: below it, a holder is not running
        self.running = 0  # inits holding a slot, running or not
        self.peak = 0  # the most inits seen using CPU at once (tests and benches read it)
        self._holders: list[Slot] = []
        self._waiting: collections.deque[tuple[asyncio.Future[None], Slot]] = collections.deque()
        self._watcher: asyncio.Task[None] | None = None

    def busy(self) -> int:
        """Holders that count against the slots: those using CPU (or just starting)."""
        return sum(1 for slot in self._holders if slot.active)

    async def acquire(self, cpu: CpuProbe) -> Slot:
        """Wait until fewer than `slots` holders use CPU; `cpu` reads this init's CPU seconds."""
        slot = Slot(cpu)
        if not self._waiting and self.busy() < self.slots:
            self._admit(slot)
            return slot
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((fut, slot))
        self._watch()
        try:
            await fut
        except asyncio.CancelledError:
            if slot in self._holders:  # admitted as it was cancelled
                self.release(slot)
            raise
        return slot

    def release(self, slot: Slot) -> None:
        if slot in self._holders:
            self._holders.remove(slot)
            self.running -= 1
            self._wake()

    def _admit(self, slot: Slot) -> None:
        self._holders.append(slot)
        self.running += 1
        self.peak = max(self.peak, self.busy())
        self._watch()

    def _wake(self) -> None:
        while self._waiting and self.busy() < self.slots:
            fut, slot = self._waiting.popleft()
            if not fut.done():
                self._admit(slot)
                fut.set_result(None)

    def _watch(self) -> None:
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.ensure_future(self._sample_forever())

    async def _sample_forever(self) -> None:
        """While inits hold slots: sample each one's CPU time every window, and let waiting ones in."""
        while self._holders:
            for slot in self._holders:
                slot.sample(self.min_cpu_share)
            self.peak = max(self.peak, self.busy())
            self._wake()
            await asyncio.sleep(self.window_s)
