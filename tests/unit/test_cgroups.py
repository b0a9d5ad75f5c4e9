"""Cgroups.detect / create on fake cgroup trees: v2 preferred where delegated, v1 otherwise, files as Lambda's rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infra.local.cgroups import Cgroups, vcpus_for


def fake_host(tmp_path: Path, *, v2_controllers: str | None, v1: bool) -> tuple[Path, Path]:
    mounts, proc = tmp_path / "mounts", tmp_path / "cgroup"
    lines, own = [], []
    if v2_controllers is not None:
        unified = tmp_path / "unified" / "me"
        unified.mkdir(parents=True)
        (unified / "cgroup.controllers").write_text(v2_controllers + "\n")
        lines.append(f"cgroup2 {tmp_path / 'unified'} cgroup2 rw 0 0")
        own.append("0::/me")
    if v1:
        for name in ("cpu", "memory"):
            (tmp_path / name / "me").mkdir(parents=True)
            lines.append(f"cgroup {tmp_path / name} cgroup rw,relatime,{name} 0 0")
        own += ["4:memory:/me", "1:cpu:/me"]
    mounts.write_text("\n".join(lines) + "\n")
    proc.write_text("\n".join(own) + "\n")
    return proc, mounts


def test_v2_is_used_where_cpu_and_memory_are_delegated(tmp_path: Path) -> None:
    proc, mounts = fake_host(tmp_path, v2_controllers="cpuset cpu io memory pids", v1=True)
    groups = Cgroups.detect(proc_cgroup=proc, mounts=mounts)
    assert groups.mode == "v2" and groups.bases[0].parent == tmp_path / "unified" / "me"
    assert (tmp_path / "unified" / "me" / "cgroup.subtree_control").read_text() == "+cpu +memory"
    group = groups.create("abc", 512)
    assert group is not None
    assert group.read("cpu.max") == f"{int(512 / 1769 * 100_000)} 100000"
    assert group.read("memory.max") == str(512 << 20)
    assert group.read("memory.oom.group") == "1"
    argv = group.wrap(["python", "-m", "awslambdaric", "h.f"])
    assert argv[:2] == ["/bin/sh", "-c"] and argv[-5:] == ["--", "python", "-m", "awslambdaric", "h.f"]
    assert str(groups.bases[0] / "abc" / "cgroup.procs") in argv


def test_v1_when_v2_lacks_the_controllers(tmp_path: Path) -> None:
    proc, mounts = fake_host(tmp_path, v2_controllers="hugetlb", v1=True)
    groups = Cgroups.detect(proc_cgroup=proc, mounts=mounts)
    assert groups.mode == "v1"
    group = groups.create("abc", 3008)
    assert group is not None
    assert group.read("cpu.cfs_quota_us") == str(int(vcpus_for(3008) * 100_000))
    assert group.read("memory.limit_in_bytes") == str(3008 << 20)
    assert "cgroups: v1; each instance gets" in groups.describe(3008)
    assert Cgroups.detect("v2", proc_cgroup=proc, mounts=mounts).reason.startswith(
        "v2: controllers cpu, memory not delegated"
    )


def test_oom_kills_are_read_from_the_memory_cgroup(tmp_path: Path) -> None:
    proc, mounts = fake_host(tmp_path, v2_controllers=None, v1=True)
    group = Cgroups.detect(proc_cgroup=proc, mounts=mounts).create("abc", 128)
    assert group is not None
    (group.memory_dir / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    assert not group.oom_killed()
    (group.memory_dir / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert group.oom_killed()


@pytest.mark.skipif(os.geteuid() != 0, reason="stale directories are only reaped where we may remove them")
def test_leftovers_of_a_dead_local_lambda_are_removed_at_the_next_start(tmp_path: Path) -> None:
    proc, mounts = fake_host(tmp_path, v2_controllers=None, v1=True)
    stale = tmp_path / "cpu" / "me" / "warmstart-999999999-1"
    (stale / "old-instance").mkdir(parents=True)
    groups = Cgroups.detect(proc_cgroup=proc, mounts=mounts)
    assert groups.mode == "v1" and not stale.exists()
