"""One function instance: a `python -m awslambdaric <handler>` process, its Runtime API listener, its state.

States: init (spawned, importing the handler) -> ready (parked on /next, or between /response and the next
/next) <-> busy (holding an invocation) -> dead. An invocation may be queued on an instance that is in init
or between invocations; it is handed out on that instance's next /next.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from typing import Literal, Protocol

from infra.local import peer
from infra.local.cgroups import Cgroups, InstanceCgroup
from infra.local.config import LocalLambdaConfig
from infra.local.invocation import (
    EXIT_ERROR,
    INVALID_ENTRYPOINT,
    MAX_RESPONSE_PAYLOAD,
    OUT_OF_MEMORY,
    RESPONSE_TOO_LARGE,
    SERVICE_SHUTDOWN,
    TIMEOUT_ERROR,
    Invocation,
    Outcome,
)
from infra.local.logs import LogCapture
from infra.local.runtime_http import Request, Response, RuntimeHTTPServer

State = Literal["init", "ready", "busy", "dead"]

# Runtime API refusals (the route layer maps them to status codes and bodies).
INVALID_STATE = "InvalidStateTransition"
INVALID_REQUEST_ID = "InvalidRequestID"
TOO_LARGE = "RequestEntityTooLarge"


# Error types a runtime puts in the Lambda-Runtime-Function-Error-Type header around a snapshot; the
# platform reports those, not the exception's class name from the body.
BEFORE_SNAPSHOT_ERROR = "Runtime.BeforeSnapshotError"
AFTER_RESTORE_ERROR = "Runtime.AfterRestoreError"


class Process(Protocol):
    """What an instance needs of its process: `subprocess.Popen`, or a copy forked from a snapshot template."""

    pid: int
    returncode: int | None

    def wait(self) -> int: ...


class SnapshotTemplate(Protocol):
    """What a restored copy needs of its snapshot template (`infra.local.template.Template` is one)."""

    async def wait_ready(self) -> bool: ...
    async def fork(self, instance: Instance, env: dict[str, str], out_fd: int, cgroup: list[str]) -> int: ...
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


class Owner(Protocol):
    def instance_ready(self, instance: Instance) -> None: ...
    def instance_gone(self, instance: Instance, orphan: Invocation | None) -> None: ...


class InitSlots:
    """Inits that may run at once. An instance waits here before its init clock starts: N cold starts on a
    small host then each run under their quota (as on Lambda, where every sandbox has its CPU) instead of
    all sharing the host's cores and timing out together."""

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


