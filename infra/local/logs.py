"""An instance's log capture: its stdout+stderr pipe, attributed to the invocation running (or to init).

Lambda puts what a function prints during an invocation into that invocation's log (the `LogType=Tail`
answer) and what it prints before the first one into the init log. Lines are echoed with the instance's
short id when the local Lambda echoes logs.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import json
import sys
import termios
from collections.abc import Callable

from infra.local.invocation import Invocation, Outcome, bounded_append

INIT_LOG_KEEP = 64 * 1024  # what is kept of init output (its head and tail): the init report is in it


class _Pipe(asyncio.Protocol):
    def __init__(self, sink: Callable[[bytes], None], closed: asyncio.Future[None]) -> None:
        self._sink, self._closed = sink, closed

    def data_received(self, data: bytes) -> None:
        self._sink(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._closed.done():
            self._closed.set_result(None)


class LogCapture:
    def __init__(self, label: Callable[[], str], in_init: Callable[[], bool], *, echo: bool) -> None:
        self.label, self.in_init, self.echo_enabled = label, in_init, echo
        self.init_log = bytearray()  # everything printed before the first invocation
        self.target: Invocation | None = None  # the invocation whose log gets what is printed now
        self.closed: asyncio.Future[None] | None = None  # set when the pipe's writer side is gone
        self.transport: asyncio.BaseTransport | None = None
        self.fd = -1
        self._partial = b""

    def open(self) -> None:
        self.closed = asyncio.get_running_loop().create_future()

    async def attach(self, pipe: object, fd: int) -> None:
        assert self.closed is not None
        closed = self.closed
        self.fd = fd
        loop = asyncio.get_running_loop()
        self.transport, _ = await loop.connect_read_pipe(lambda: _Pipe(self._on_output, closed), pipe)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def wait_closed(self, timeout: float) -> None:
        """Let the last lines land in the right log; then stop reading (a grandchild may hold the pipe)."""
        if self.closed is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.closed), timeout)
        self.close()

    def pending(self) -> int:
        """Bytes written to the pipe and not read yet (printed before the answer, still in flight)."""
        if self.fd < 0:
            return 0
        buf = array.array("i", [0])
        try:
            fcntl.ioctl(self.fd, termios.FIONREAD, buf)
        except OSError:
            return 0
        return buf[0]

    def _on_output(self, data: bytes) -> None:
        self.emit(data)
        if self.echo_enabled:
            text = (self._partial + data).decode("utf-8", "replace")
            *lines, rest = text.split("\n")
            self._partial = rest.encode()
            self.echo(lines)

    def echo(self, lines: list[str]) -> None:
        """Copy lines to our stderr with the instance's label, when the local Lambda echoes logs."""
        if not self.echo_enabled:
            return
        # awslambdaric joins a multi-line error with \r so that it stays one log event; show it as lines.
        out = [f"[{self.label()}] {part}\n" for line in lines for part in line.split("\r")]
        sys.stderr.write("".join(out))

    def emit(self, data: bytes) -> None:
        target = self.target
        if target is not None:
            target.add_log(data)
        elif self.in_init():
            bounded_append(self.init_log, data, keep=INIT_LOG_KEEP)

    async def drain(self) -> None:
        """Wait (a bounded number of loop turns) until what was written to the pipe has been read."""
        for _ in range(200):
            await asyncio.sleep(0)
            if self.pending() == 0:
                return

    def finish(self, inv: Invocation, outcome: Outcome, *, memory_mb: int, status: str | None) -> None:
        """Close `inv`'s log with END/REPORT and answer it; what is printed from now on is not its."""
        if self.target is inv:
            self.flush_partial()
            self.target = None
        before = len(inv.log)
        inv.finish(outcome, memory_mb=memory_mb, status=status)
        self.echo(inv.log[before:].decode().splitlines())

    def flush_partial(self) -> None:
        if self.echo_enabled and self._partial:
            self.echo([self._partial.decode("utf-8", "replace")])
            self._partial = b""

    def init_report(self) -> dict[str, object] | None:
        """The handler's one-line JSON init report (`{"warmstart": "init", ...}`), if it printed one."""
        for line in self.init_log.decode("utf-8", "replace").splitlines():
            if line.startswith("{") and '"warmstart"' in line:
                with contextlib.suppress(ValueError):
                    report = json.loads(line)
                    if isinstance(report, dict) and report.get("warmstart") == "init":
                        return report
        return None
