"""How many CPUs this process may really use: affinity, cgroup quota and Lambda's memory-to-vCPU rule.

`os.cpu_count()` reports the host's cores; on Lambda and in containers that over-subscribes threads,
and spinning threads burn billed CPU time for nothing.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# Lambda allocates one vCPU per 1,769 MB of configured memory.
LAMBDA_MB_PER_VCPU = 1769


@dataclass(frozen=True)
class CpuBudget:
    cpus: int
    source: str  # which bound decided: affinity, cgroup-v2, cgroup-v1, lambda-memory
    detail: dict[str, float | int | None]


def _cgroup_quota(root: Path) -> tuple[float | None, str]:
    v2 = root / "cpu.max"
    try:
        quota, period = v2.read_text().split()[:2]
        return (None if quota == "max" else int(quota) / int(period)), "cgroup-v2"
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return (quota_us / period_us if quota_us > 0 else None), "cgroup-v1"
    except (OSError, ValueError):
        return None, "none"


def cpu_budget(environ: Mapping[str, str] | None = None, cgroup_root: Path = Path("/sys/fs/cgroup")) -> CpuBudget:
    env = os.environ if environ is None else environ
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    bounds: list[tuple[float, str]] = [(affinity, "affinity")]
    quota, kind = _cgroup_quota(cgroup_root)
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
