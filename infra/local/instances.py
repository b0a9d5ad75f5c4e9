"""One function instance as the platform sees it: its Runtime API state machine, placement, deadlines and
billing. Its process (spawned `python -m awslambdaric <handler>`, or forked from a snapshot template), init
slot and cgroup are infra.local.sandbox's.

States: init (spawned, importing the handler) -> ready (parked on /next, or between /response and the next
/next) <-> busy (holding an invocation) -> dead. An invocation may be queued on an instance that is in init
or between invocations; it is handed out on that instance's next /next.

About one thing: one instance's state machine. Its transitions (a buffered or streamed answer, an error,
a deadline, an exit) all read and write the same few fields, so they stay together.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Literal, Protocol

from infra.local import peer
from infra.local.billing import InitClock
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
from infra.local.sandbox import LaunchError, Process, Sandbox, SnapshotTemplate, exit_message
from infra.local.slots import InitSlots
from infra.local.stream import ResponseStream

State = Literal["init", "ready", "busy", "dead"]

# Runtime API refusals (the route layer maps them to status codes and bodies).
INVALID_STATE = "InvalidStateTransition"
INVALID_REQUEST_ID = "InvalidRequestID"
TOO_LARGE = "RequestEntityTooLarge"


class Owner(Protocol):
    def instance_ready(self, instance: Instance) -> None: ...
    def instance_gone(self, instance: Instance, orphan: Invocation | None) -> None: ...


class Instance:
    def __init__(
        self,
        config: LocalLambdaConfig,
        version: str,
        owner: Owner,
        *,
        template: SnapshotTemplate | None = None,
        cgroups: Cgroups | None = None,
        slots: InitSlots | None = None,
    ) -> None:
        self.config, self.version, self.owner = config, version, owner
        self.template = template  # set: this instance is forked from that snapshot template, not spawned
        self.instance_id = uuid.uuid4().hex
        self.state: State = "init"
        self.sandbox = Sandbox(self.instance_id, config, self._on_exit, cgroups=cgroups, slots=slots)
        self.init_timeout_s = config.init_timeout_s  # a snapshot template changes it before start()
        self.init_outcome: Outcome | None = None  # what its /init/error or /restore/error said
        guard = self._peer_allowed if config.runtime_api_guard else None
        self.server = RuntimeHTTPServer(_unbound, host="127.0.0.1", max_body=MAX_RESPONSE_PAYLOAD, guard=guard)
        self.current: Invocation | None = None  # handed out, not yet answered
        self.queued: Invocation | None = None  # assigned, waiting for this instance's next /next
        self.waiter: asyncio.Future[Invocation] | None = None  # a parked /next
        self.clock = InitClock(restored_copy=template is not None, bill_init=config.init_type == "on-demand")
        self.init_failed = False
        self.idle_since = 0.0
        self.invocations = 0
        self.max_memory_mb = 0
        self.exited: asyncio.Future[int] | None = None
        self.logs = LogCapture(lambda: self.short_id, lambda: self.invocations == 0, echo=config.echo_logs)
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # strong refs: the loop keeps only weak ones

    @property
    def short_id(self) -> str:
        return self.instance_id[:8]

    @property
    def proc(self) -> Process | None:
        return self.sandbox.proc

    @property
    def cgroup(self) -> InstanceCgroup | None:
        return self.sandbox.cgroup

    @property
    def init_duration_ms(self) -> float | None:
        return self.clock.init_duration_ms

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
        """Spawn the runtime, or fork it from the template's snapshot: one path, the launch aside."""
        self.exited = asyncio.get_running_loop().create_future()
        self.logs.open()
        if self.dead:  # shut down before it got going
            self.exited.set_result(-1)
            return
        address = await self.server.start()
        if self.dead:
            self._stillborn()
            return
        env = self.config.instance_environ(version=self.version, runtime_api=address, instance_id=self.instance_id)
        # A copy waits for the snapshot before its slot: one holding a slot while its template waits for
        # one would deadlock with a single slot.
        if self.template is not None and (not await self.template.wait_ready() or self.dead):
            self._never_started(self.template.failure_outcome(), log=self.template.failure_log())
            return
        await self.sandbox.take_slot()
        if self.dead:
            self.sandbox.free_slot()
            self._stillborn()
            return
        try:
            self.sandbox.make_cgroup()
        except OSError as exc:
            self._never_started(Outcome.error(INVALID_ENTRYPOINT, f"cannot make the instance's cgroup: {exc}"))
            return
        read_fd, write_fd = os.pipe()
        await self.logs.attach(os.fdopen(read_fd, "rb", buffering=0), read_fd)
        self.clock.start()
        self._arm_timer(self.init_timeout_s, self._init_timed_out)  # Lambda's 10 s covers restore + hooks
        try:
            await self.sandbox.launch(env, write_fd, self.template)
        except LaunchError as exc:
            self.logs.close()
            self._never_started(Outcome.error(INVALID_ENTRYPOINT, str(exc)))
            return
        self.server.peer_known()
        if self.dead:  # shut down while the fork was under way
            self.sandbox.kill()

    def _stillborn(self) -> None:
        assert self.exited is not None
        self.server.close()
        self.exited.set_result(-1)

    def _peer_allowed(self, sock: socket.socket) -> bool | None:
        """Does this connection come from this instance's own process? None: its pid is not known yet."""
        if self.proc is None:
            return None
        return peer.connected_from(sock, self.proc.pid)

    def snapshot_taken(self) -> None:
        """A template reached its snapshot point: init is over (it stays out of service, never polls /next)."""
        self._cancel_timer()
        self.sandbox.free_slot()
        self.clock.snapshot_taken()

    def _never_started(self, outcome: Outcome, log: bytes = b"") -> None:
        assert self.exited is not None
        self._mark_dead()
        self.sandbox.release_cgroup()
        for inv in (self.current, self.queued):
            if inv is not None:
                inv.prepend_log(log)
        self._fail_pending(outcome)
        if not self.exited.done():
            self.exited.set_result(-1)
        self.owner.instance_gone(self, None)

    def kill(self) -> None:
        """SIGKILL its processes; the exit watcher does the rest."""
        self.sandbox.kill()
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
        self.sandbox.free_slot()
        self.server.close()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.cancel()

    def _on_exit(self, returncode: int) -> None:
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
        if self.sandbox.oom_killed():
            error_type = OUT_OF_MEMORY
            self.max_memory_mb = self.config.memory_mb
        await self.sandbox.clear_out()
        answered = [self.current] if self.current is not None else []
        if self.queued is not None:
            if self.clock.init_duration_ms is None and not self.init_failed:  # died during init: that is its answer
                self.clock.charge(self.queued)
                answered.append(self.queued)
            elif self.queued.outcome is None:
                orphan = self.queued  # never reached this instance: the pool places it elsewhere
        self.current = self.queued = None
        for inv in answered:
            inv.max_memory_mb = max(inv.max_memory_mb, self.max_memory_mb)
            outcome = Outcome.error(error_type, f"RequestId: {inv.request_id} {message}")
            inv.finish(outcome, memory_mb=self.config.memory_mb, status="error")
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
            self.max_memory_mb = self.sandbox.peak_rss_mb()  # init's, in case it dies before answering
            self.clock.charge(inv)
            inv.prepend_log(self.logs.init_log)
        self.invocations += 1
        inv.start(instance_id=self.instance_id, timeout_s=self.config.timeout_s)
        self.logs.echo([f"START RequestId: {inv.request_id} Version: {inv.version}"])
        self.logs.target = inv
        self._arm_timer(self.config.timeout_s, self._timed_out)

    # -- Runtime API state transitions (called by infra.local.runtime_api) ----------------------------------

    def next_invocation(self) -> Invocation | asyncio.Future[Invocation] | str:
        if self.state == "dead":
            return INVALID_STATE
        if self.current is not None or self.parked:
            return INVALID_STATE
        if self.state == "init":
            self._cancel_timer()
            self.sandbox.free_slot()
            self.clock.first_next()
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

    def respond_stream(self, request_id: str, content_type: str) -> ResponseStream | str:
        """A streamed response begins (Lambda-Runtime-Function-Response-Mode: streaming): its chunks go to
        the invoker as they come; the invocation is still this instance's (and its timeout runs) until the
        last chunk."""
        inv = self._current(request_id)
        if isinstance(inv, str):
            return inv
        if inv.stream is not None:
            return INVALID_STATE  # one response per invocation
        stream = inv.stream = ResponseStream(content_type)
        if inv.stream_started is not None and not inv.stream_started.done():
            inv.stream_started.set_result(stream)
        return stream

    def stream_done(
        self, inv: Invocation, stream: ResponseStream, error_type: str | None, error_body: bytes
    ) -> str | None:
        """The last chunk and its trailers: an error type there is a mid-stream error."""
        if self.current is not inv:  # timed out (or the instance died) while it streamed
            stream.end()
            return INVALID_REQUEST_ID
        if error_type:
            outcome = Outcome.from_runtime(error_body, error_type)
            stream.end((str(outcome.error_type), outcome.payload.decode("utf-8", "replace")))
        elif stream.error is not None:  # the platform ended it (past the size limit)
            outcome = Outcome.error(*stream.error)
        else:
            outcome = Outcome(bytes(stream.head))
            stream.end()
        self._complete(inv, outcome, status="error" if outcome.error_type else None)
        return TOO_LARGE if outcome.error_type == RESPONSE_TOO_LARGE else None

    def stream_broken(self, stream: ResponseStream) -> None:
        """The runtime's connection dropped mid-stream: the stream ends here; the invocation ends with the
        process's exit or its timeout, as a runtime that stopped answering does."""
        stream.end()

    def fail(self, request_id: str, body: bytes, error_type: str | None) -> str | None:
        inv = self._current(request_id)
        if isinstance(inv, str):
            return inv
        self._complete(inv, Outcome.from_runtime(body, error_type))
        return None

    def init_error(self, body: bytes, error_type: str | None) -> str | None:
        if self.state != "init" or self.init_failed:
            return INVALID_STATE
        self.init_failed = True
        self._cancel_timer()
        self.sandbox.free_slot()
        outcome = Outcome.from_runtime(body, error_type)
        self.init_outcome = outcome
        if self.queued is not None:
            inv, self.queued = self.queued, None
            self.clock.charge(inv)
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
        if self.state != "init" or self.config.init_type != "snap-start" or self.clock.restore_at is not None:
            return INVALID_STATE
        # Forked from a template: this copy is the restore. Without --snapshot the process that ran init
        # goes on as if restored at once (no snapshot is taken).
        self.clock.restore_started()
        return None

    def restore_error(self, body: bytes, error_type: str | None) -> str | None:
        if self.clock.restore_at is None or self.state != "init":
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
        if self.state != "dead":
            self.max_memory_mb = max(self.max_memory_mb, self.sandbox.peak_rss_mb())
        inv.max_memory_mb = self.max_memory_mb
        if self.logs.pending() == 0:
            self.logs.finish(inv, outcome, memory_mb=self.config.memory_mb, status=status)
        else:  # output printed before the answer is still in the pipe: read it into this log first
            self._background(self._drain_then_finish(inv, outcome, status))

    async def _drain_then_finish(self, inv: Invocation, outcome: Outcome, status: str | None) -> None:
        await self.logs.drain()
        self.logs.finish(inv, outcome, memory_mb=self.config.memory_mb, status=status)

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
        self.max_memory_mb = max(self.max_memory_mb, self.sandbox.peak_rss_mb())  # while the process exists
        now = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        seconds = f"{self.config.timeout_s:.2f}"
        line = f"{now}Z {inv.request_id} Task timed out after {seconds} seconds"
        self.logs.emit(f"{line}\n".encode())
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
            self.clock.charge(inv)
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
