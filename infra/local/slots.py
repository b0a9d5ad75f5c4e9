"""Init slots: how many instance inits may run at once on this host.

An instance waits here before its init clock starts: N cold starts on a small host then each run under
their quota (as on Lambda, where every sandbox has its CPU) instead of all sharing the host's cores and
timing out together.
"""

from __future__ import annotations

import asyncio


class InitSlots:
    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._sem = asyncio.Semaphore(slots)
        self.running = 0
        self.peak = 0  # the most inits seen running at once (tests and benches read it)

    async def acquire(self) -> None:
        await self._sem.acquire()
        self.running += 1
        self.peak = max(self.peak, self.running)

    def release(self) -> None:
        self.running -= 1
        self._sem.release()
