"""The process side of one instance: its init slot, its cgroup, its process (spawned, or forked from a
snapshot template) and that process's exit.

infra.local.instances owns what the platform says about an instance (its state, deadlines, billing); this
module only starts, watches and kills processes. Spawned and forked processes take one path: the instance
makes the log pipe, `launch()` starts the process on its write end, and either way the exit comes back as
one `on_exit(returncode)` call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Mapping
from typing import Protocol

from infra.local.cgroups import Cgroups, InstanceCgroup
from infra.local.config import LocalLambdaConfig
from infra.local.invocation import Outcome
from infra.local.slots import InitSlots, Slot

_TICKS = os.sysconf("SC_CLK_TCK")


class Process(Protocol):
    """What an instance needs of its process: `subprocess.Popen`, or a copy forked from a snapshot template."""

    pid: int
    returncode: int | None

    def wait(self) -> int: ...


class SnapshotTemplate(Protocol):
    """What a restored copy needs of its snapshot template (`infra.local.template.Template` is one)."""

    async def wait_ready(self) -> bool: ...
    async def fork(self, sandbox: Sandbox, env: dict[str, str], out_fd: int, cgroup: list[str]) -> int: ...
    def failure_outcome(self) -> Outcome: ...
    def failure_log(self) -> bytes: ...


class ForkedProcess:
    """A process forked by a template (not our child): its exit status comes from the template, or, once
    the template is gone, is unknown (reported as -9 when we killed it, else 1)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def wait(self) -> int:
        assert self.returncode is not None, "exit status not reported yet"
        return self.returncode


class LaunchError(Exception):
    """The process could not be started (the message is what the invoker is told)."""


def exit_reason(returncode: int) -> str:
    """How Lambda (its Go platform) words a runtime's exit."""
    if returncode < 0:
        name = signal.strsignal(-returncode) or f"signal {-returncode}"
        return f"signal: {name.lower()}"
    return f"exit status {returncode}"


def exit_message(returncode: int) -> str:
    """The platform's line about a runtime that exited."""
    if returncode == 0:
        return "Error: Runtime exited without providing a reason"
    return f"Error: Runtime exited with error: {exit_reason(returncode)}"


def cpu_seconds(pid: int) -> float:
    """CPU time of a process and of its children it has waited for (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        return sum(int(ticks) for ticks in fields[11:15]) / _TICKS  # utime stime cutime cstime
    except (OSError, ValueError):
        return 0.0


def peak_rss_mb(pid: int) -> int:
    """Max Memory Used: the process's RSS high-water mark (VmHWM), in MB rounded up."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return -(-int(line.split()[1]) // 1024)
    except (OSError, ValueError, IndexError):
        pass
    return 0


