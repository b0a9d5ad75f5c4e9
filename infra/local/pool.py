"""The instances of one function: placement (warm first, else a cold start), throttling, reaping idle ones."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time

from infra.local import runtime_api
from infra.local.cgroups import Cgroups, vcpus_for
from infra.local.config import LocalLambdaConfig
from infra.local.instances import Instance
from infra.local.invocation import EXIT_ERROR, Invocation, Outcome
from infra.local.slots import InitSlots
from infra.local.template import Template

THROTTLE_REASON = "ReservedFunctionConcurrentInvocationLimitExceeded"


class Throttled(Exception):
    """No free instance and the function is at its maximum concurrency."""


class InstancePool:
    def __init__(self, config: LocalLambdaConfig) -> None:
        self.config = config
        self.instances: dict[str, Instance] = {}
        self.retired: list[Instance] = []  # killed, exit not yet observed (shutdown waits for them)
        self.templates: dict[str, Template] = {}  # version -> its snapshot template (config.snapshot)
        self.spawned = 0
        self.inflight = 0
        self.closed = False
        self._capacity: asyncio.Event | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._starting: set[asyncio.Task[None]] = set()  # strong refs: the loop keeps only weak ones
        self.cgroups = Cgroups("none", "not started", [])
        self.slots = InitSlots(1)

    def start(self) -> None:
        self._capacity = asyncio.Event()
        self._reaper = asyncio.ensure_future(self._reap_forever())
        self.cgroups = Cgroups.detect(self.config.cgroups)
        slots = self.config.init_slots or init_slots(self.config.memory_mb, self.cgroups.mode)
        # An init's CPU share: its quota, or (unconfined) the one core a Python init uses at most.
        vcpus = vcpus_for(self.config.memory_mb) if self.cgroups.mode != "none" else 1.0
        self.slots = InitSlots(slots, vcpus=vcpus)

    # -- placement -------------------------------------------------------------------------------------

    def dispatch(self, inv: Invocation) -> None:
        """Place an invocation or raise Throttled. Synchronous, so concurrent invokes cannot race."""
        if self.closed or self.inflight >= self.config.max_concurrency:
            raise Throttled
        if not self._place(inv):
            raise Throttled
        self.inflight += 1
        inv.done.add_done_callback(self._released)

    def _place(self, inv: Invocation) -> bool:
        warm = self._pick(inv.version)
        if warm is not None:
            warm.assign(inv)
            return True
        if len(self.instances) >= self.config.max_concurrency and not self._evict_idle():
            return False
        template = self.template(inv.version)
        instance = Instance(self.config, inv.version, self, template=template, cgroups=self.cgroups, slots=self.slots)
        runtime_api.bind(instance)
        instance.assign(inv)
        self.instances[instance.instance_id] = instance
        self.spawned += 1
        task = asyncio.ensure_future(instance.start())
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)
        return True

    def template(self, version: str) -> Template | None:
        """The version's snapshot template, started on first need (and again after one died)."""
        if not self.config.snapshot:
            return None
        current = self.templates.get(version)
        if current is None or current.dead:
            current = self.templates[version] = Template(self.config, version, self.cgroups, self.slots)
            current.start()
        return current

    def _pick(self, version: str) -> Instance | None:
        """The most recently parked free instance of this version; else one about to ask for more work."""
        parked: Instance | None = None
        finishing: Instance | None = None
        for inst in self.instances.values():
            if inst.version != version or not inst.free:
                continue
            if inst.parked:
                if parked is None or inst.idle_since > parked.idle_since:
                    parked = inst
            elif inst.state == "ready" and finishing is None:
                finishing = inst
        return parked or finishing

    def _evict_idle(self) -> bool:
        """Make room by retiring the longest-idle parked instance (another version's, necessarily)."""
        idle = [i for i in self.instances.values() if i.parked and i.free]
        if not idle:
            return False
        self.retire(min(idle, key=lambda i: i.idle_since))
        return True

    def retire(self, inst: Instance) -> None:
        self.instances.pop(inst.instance_id, None)
        self.retired.append(inst)
        inst.kill()

    def _released(self, _fut: object) -> None:
        self.inflight -= 1
        if self._capacity is not None:
            self._capacity.set()

    async def wait_capacity(self, timeout: float) -> None:
        assert self._capacity is not None
        self._capacity.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._capacity.wait(), timeout)

    # -- Owner callbacks from instances ----------------------------------------------------------------

    def instance_ready(self, instance: Instance) -> None:
        if self._capacity is not None:
            self._capacity.set()

    def instance_gone(self, instance: Instance, orphan: Invocation | None) -> None:
        self.instances.pop(instance.instance_id, None)
        with contextlib.suppress(ValueError):
            self.retired.remove(instance)
        if orphan is not None and not self.closed and not self._place(orphan):
            # Its instance died between invocations and no room is left: Lambda would retry it; we
            # answer like the dead instance would have.
            orphan.finish(Outcome.error(EXIT_ERROR, "Runtime exited before the event was delivered"), memory_mb=0)
        if self._capacity is not None:
            self._capacity.set()

    # -- idle reaping and shutdown ---------------------------------------------------------------------

    async def _reap_forever(self) -> None:
        period = max(0.05, min(1.0, self.config.keep_alive_s / 4))
        while not self.closed:
            await asyncio.sleep(period)
            cutoff = time.monotonic() - self.config.keep_alive_s
            for inst in list(self.instances.values()):
                if inst.parked and inst.free and inst.idle_since <= cutoff:
                    self.retire(inst)

    async def close(self, timeout: float = 5.0) -> None:
        """Kill every instance's process group and wait until each exit has been seen."""
        self.closed = True
        if self._reaper is not None:
            self._reaper.cancel()
        everyone = [*self.instances.values(), *self.retired, *(t.instance for t in self.templates.values())]
        for inst in everyone:
            inst.shutdown()
        waits = [inst.exited for inst in everyone if inst.exited is not None]
        if waits:
            await asyncio.wait(waits, timeout=timeout)
        self.instances.clear()
        self.retired.clear()
        self.templates.clear()
        self.cgroups.close()


def init_slots(memory_mb: int, mode: str) -> int:
    """Inits that fit at once: each gets its full quota of the host's cores (unconfined: a core each,
    which a single-threaded Python init uses at most)."""
    cores = len(os.sched_getaffinity(0))
    if mode == "none":
        return cores
    return max(1, math.floor(cores / vcpus_for(memory_mb, cores) + 1e-9))
