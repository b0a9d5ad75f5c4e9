"""How many CPUs this process may really use: affinity, cgroup quota and Lambda's memory-to-vCPU rule.

`os.cpu_count()` reports the host's cores; on Lambda and in containers that over-subscribes threads,
and spinning threads burn billed CPU time for nothing.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

from handler.core.records import record

# Lambda allocates one vCPU per 1,769 MB of configured memory.
LAMBDA_MB_PER_VCPU = 1769


@record
class CpuBudget:
    cpus: int
    source: str  # which bound decided: affinity, cgroup-v2, cgroup-v1, lambda-memory
    detail: dict[str, float | int | None]


def own_cgroup(proc_cgroup: Path | None, controller: str = "cpu") -> tuple[str, str]:
    """(v2 path, v1 `controller` path) of this process. Inside a container's cgroup namespace both are "/";
    outside one (the local Lambda puts each instance in its own cgroup) the limit is on the process's own
    cgroup, not on the hierarchy's root."""
    v2 = v1 = "/"
    if proc_cgroup is None:
        return v2, v1
    try:
        for line in proc_cgroup.read_text().splitlines():
            hid, controllers, path = line.split(":", 2)
            if hid == "0" and not controllers:
                v2 = path
            elif controller in controllers.split(","):
                v1 = path
    except (OSError, ValueError):
        pass
    return v2, v1


def _cgroup_quota(root: Path, proc_cgroup: Path | None = None) -> tuple[float | None, str]:
    own_v2, own_v1 = own_cgroup(proc_cgroup)
    for base in dict.fromkeys([root / own_v2.lstrip("/"), root]):  # own cgroup first, then the root
        try:
            quota, period = (base / "cpu.max").read_text().split()[:2]
            return (None if quota == "max" else int(quota) / int(period)), "cgroup-v2"
        except (OSError, ValueError):
            pass
    for base in dict.fromkeys([root / "cpu" / own_v1.lstrip("/"), root / "cpu"]):
        try:
            quota_us = int((base / "cpu.cfs_quota_us").read_text())
            period_us = int((base / "cpu.cfs_period_us").read_text())
            return (quota_us / period_us if quota_us > 0 else None), "cgroup-v1"
        except (OSError, ValueError):
            pass
    return None, "none"


def cpu_budget(
    environ: Mapping[str, str] | None = None,
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    proc_cgroup: Path | None = Path("/proc/self/cgroup"),
) -> CpuBudget:
    env = os.environ if environ is None else environ
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    bounds: list[tuple[float, str]] = [(affinity, "affinity")]
    quota, kind = _cgroup_quota(cgroup_root, proc_cgroup)
    if quota is not None:
        bounds.append((quota, kind))
    memory_mb = env.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE")
    lambda_vcpus = None
    if memory_mb and memory_mb.isdigit():
        lambda_vcpus = int(memory_mb) / LAMBDA_MB_PER_VCPU
        bounds.append((lambda_vcpus, "lambda-memory"))
    value, source = min(bounds, key=lambda b: b[0])
    return CpuBudget(
        cpus=max(1, math.floor(value + 1e-9)),
        source=source,
        detail={"affinity": affinity, "cgroup_quota": quota, "lambda_vcpus": lambda_vcpus},
    )


@record
class ThreadPlan:
    """Intra-op threads per model run, for a process running `runs` model runs at once on `cpus` CPUs."""

    threads: int
    runs: int
    spin: bool
    why: str

    def describe(self) -> dict[str, int | bool | str]:
        return {"intra_op": self.threads, "runs": self.runs, "spin": self.spin, "why": self.why}


def plan_threads(cpus: int, runs: int = 1, threads: int | None = None, spin_allowed: bool = True) -> ThreadPlan:
    """The CPUs' share per model run (`cpus // runs`, at least 1) unless `threads` is set; spinning only
    where every intra-op thread of every run has a CPU to itself (a spinning thread on a shared CPU takes
    the time the other run needed) and `spin_allowed` (not on Lambda, where spinning is billed)."""
    cpus, runs = max(1, cpus), max(1, runs)
    chosen = threads or max(1, cpus // runs)
    fits = chosen * runs <= cpus
    spin = spin_allowed and chosen > 1 and fits
    if threads:
        why = f"set (WARMSTART_THREADS or the caller): {chosen} x {runs} runs"
    else:
        why = f"{cpus} CPUs / {runs} runs at once"
    if not fits:
        why += f"; over-subscribed ({chosen * runs} threads on {cpus} CPUs): no spinning"
    elif chosen > 1 and not spin_allowed:
        why += "; no spinning (billed CPU time)"
    return ThreadPlan(chosen, runs, spin, why)
