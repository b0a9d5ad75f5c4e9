"""A snapshot template (`warmstart local --snapshot`): one process that ran init and the before-snapshot
hooks, from which restored instances are forked on demand (see infra.local.zygote for the process side).

The template is an Instance for its init phase (its own Runtime API listener for /init/error, its log,
its init timeout) that never takes invocations: at the snapshot point it reports ready on a control
socket and forks copies when asked. Each copy is an ordinary Instance whose process came from a fork.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from typing import TYPE_CHECKING, Any

from infra.local import runtime_api
from infra.local.instances import Instance
from infra.local.invocation import BEFORE_SNAPSHOT_ERROR, EXIT_ERROR, Invocation, Outcome
from infra.local.sandbox import Sandbox, exit_message, exit_reason
from infra.local.zygote import FD_VARIABLE

if TYPE_CHECKING:
    from infra.local.cgroups import Cgroups
    from infra.local.config import LocalLambdaConfig
    from infra.local.slots import InitSlots

# What a copy's environment differs in from the template's (the rest it inherits with the snapshot).
_PER_COPY = ("AWS_LAMBDA_RUNTIME_API", "AWS_LAMBDA_LOG_STREAM_NAME")


class Template:
    def __init__(
        self, config: LocalLambdaConfig, version: str, cgroups: Cgroups | None = None, slots: InitSlots | None = None
    ) -> None:
        self.config, self.version = config, version
        # The snapshot's init runs under the quota and waits for an init slot too.
        self.instance = Instance(config, version, self, cgroups=cgroups, slots=slots)
        sandbox = self.instance.sandbox
        sandbox.argv = [config.python, "-m", "infra.local.zygote", config.handler]
        self.instance.init_timeout_s = config.snapshot_timeout_s
        self._sock, self._child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock.setblocking(False)
        extra = {
            FD_VARIABLE: str(self._child_sock.fileno()),
            "WARMSTART_SNAPSHOT": "fork",
        }
        # numpy's OpenBLAS starts its thread pool at import; warmstart's path runs no BLAS, and a template
        # must hold no pool at fork. Left alone when the function's environment sets it.
        if "OPENBLAS_NUM_THREADS" not in config.environment and "OPENBLAS_NUM_THREADS" not in os.environ:
            extra["OPENBLAS_NUM_THREADS"] = "1"
        sandbox.extra_env = extra
        sandbox.pass_fds = (self._child_sock.fileno(),)
        self.ready_info: dict[str, Any] | None = None
        self.forks: dict[str, Sandbox] = {}  # instance id -> the copy's sandbox
        self.forked = 0
        self._ready: asyncio.Future[bool] | None = None
        self._pending: dict[str, asyncio.Future[int]] = {}
        self._exit_code: int | None = None
        self._gone = False
        self._task: asyncio.Task[None] | None = None

    @property
    def dead(self) -> bool:
        return self._gone

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        runtime_api.bind(self.instance)
        loop.add_reader(self._sock.fileno(), self._on_control)
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        await self.instance.start()
        self._child_sock.close()  # the template holds its end now

    async def wait_ready(self) -> bool:
        assert self._ready is not None
        return await asyncio.shield(self._ready)

    async def fork(self, sandbox: Sandbox, env: dict[str, str], out_fd: int, cgroup: list[str]) -> int:
        """Ask the template for a copy whose stdout/stderr is `out_fd`, in the cgroup whose cgroup.procs
        files are `cgroup`; its pid once forked."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending[sandbox.instance_id] = fut
        self.forks[sandbox.instance_id] = sandbox
        request = {"fork": sandbox.instance_id, "env": {k: env[k] for k in _PER_COPY}, "cgroup": cgroup}
        message = json.dumps(request).encode()
        try:
            socket.send_fds(self._sock, [message], [out_fd])
        except OSError:
            self._pending.pop(sandbox.instance_id, None)
            self.forks.pop(sandbox.instance_id, None)
            raise
        finally:
            os.close(out_fd)  # the copy has its own now
        self.forked += 1
        return await fut

    # -- the control channel ---------------------------------------------------------------------------

    def _on_control(self) -> None:
        while True:
            try:
                data = self._sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:  # the template exited: its exit watcher calls instance_gone with the status
                self._close_control()
                return
            self._dispatch(json.loads(data))

    def _dispatch(self, message: dict[str, Any]) -> None:
        event = message.get("event")
        if event == "ready":
            self.ready_info = message
            self.instance.snapshot_taken()
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(True)
        elif event == "forked":
            fut = self._pending.pop(message["id"], None)
            if fut is not None and not fut.done():
                fut.set_result(int(message["pid"]))
        elif event == "exit":
            copy = self.forks.pop(message["id"], None)
            if copy is not None:
                copy.forked_exit(int(message["code"]))

    def _close_control(self) -> None:
        if self._sock.fileno() >= 0:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()

    def _lost(self) -> None:
        """The template is gone: waiting forks fail; copies already restored live on (on Lambda a restored
        instance does not depend on the snapshot) and their exits are watched without the template."""
        self._gone = True
        self._close_control()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(OSError("the snapshot template exited"))
        self._pending.clear()
        for copy in list(self.forks.values()):
            copy.orphaned()
        self.forks.clear()
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(False)

    # -- why it failed (what a waiting invocation is told) ---------------------------------------------

    def failure_outcome(self) -> Outcome:
        outcome = self.instance.init_outcome
        if outcome is not None:
            return outcome
        reason = exit_reason(self._exit_code) if self._exit_code is not None else "no snapshot was taken"
        return Outcome.error(EXIT_ERROR, f"Error: snapshot template failed: Runtime exited with error: {reason}")

    def failure_log(self) -> bytes:
        log = bytes(self.instance.logs.init_log)
        if self._exit_code is not None:
            log += f"{exit_message(self._exit_code)}\n".encode()
        return log

    # -- Owner callbacks from the template's Instance --------------------------------------------------

    def instance_ready(self, instance: Instance) -> None:
        # A template that polls /next took the plain path: the handler is not a snap-start one.
        instance.kill()

    def instance_gone(self, instance: Instance, orphan: Invocation | None) -> None:
        if instance.exited is not None and instance.exited.done():
            self._exit_code = instance.exited.result()
        if self.instance.init_outcome is None and self._exit_code == 64:
            self.instance.init_outcome = Outcome.error(BEFORE_SNAPSHOT_ERROR, "before-snapshot hook failed")
        self._lost()
