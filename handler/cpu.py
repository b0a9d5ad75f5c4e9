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


def own_cgroups(proc_cgroup: Path = Path("/proc/self/cgroup")) -> dict[str, str]:
    """This process's cgroup path per hierarchy: `""` for v2's unified one, `"cpu"` for v1's cpu controller.
    In a container with its own cgroup namespace both are `/`; a process placed in a child cgroup (a bench,
    systemd slices) has its own path, whose quota the root's files do not show."""
    paths: dict[str, str] = {}
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        for controller in controllers.split(","):
            paths.setdefault(controller, path)
    return paths


def _chain(base: Path, path: str) -> list[Path]:
    """`base/path` and each of its parents up to `base`, deepest first; only those that exist."""
    parts = [p for p in path.split("/") if p and p != ".."]
    dirs = [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
    return [d for d in dirs if d.is_dir()] or [base]


def _v2_quota(folder: Path) -> float | None:
    quota, period = (folder / "cpu.max").read_text().split()[:2]
    return None if quota == "max" else int(quota) / int(period)


def _v1_quota(folder: Path) -> float | None:
    quota_us = int((folder / "cpu.cfs_quota_us").read_text())
    period_us = int((folder / "cpu.cfs_period_us").read_text())
    return quota_us / period_us if quota_us > 0 else None


def _cgroup_quota(root: Path, own: dict[str, str]) -> tuple[float | None, str]:
    """The tightest quota on this process's cgroup and its ancestors (a child can't use more than its parent)."""
    for kind, base, path, read in (
        ("cgroup-v2", root, own.get("", "/"), _v2_quota),
        ("cgroup-v1", root / "cpu", own.get("cpu", "/"), _v1_quota),
    ):
        quotas: list[float] = []
        seen = False
        for folder in _chain(base, path):
            try:
                quota = read(folder)
            except (OSError, ValueError):
                continue
            seen = True
            if quota is not None:
                quotas.append(quota)
        if seen:
            return (min(quotas) if quotas else None), kind
    return None, "none"


def cpu_budget(
    environ: Mapping[str, str] | None = None,
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    proc_cgroup: Path = Path("/proc/self/cgroup"),
) -> CpuBudget:
    env = os.environ if environ is None else environ
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    bounds: list[tuple[float, str]] = [(affinity, "affinity")]
    quota, kind = _cgroup_quota(cgroup_root, own_cgroups(proc_cgroup))
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