class Sandbox:
    def __init__(
        self,
        instance_id: str,
        config: LocalLambdaConfig,
        on_exit: Callable[[int], None],
        *,
        cgroups: Cgroups | None = None,
        slots: InitSlots | None = None,
    ) -> None:
        self.instance_id, self.config, self.on_exit = instance_id, config, on_exit
        self.cgroups = cgroups  # where this instance's cgroup is made (None: unconfined)
        self.cgroup: InstanceCgroup | None = None
        self.slots = slots  # init pacing
        self.proc: Process | None = None
        # How a spawned process starts (a snapshot template changes these before launch()).
        self.argv = config.argv()
        self.extra_env: Mapping[str, str] = {}
        self.pass_fds: tuple[int, ...] = ()
        self.killed = False
        self._slot: Slot | None = None
        self._pidfd = -1

    # -- init slot and cgroup --------------------------------------------------------------------------

    async def take_slot(self) -> None:
        if self.slots is not None:
            self._slot = await self.slots.acquire(self.cpu_seconds)

    def free_slot(self) -> None:
        """Init (or restore) is over, however it ended: the next waiting one may start."""
        if self._slot is not None and self.slots is not None:
            self.slots.release(self._slot)
            self._slot = None

    def cpu_seconds(self) -> float | None:
        """CPU time used by the whole sandbox so far (None: no process yet), for the init slots."""
        if self.proc is None:
            return None
        pids = self.cgroup.pids() if self.cgroup is not None else set()
        return sum(cpu_seconds(pid) for pid in pids | {self.proc.pid})

    def make_cgroup(self) -> None:
        """Raises OSError when the cgroup cannot be made."""
        if self.cgroups is not None:
            self.cgroup = self.cgroups.create(self.instance_id, self.config.memory_mb)

    def release_cgroup(self) -> None:
        if self.cgroup is not None and self.cgroups is not None:
            self.cgroups.release(self.cgroup)
            self.cgroup = None

    def oom_killed(self) -> bool:
        return self.cgroup is not None and self.cgroup.oom_killed()

    # -- the process -----------------------------------------------------------------------------------

    async def launch(self, env: dict[str, str], out_fd: int, template: SnapshotTemplate | None) -> None:
        """Start the process with stdout and stderr on `out_fd` (closed here either way): forked from
        `template` when given, else spawned. Raises LaunchError."""
        cgroup = self.cgroup.procs if self.cgroup else []
        if template is not None:
            try:
                pid = await template.fork(self, env, out_fd, cgroup)  # it closes out_fd
            except OSError as exc:
                raise LaunchError(f"cannot fork the snapshot: {exc}") from exc
            self.proc = ForkedProcess(pid)
            return
        argv = list(self.argv)
        if self.cgroup is not None:
            argv = self.cgroup.wrap(argv)
        try:
            # Own session = own process group, so a kill takes the handler's children with it.
            proc = subprocess.Popen(
                argv,
                cwd=self.config.task_root,
                env={**env, **self.extra_env},
                stdin=subprocess.DEVNULL,
                stdout=out_fd,
                stderr=out_fd,
                start_new_session=True,
                pass_fds=self.pass_fds,
            )
        except OSError as exc:
            raise LaunchError(f"cannot start the runtime: {exc}") from exc
        finally:
            os.close(out_fd)
        self.proc = proc
        self._watch(proc.pid, self._exited)

    def _watch(self, pid: int, callback: Callable[[], None]) -> bool:
        """Call `callback` on the loop when `pid` exits (False: it is gone already)."""
        loop = asyncio.get_running_loop()
        try:
            self._pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            if not isinstance(self.proc, subprocess.Popen):  # not our child: gone, as far as we can tell
                return False
            fut = loop.run_in_executor(None, self.proc.wait)  # no pidfd: a thread waits instead
            fut.add_done_callback(lambda _f: callback())
            return True
        loop.add_reader(self._pidfd, callback)
        return True

    def peak_rss_mb(self) -> int:
        return peak_rss_mb(self.proc.pid) if self.proc is not None else 0

    def kill(self) -> None:
        """SIGKILL the whole sandbox: every process in its cgroup (without cgroups, its process group); the
        exit watcher does the rest."""
        if self.proc is not None and self.proc.returncode is None:
            self.killed = True
            if self.cgroup is not None:  # the runtime itself too: it may not have entered the cgroup yet
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(self.proc.pid, signal.SIGKILL)
            self._kill_rest()

    def _kill_rest(self) -> None:
        """One pass over what the sandbox holds. Lambda ends the whole sandbox: with a cgroup, that takes a
        child that left the process group (a daemon in a session of its own) too; without one, only the
        process group can be reached, and such a child outlives the instance."""
        if self.cgroup is not None:
            self.cgroup.kill()
            return
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    async def clear_out(self, passes: int = 200) -> None:
        """After the exit: SIGKILL what is left in the cgroup until it is empty (a process may fork between
        two passes), then remove the cgroup."""
        for _ in range(passes if self.cgroup is not None else 0):
            if self.cgroup is None or not self.cgroup.kill():
                break
            await asyncio.sleep(0.01)
        self.release_cgroup()

    def _exited(self) -> None:
        assert self.proc is not None
        if self._pidfd >= 0:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1
        returncode = self.proc.wait()
        self._kill_rest()  # what it left behind (at once: a child holding the log pipe keeps it open)
        self.on_exit(returncode)

    # -- a forked copy's exit --------------------------------------------------------------------------

    def forked_exit(self, returncode: int) -> None:
        """The template reaped this copy (it is the parent): same path as a spawned process's exit."""
        if isinstance(self.proc, ForkedProcess) and self.proc.returncode is None:
            self.proc.returncode = returncode
            self._exited()

    def orphaned(self) -> None:
        """Its template is gone: a restored copy lives on (as on Lambda); watch its exit ourselves."""
        if not isinstance(self.proc, ForkedProcess) or self.proc.returncode is not None:
            return
        if not self._watch(self.proc.pid, self._orphan_exited):  # already gone
            self.forked_exit(-9 if self.killed else 1)

    def _orphan_exited(self) -> None:
        # Not our child: its status went to whoever reaped it. Ours to say: killed by us, or exited.
        self.forked_exit(-9 if self.killed else 1)
