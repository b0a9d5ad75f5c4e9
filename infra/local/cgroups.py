"""Memory size made real: each instance in its own cgroup, with Lambda's CPU share and memory limit.

Lambda gives a function 1 vCPU per 1,769 MB of memory (at most 6) and kills it when it exceeds its memory
size. Locally, every instance gets a cgroup with a CPU quota of memory/1,769 vCPU (also capped at the
host's cores: a quota above them limits nothing) and a hard memory limit of the memory size. cgroup v2 is
used where the controllers are delegated to us, else the v1 `cpu` and `memory` hierarchies (root on most
hosts); where neither can be written, `describe()` says why and instances run unconfined.

Layout: `<own cgroup>/warmstart-<pid>-<n>/<instance id>`, under the cgroup this process already runs in, so
the host's own limits still apply to everything the local Lambda starts. Empty directories are removed on
exit, and left-overs of dead local Lambdas at the next start.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# One rule for both sides: the quota given here is what the handler's thread sizing reads back.
from handler.core.cpu import LAMBDA_MB_PER_VCPU

Mode = Literal["v2", "v1", "none"]
Want = Literal["auto", "v2", "v1", "off"]
WANTS: tuple[Want, ...] = ("auto", "v2", "v1", "off")

LAMBDA_MAX_VCPUS = 6
PERIOD_US = 100_000
_counter = itertools.count(1)

# Prefix of the shell line that moves a spawned runtime into its cgroup before exec: the move happens
# before the first byte of Python runs, so init is measured and charged inside the quota, and no
# preexec_fn runs Python in a child forked from a threaded process. dash costs ~1 ms.
_ENTER = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 126; shift; done; shift; exec "$@"'


def vcpus_for(memory_mb: int, host_cpus: int | None = None) -> float:
    """Lambda's CPU share for a memory size, capped at 6 vCPU and at what this host can give."""
    cores = host_cpus if host_cpus is not None else len(os.sched_getaffinity(0))
    return min(memory_mb / LAMBDA_MB_PER_VCPU, LAMBDA_MAX_VCPUS, cores)


def _own_paths(proc_cgroup: Path) -> tuple[dict[str, str], str | None]:
    """(v1 controller -> path, v2 path) of this process, from /proc/self/cgroup."""
    v1: dict[str, str] = {}
    v2 = None
    for line in proc_cgroup.read_text().splitlines():
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and not controllers:
            v2 = path
        for name in controllers.split(","):
            if name:
                v1[name] = path
    return v1, v2


def _mounts(mounts: Path) -> tuple[dict[str, Path], Path | None]:
    """(v1 controller -> mount point, cgroup2 mount point) from /proc/mounts."""
    v1: dict[str, Path] = {}
    v2 = None
    for line in mounts.read_text().splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        if fields[2] == "cgroup2":
            v2 = Path(fields[1])
        elif fields[2] == "cgroup":
            for option in fields[3].split(","):
                v1.setdefault(option, Path(fields[1]))
    return v1, v2


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _rmdir(path: Path, attempts: int = 20) -> bool:
    """rmdir a cgroup, waiting out the moment between a process's exit and the kernel unlinking it."""
    for _ in range(attempts):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                return False
            time.sleep(0.01)
    return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap_stale(parent: Path) -> None:
    """Remove what local Lambdas that are gone left under `parent` (killed before they could clean up)."""
    with contextlib.suppress(OSError):
        for base in parent.glob("warmstart-*-*"):
            pid = base.name.split("-")[1]
            if not pid.isdigit() or _pid_alive(int(pid)):
                continue
            for child in base.iterdir():
                if child.is_dir():
                    _rmdir(child, 1)
            _rmdir(base, 1)


@dataclass
class InstanceCgroup:
    """One instance's cgroup directories (one for v2; `cpu` and `memory` for v1)."""

    mode: Mode
    dirs: list[Path]
    memory_dir: Path

    @property
    def procs(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def wrap(self, argv: list[str]) -> list[str]:
        """argv that enters this cgroup, then execs `argv` (same pid, so Popen's pid stays the runtime's)."""
        return ["/bin/sh", "-c", _ENTER, "sh", *self.procs, "--", *argv]

    def oom_killed(self) -> bool:
        """Did the kernel kill a process here for exceeding the memory limit?"""
        name, key = ("memory.events", "oom_kill") if self.mode == "v2" else ("memory.oom_control", "oom_kill")
        try:
            for line in (self.memory_dir / name).read_text().splitlines():
                field, _, value = line.partition(" ")
                if field == key and int(value) > 0:
                    return True
        except (OSError, ValueError):
            pass
        return False

    def pids(self) -> set[int]:
        """Every process in this cgroup (v1: in either hierarchy, in case a move reached only one)."""
        found: set[int] = set()
        for procs in self.procs:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(pid) for pid in Path(procs).read_text().split())
        return found

    def kill(self) -> int:
        """SIGKILL every process in it, whatever its session or process group (`cgroup.kill` where v2 has
        it); how many there were. Processes that fork meanwhile need another pass: see Sandbox.clear_out."""
        pids = self.pids()
        if pids and self.mode == "v2":
            with contextlib.suppress(OSError):
                _write(self.dirs[0] / "cgroup.kill", "1")
                return len(pids)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def read(self, name: str) -> str:
        for d in self.dirs:
            if (d / name).exists():
                return (d / name).read_text().strip()
        raise FileNotFoundError(name)

    def remove(self, attempts: int = 20) -> bool:
        return all([_rmdir(d, attempts) for d in self.dirs])