class Instance:
    def __init__(
        self, config: LocalLambdaConfig, version: str, owner: Owner, *, template: SnapshotTemplate | None = None
    ) -> None:
        self.config, self.version, self.owner = config, version, owner
        self.template = template  # set: this instance is forked from that snapshot template, not spawned
        self.instance_id = uuid.uuid4().hex
        self.state: State = "init"
        self.proc: Process | None = None
        # How a spawned instance starts (a snapshot template changes these before start()).
        self.argv = ["-m", "awslambdaric", config.handler]
        self.extra_env: Mapping[str, str] = {}
        self.pass_fds: tuple[int, ...] = ()
        self.init_timeout_s = config.init_timeout_s
        self.init_outcome: Outcome | None = None  # what its /init/error or /restore/error said
        self.cgroups: Cgroups | None = None  # set by the pool: where this instance's cgroup is made
        self.cgroup: InstanceCgroup | None = None
        self.slots: InitSlots | None = None  # set by the pool: init pacing
        self._has_slot = False
        self._killed = False
        guard = self._peer_allowed if config.runtime_api_guard else None
        self.server = RuntimeHTTPServer(_unbound, host="127.0.0.1", max_body=MAX_RESPONSE_PAYLOAD, guard=guard)
        self.current: Invocation | None = None  # handed out, not yet answered
        self.queued: Invocation | None = None  # assigned, waiting for this instance's next /next
        self.waiter: asyncio.Future[Invocation] | None = None  # a parked /next
        self.spawned_at = 0.0
        self.restore_at: float | None = None
        self.init_duration_ms: float | None = None
        self.restore_duration_ms: float | None = None
        self.init_failed = False
        self.idle_since = 0.0
        self.invocations = 0
        self.max_memory_mb = 0
        self.exited: asyncio.Future[int] | None = None
        self.logs = LogCapture(lambda: self.short_id, lambda: self.invocations == 0, echo=config.echo_logs)
        self._timer: asyncio.TimerHandle | None = None
        self._pidfd = -1
        self._tasks: set[asyncio.Task[None]] = set()  # strong refs: the loop keeps only weak ones

    @property
    def short_id(self) -> str:
        return self.instance_id[:8]

    @property
    def parked(self) -> bool:
        return self.waiter is not None and not self.waiter.done()

    @property
    def free(self) -> bool:
        """Can take an invocation now (parked) or on its next /next (init, or finishing the last one)."""
        return self.state != "dead" and self.current is None and self.queued is None and not self.init_failed

    @property
    def dead(self) -> bool:
        return self.state == "dead"

    # -- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.exited = loop.create_future()
        self.logs.open()
        if self.dead:  # shut down before it got going
            self.exited.set_result(-1)
            return
        address = await self.server.start()
        if self.dead:
            self.server.close()
            self.exited.set_result(-1)
            return
        env = self.config.instance_environ(version=self.version, runtime_api=address, instance_id=self.instance_id)
        if self.template is not None:
            await self._fork(env)
            return
        if not await self._take_slot():
            self.server.close()
            self.exited.set_result(-1)
            return
        try:
            self._make_cgroup()
        except OSError as exc:
            self._never_started(Outcome.error(INVALID_ENTRYPOINT, f"cannot make the instance's cgroup: {exc}"))
            return
        env.update(self.extra_env)
        argv = [self.config.python, *self.argv]
        if self.cgroup is not None:
            argv = self.cgroup.wrap(argv)
        self.spawned_at = time.perf_counter()
        self._arm_timer(self.init_timeout_s, self._init_timed_out)
        try:
            # Own session = own process group, so a kill takes the handler's children with it.
            proc = subprocess.Popen(
                argv,
                cwd=self.config.task_root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=self.pass_fds,
            )
        except OSError as exc:
            self._never_started(Outcome.error(INVALID_ENTRYPOINT, f"cannot start the runtime: {exc}"))
            return
        self.proc = proc
        self.server.peer_known()
        assert proc.stdout is not None
        await self.logs.attach(proc.stdout, proc.stdout.fileno())
        try:
            self._pidfd = os.pidfd_open(proc.pid)
            loop.add_reader(self._pidfd, self._on_exit)
        except (AttributeError, OSError):  # no pidfd: a thread waits instead
            fut = loop.run_in_executor(None, proc.wait)
            fut.add_done_callback(lambda _f: self._on_exit())

    def _make_cgroup(self) -> None:
        if self.cgroups is not None:
            self.cgroup = self.cgroups.create(self.instance_id, self.config.memory_mb)

    def _release_cgroup(self) -> None:
        if self.cgroup is not None and self.cgroups is not None:
            self.cgroups.release(self.cgroup)
            self.cgroup = None

    async def _take_slot(self) -> bool:
        """Wait for an init slot (False: shut down meanwhile)."""
        if self.slots is not None:
            await self.slots.acquire()
            self._has_slot = True
        if self.dead:
            self._free_slot()
            return False
        return True

    def _free_slot(self) -> None:
        """Init (or restore) is over, however it ended: the next waiting one may start."""
        if self._has_slot and self.slots is not None:
            self._has_slot = False
            self.slots.release()

    def _peer_allowed(self, sock: socket.socket) -> bool | None:
        """Does this connection come from this instance's own process? None: its pid is not known yet."""
        if self.proc is None:
            return None
        return peer.connected_from(sock, self.proc.pid)

    async def _fork(self, env: dict[str, str]) -> None:
        """A restored copy of the template's snapshot: waits for the snapshot, then one fork()."""
        assert self.template is not None and self.exited is not None
        if not await self.template.wait_ready() or self.dead:
            failure = self.template.failure_outcome()
            self._never_started(failure, log=self.template.failure_log())
            return
        # The slot only after the snapshot exists: a copy holding one while its template waits for one
        # would deadlock with a single slot.
        if not await self._take_slot():
            self.server.close()
            self.exited.set_result(-1)
            return
        try:
            self._make_cgroup()
        except OSError as exc:
            self._never_started(Outcome.error(INVALID_ENTRYPOINT, f"cannot make the instance's cgroup: {exc}"))
            return
        read_fd, write_fd = os.pipe()
        await self.logs.attach(os.fdopen(read_fd, "rb", buffering=0), read_fd)
        self.spawned_at = time.perf_counter()
        self._arm_timer(self.init_timeout_s, self._init_timed_out)  # Lambda's 10 s covers restore + hooks
        try:
            pid = await self.template.fork(self, env, write_fd, self.cgroup.procs if self.cgroup else [])
        except OSError as exc:
            self.logs.close()
            self._never_started(Outcome.error(INVALID_ENTRYPOINT, f"cannot fork the snapshot: {exc}"))
            return
        self.proc = ForkedProcess(pid)
        self.server.peer_known()
        if self.dead:  # shut down while the fork was under way
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)

    def orphaned(self) -> None:
        """Its template is gone: a restored copy lives on (as on Lambda); watch its exit ourselves."""
        if not isinstance(self.proc, ForkedProcess) or self.proc.returncode is not None:
            return
        try:
            self._pidfd = os.pidfd_open(self.proc.pid)
        except OSError:  # already gone
            self.forked_exit(-9 if self._killed else 1)
            return
        asyncio.get_running_loop().add_reader(self._pidfd, self._orphan_exited)

    def _orphan_exited(self) -> None:
        # Not our child: its status went to whoever reaped it. Ours to say: killed by us, or exited.
        assert isinstance(self.proc, ForkedProcess)
        self.proc.returncode = -9 if self._killed else 1
        self._on_exit()

    def snapshot_taken(self) -> None:
        """A template reached its snapshot point: init is over (it stays out of service, never polls /next)."""
        self._cancel_timer()
        self._free_slot()
        self.init_duration_ms = (time.perf_counter() - self.spawned_at) * 1000.0

    def forked_exit(self, returncode: int) -> None:
        """The template reaped this copy (it is the parent): same path as a spawned instance's exit."""
        if isinstance(self.proc, ForkedProcess) and self.proc.returncode is None:
            self.proc.returncode = returncode
            self._on_exit()

    def _never_started(self, outcome: Outcome, log: bytes = b"") -> None:
        assert self.exited is not None
        self._mark_dead()
        self._release_cgroup()
        for inv in (self.current, self.queued):
            if inv is not None:
                inv.prepend_log(log)
        self._fail_pending(outcome)
        if not self.exited.done():
            self.exited.set_result(-1)
        self.owner.instance_gone(self, None)

    def kill(self) -> None:
        """SIGKILL the whole process group; the exit watcher does the rest."""
        if self.proc is not None and self.proc.returncode is None:
            self._killed = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._mark_dead()

    def shutdown(self) -> None:
        self._fail_pending(Outcome.error(SERVICE_SHUTDOWN, "The local Lambda is shutting down."))
        self.kill()
        if self.proc is None and self.exited is not None and not self.exited.done():
            self.exited.set_result(-1)

    def _mark_dead(self) -> None:
        if self.state == "dead":
            return
        self.state = "dead"
        self._cancel_timer()
        self._free_slot()
        self.server.close()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.cancel()

    def _on_exit(self) -> None:
        assert self.proc is not None
        if self._pidfd >= 0:
            loop = asyncio.get_running_loop()
            loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1
        returncode = self.proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # grandchildren left behind in the group
        self._mark_dead()
        self._background(self._after_exit(returncode))

    async def _after_exit(self, returncode: int) -> None:
        await self.logs.wait_closed(0.5)
        self.logs.flush_partial()
        orphan = None
        message = exit_message(returncode)
        # Killed by the kernel for exceeding the memory size: Lambda says Runtime.OutOfMemory and reports
        # the whole memory size as used.
        error_type = EXIT_ERROR
        if self.cgroup is not None and self.cgroup.oom_killed():
            error_type = OUT_OF_MEMORY
            self.max_memory_mb = self.config.memory_mb
        self._release_cgroup()
        if self.current is not None:
            inv, self.current = self.current, None
            inv.max_memory_mb = max(inv.max_memory_mb, self.max_memory_mb)
            inv.finish(
                Outcome.error(error_type, f"RequestId: {inv.request_id} {message}"),
                memory_mb=self.config.memory_mb,
                status="error",
            )
        if self.queued is not None:
            inv, self.queued = self.queued, None
            if self.init_duration_ms is None and not self.init_failed:  # died during init: that is its answer
                self._charge_init(inv)
                inv.max_memory_mb = max(inv.max_memory_mb, self.max_memory_mb)
                inv.finish(
                    Outcome.error(error_type, f"RequestId: {inv.request_id} {message}"),
                    memory_mb=self.config.memory_mb,
                    status="error",
                )
            elif inv.outcome is None:
                orphan = inv  # never reached this instance: the pool places it elsewhere
        if self.exited is not None and not self.exited.done():
            self.exited.set_result(returncode)
        self.owner.instance_gone(self, orphan)

    # -- placement -------------------------------------------------------------------------------------

    def assign(self, inv: Invocation) -> None:
        if self.parked:
            assert self.waiter is not None
            waiter, self.waiter = self.waiter, None
            self._hand_out(inv)
            waiter.set_result(inv)
        else:
            self.queued = inv

    def _hand_out(self, inv: Invocation) -> None:
        self.state = "busy"
        self.current = inv
        if self.invocations == 0:
            inv.cold = True
            if self.proc is not None:  # init's high-water mark, in case the process dies before answering
                self.max_memory_mb = peak_rss_mb(self.proc.pid)
            self._charge_init(inv)
            inv.prepend_log(self.logs.init_log)
        self.invocations += 1
        inv.start(instance_id=self.instance_id, timeout_s=self.config.timeout_s)
        if self.config.echo_logs:
            self.logs.echo([f"START RequestId: {inv.request_id} Version: {inv.version}"])
        self.logs.target = inv
        self._arm_timer(self.config.timeout_s, self._timed_out)

    def _charge_init(self, inv: Invocation) -> None:
        inv.restore_duration_ms = self.restore_duration_ms
        inv.bill_init = self.config.init_type == "on-demand"
        if self.template is not None:  # a restored copy ran no init of its own
            if inv.restore_duration_ms is None and self.spawned_at:  # restore failed: what it took until now
                inv.restore_duration_ms = (time.perf_counter() - self.spawned_at) * 1000.0
            return
        inv.init_duration_ms = self.init_duration_ms
        if inv.init_duration_ms is None:  # init never finished: charge what it took until now
            inv.init_duration_ms = (time.perf_counter() - self.spawned_at) * 1000.0

    # -- Runtime API state transitions (called by infra.local.runtime_api) ----------------------------------

    def next_invocation(self) -> Invocation | asyncio.Future[Invocation] | str:
        if self.state == "dead":
            return INVALID_STATE
        if self.current is not None or self.parked:
            return INVALID_STATE
        if self.state == "init":
            now = time.perf_counter()
            self._cancel_timer()
            self._free_slot()
            if self.template is not None:  # restored, not initialized: Lambda reports only the restore
                self.restore_duration_ms = (now - self.spawned_at) * 1000.0
            elif self.restore_at is not None:
                self.init_duration_ms = (self.restore_at - self.spawned_at) * 1000.0
                self.restore_duration_ms = (now - self.restore_at) * 1000.0
            else:
                self.init_duration_ms = (now - self.spawned_at) * 1000.0
        if self.queued is not None:
            inv, self.queued = self.queued, None
            self._hand_out(inv)
            return inv
        self.state = "ready"
        self.idle_since = time.monotonic()
        self.waiter = asyncio.get_running_loop().create_future()
        self.owner.instance_ready(self)
        return self.waiter

    def respond(self, request_id: str, payload: bytes, too_large: bool) -> str | None:
        inv = self._current(request_id)
        if isinstance(inv, str):
            return inv
        if too_large:
            message = f"Response payload size exceeded maximum allowed payload size ({MAX_RESPONSE_PAYLOAD} bytes)."
            self._complete(inv, Outcome.error(RESPONSE_TOO_LARGE, message), status="error")
            return TOO_LARGE
        self._complete(inv, Outcome(payload))
        return None

    def fail(self, request_id: str, body: bytes, error_type: str | None) -> str | None:
        inv = self._current(request_id)
        if isinstance(inv, str):
            return inv
        self._complete(inv, _error_outcome(body, error_type))
        return None

    def init_error(self, body: bytes, error_type: str | None) -> str | None:
        if self.state != "init" or self.init_failed:
            return INVALID_STATE
        self.init_failed = True
        self._cancel_timer()
        self._free_slot()
        outcome = _error_outcome(body, error_type)
        self.init_outcome = outcome
        if self.queued is not None:
            inv, self.queued = self.queued, None
            self._charge_init(inv)
            inv.prepend_log(self.logs.init_log)
            self.logs.target = inv
            self._background(self._finish_after_exit(inv, outcome))
        return None

    async def _finish_after_exit(self, inv: Invocation, outcome: Outcome) -> None:
        """A runtime exits right after reporting a failed init or restore: its exit status goes in the log."""
        if self.exited is not None:
            with contextlib.suppress(TimeoutError):
                code = await asyncio.wait_for(asyncio.shield(self.exited), 1.0)
                if self.proc is not None:
                    inv.add_log(f"{exit_message(code)}\n".encode())
        self._finish_soon(inv, outcome, status="error")

    def restore_next(self) -> str | None:
        if self.state != "init" or self.config.init_type != "snap-start" or self.restore_at is not None:
            return INVALID_STATE
        # Forked from a template: this copy is the restore. Without --snapshot the process that ran init
        # goes on as if restored at once (no snapshot is taken).
        self.restore_at = time.perf_counter()
        return None

    def restore_error(self, body: bytes, error_type: str | None) -> str | None:
        if self.restore_at is None or self.state != "init":
            return INVALID_STATE
        return self.init_error(body, error_type)

    def _current(self, request_id: str) -> Invocation | str:
        if self.current is None or self.current.request_id != request_id:
            return INVALID_REQUEST_ID
        return self.current

    def _complete(self, inv: Invocation, outcome: Outcome, status: str | None = None) -> None:
        self.current = None
        self.state = "ready"
        self._cancel_timer()
        self._finish_soon(inv, outcome, status)

    def _finish_soon(self, inv: Invocation, outcome: Outcome, status: str | None) -> None:
        if self.proc is not None and self.state != "dead":
            self.max_memory_mb = max(self.max_memory_mb, peak_rss_mb(self.proc.pid))
        inv.max_memory_mb = self.max_memory_mb
        if self.logs.pending() == 0:
            self._finish(inv, outcome, status)
        else:  # output printed before the answer is still in the pipe: read it into this log first
            self._background(self._drain_then_finish(inv, outcome, status))

    async def _drain_then_finish(self, inv: Invocation, outcome: Outcome, status: str | None) -> None:
        for _ in range(200):
            await asyncio.sleep(0)
            if self.logs.pending() == 0:
                break
        self._finish(inv, outcome, status)

    def _finish(self, inv: Invocation, outcome: Outcome, status: str | None) -> None:
        if self.logs.target is inv:
            self.logs.flush_partial()
            self.logs.target = None
        before = len(inv.log)
        inv.finish(outcome, memory_mb=self.config.memory_mb, status=status)
        if self.config.echo_logs:
            self.logs.echo(inv.log[before:].decode().splitlines())

    def _background(self, coro: Coroutine[None, None, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- deadlines -------------------------------------------------------------------------------------

    def _arm_timer(self, seconds: float, callback: Callable[[], None]) -> None:
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(seconds, callback)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        inv, self.current = self.current, None
        self._timer = None
        if inv is None:
            return
        if self.proc is not None:  # read the high-water mark while the process still exists
            self.max_memory_mb = max(self.max_memory_mb, peak_rss_mb(self.proc.pid))
        now = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        seconds = f"{self.config.timeout_s:.2f}"
        line = f"{now}Z {inv.request_id} Task timed out after {seconds} seconds"
        self.logs.emit(f"{line}\n".encode())
        if self.config.echo_logs:
            self.logs.echo([line])
        self.kill()
        message = f"RequestId: {inv.request_id} Error: Task timed out after {seconds} seconds"
        self._finish_soon(inv, Outcome.error(TIMEOUT_ERROR, message), status="timeout")

    def _init_timed_out(self) -> None:
        self._timer = None
        if self.state != "init":
            return
        inv, self.queued = self.queued, None
        self.kill()
        if inv is not None:
            self._charge_init(inv)
            inv.prepend_log(self.logs.init_log)
            self.logs.target = inv
            seconds = f"{self.config.init_timeout_s:.2f}"
            message = f"RequestId: {inv.request_id} Error: Init phase timed out after {seconds} seconds"
            self._finish_soon(inv, Outcome.error(TIMEOUT_ERROR, message), status="timeout")

    def _fail_pending(self, outcome: Outcome) -> None:
        for inv in (self.current, self.queued):
            if inv is not None:
                inv.finish(outcome, memory_mb=self.config.memory_mb, status="error")
        self.current = self.queued = None

    def init_report(self) -> dict[str, object] | None:
        return self.logs.init_report()


def _unbound(request: Request) -> Response:  # until infra.local.runtime_api.bind() routes the listener
    return Response(503)


def _error_outcome(body: bytes, error_type: str | None) -> Outcome:
    """The runtime's error body goes to the invoker as is; its type comes from the body, else the header.
    Around a snapshot the header's platform type wins (`Runtime.BeforeSnapshotError`,
    `Runtime.AfterRestoreError`) and the hook's own error becomes the message."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return Outcome.error(error_type or "Unhandled", body.decode("utf-8", "replace"))
    if error_type in (BEFORE_SNAPSHOT_ERROR, AFTER_RESTORE_ERROR):
        message = f"{parsed.get('errorType', 'Error')}: {parsed.get('errorMessage', '')}"
        payload = {"errorMessage": message, "errorType": error_type, "stackTrace": parsed.get("stackTrace", [])}
        return Outcome(json.dumps(payload).encode(), error_type)
    return Outcome(body, str(parsed.get("errorType") or error_type or "Unhandled"))