class Cgroups:
    """Which cgroup mode this host allows, and the per-instance cgroups made under it."""

    def __init__(self, mode: Mode, reason: str, bases: list[Path]) -> None:
        self.mode, self.reason, self.bases = mode, reason, bases
        self.leftover: list[InstanceCgroup] = []

    @classmethod
    def detect(
        cls,
        want: Want = "auto",
        *,
        proc_cgroup: Path = Path("/proc/self/cgroup"),
        mounts: Path = Path("/proc/mounts"),
    ) -> Cgroups:
        if want == "off":
            return cls("none", "turned off (--cgroups off)", [])
        try:
            own_v1, own_v2 = _own_paths(proc_cgroup)
            mount_v1, mount_v2 = _mounts(mounts)
        except (OSError, ValueError) as exc:
            return cls("none", f"cannot read this process's cgroups ({exc})", [])
        name = f"warmstart-{os.getpid()}-{next(_counter)}"
        reasons = []
        if want in ("auto", "v2"):
            if mount_v2 is not None and own_v2 is not None:
                made = cls._make_v2(mount_v2 / own_v2.lstrip("/"), name)
                if isinstance(made, Path):
                    return cls("v2", f"cgroup v2 at {made}", [made])
                reasons.append(f"v2: {made}")
            else:
                reasons.append("v2: no cgroup2 mount")
        if want in ("auto", "v1"):
            made_v1 = cls._make_v1(mount_v1, own_v1, name)
            if isinstance(made_v1, list):
                return cls("v1", f"cgroup v1 at {made_v1[0]} and {made_v1[1]}", made_v1)
            reasons.append(f"v1: {made_v1}")
        return cls("none", "; ".join(reasons), [])

    @staticmethod
    def _make_v2(own: Path, name: str) -> Path | str:
        try:
            available = (own / "cgroup.controllers").read_text().split()
        except OSError as exc:
            return f"cannot read {own / 'cgroup.controllers'} ({exc.strerror})"
        missing = {"cpu", "memory"} - set(available)
        if missing:
            return f"controllers {', '.join(sorted(missing))} not delegated to {own}"
        _reap_stale(own)
        base = own / name
        try:
            # Enabling controllers for children fails (EBUSY) in a non-root cgroup that holds processes
            # (v2's no-internal-processes rule): then this host has not delegated a subtree to us.
            _write(own / "cgroup.subtree_control", "+cpu +memory")
            base.mkdir()
            _write(base / "cgroup.subtree_control", "+cpu +memory")
        except OSError as exc:
            with contextlib.suppress(OSError):
                base.rmdir()
            return f"cannot delegate cpu+memory under {own} ({exc.strerror})"
        return base

    @staticmethod
    def _make_v1(mount: dict[str, Path], own: dict[str, str], name: str) -> list[Path] | str:
        bases: list[Path] = []
        for controller in ("cpu", "memory"):
            if controller not in mount:
                for made in bases:
                    made.rmdir()
                return f"no {controller} hierarchy mounted"
            parent = mount[controller] / own.get(controller, "/").lstrip("/")
            _reap_stale(parent)
            try:
                (parent / name).mkdir()
            except OSError as exc:
                for made in bases:
                    made.rmdir()
                return f"cannot create a cgroup under {parent} ({exc.strerror})"
            bases.append(parent / name)
        return bases

    def describe(self, memory_mb: int) -> str:
        """The startup line: what memory size means on this host."""
        if self.mode == "none":
            return (
                f"cgroups: none ({self.reason}); memory size {memory_mb} MB only shows in REPORT; instances are"
                " killed by process group: a child in a session of its own outlives its instance"
            )
        vcpus = vcpus_for(memory_mb)
        return (
            f"cgroups: {self.mode}; each instance gets {vcpus:.2f} vCPU ({memory_mb} MB / {LAMBDA_MB_PER_VCPU})"
            f" and a {memory_mb} MB memory limit ({self.reason})"
        )

    def create(self, instance_id: str, memory_mb: int) -> InstanceCgroup | None:
        """A cgroup with the memory size's CPU quota and memory limit; None without cgroups."""
        if self.mode == "none":
            return None
        quota_us = max(1000, int(vcpus_for(memory_mb) * PERIOD_US))
        limit = memory_mb * 1024 * 1024
        dirs = [base / instance_id for base in self.bases]
        for d in dirs:
            d.mkdir(exist_ok=True)
        if self.mode == "v2":
            d = dirs[0]
            _write(d / "cpu.max", f"{quota_us} {PERIOD_US}")
            _write(d / "memory.max", str(limit))
            with contextlib.suppress(OSError):  # no swap accounting: nothing to turn off
                _write(d / "memory.swap.max", "0")
            with contextlib.suppress(OSError):  # Lambda ends the whole sandbox, not one process of it
                _write(d / "memory.oom.group", "1")
            return InstanceCgroup("v2", dirs, d)
        cpu, memory = dirs
        _write(cpu / "cpu.cfs_period_us", str(PERIOD_US))
        _write(cpu / "cpu.cfs_quota_us", str(quota_us))
        _write(memory / "memory.limit_in_bytes", str(limit))
        with contextlib.suppress(OSError):  # swap accounting off, or no swap: the limit above is the limit
            _write(memory / "memory.memsw.limit_in_bytes", str(limit))
        return InstanceCgroup("v1", dirs, memory)

    def release(self, group: InstanceCgroup) -> None:
        """After the instance's exit: remove its cgroup now, or at close() if the kernel still holds it."""
        if not group.remove(attempts=1):
            self.leftover.append(group)

    def close(self) -> None:
        """Remove every cgroup this local Lambda made (instances must have exited)."""
        for group in self.leftover:
            group.kill()
            group.remove()
        self.leftover.clear()
        for base in self.bases:
            for child in list(base.iterdir()) if base.exists() else []:
                if child.is_dir():
                    _rmdir(child)
            _rmdir(base)
        self.bases = []
