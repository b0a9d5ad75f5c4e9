"""One invocation as the platform sees it: the event, the answer, the log, Lambda's START/END/REPORT lines."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import time
from dataclasses import dataclass, field

# Error types the platform (not the function) puts in an invocation's answer.
EXIT_ERROR = "Runtime.ExitError"
OUT_OF_MEMORY = "Runtime.OutOfMemory"
TIMEOUT_ERROR = "Sandbox.Timedout"
RESPONSE_TOO_LARGE = "Function.ResponseSizeTooLarge"
INVALID_ENTRYPOINT = "Runtime.InvalidEntrypoint"
SERVICE_SHUTDOWN = "Runtime.Shutdown"
UNHANDLED = "Unhandled"  # X-Amz-Function-Error value

MAX_REQUEST_PAYLOAD = 6_291_456  # sync invoke request body
MAX_RESPONSE_PAYLOAD = 6_291_556  # what the Runtime API accepts on /response (Lambda's own figure)
MAX_ASYNC_PAYLOAD = 262_144
LOG_TAIL_BYTES = 4096


@dataclass(slots=True)
class Outcome:
    payload: bytes
    error_type: str | None = None  # set when the function (or the platform on its behalf) failed

    @classmethod
    def error(cls, error_type: str, message: str) -> Outcome:
        body = json.dumps({"errorMessage": message, "errorType": error_type})
        return cls(body.encode(), error_type)


@dataclass(eq=False, slots=True)
class Invocation:
    request_id: str
    payload: bytes
    version: str
    function_arn: str  # as invoked, qualifier included
    done: asyncio.Future[Outcome]
    client_context: str | None = None
    trace_id: str = ""
    is_async: bool = False
    received_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None  # event handed out on /next
    ended_at: float | None = None
    deadline_ms: int = 0
    instance_id: str | None = None
    cold: bool = False
    init_duration_ms: float | None = None
    restore_duration_ms: float | None = None
    max_memory_mb: int = 0
    log: bytearray = field(default_factory=bytearray)
    outcome: Outcome | None = None

    @property
    def duration_ms(self) -> float:
        if self.started_at is None or self.ended_at is None:
            return 0.0
        return (self.ended_at - self.started_at) * 1000.0

    def start(self, *, instance_id: str, timeout_s: float) -> None:
        self.instance_id = instance_id
        self.started_at = time.perf_counter()
        self.deadline_ms = int((time.time() + timeout_s) * 1000)
        self.log += f"START RequestId: {self.request_id} Version: {self.version}\n".encode()

    def finish(self, outcome: Outcome, *, memory_mb: int, status: str | None = None) -> None:
        """Close the log with END/REPORT and hand the answer to whoever waits. Idempotent."""
        if self.outcome is not None:
            return
        self.outcome = outcome
        self.ended_at = time.perf_counter()
        if self.started_at is None:  # never reached the handler (init failed, instance died first)
            self.started_at = self.ended_at
        self.log += self.report_lines(memory_mb=memory_mb, status=status, error_type=outcome.error_type).encode()
        if not self.done.done():
            self.done.set_result(outcome)

    def report_lines(self, *, memory_mb: int, status: str | None, error_type: str | None) -> str:
        duration = self.duration_ms
        parts = [
            f"REPORT RequestId: {self.request_id}",
            f"Duration: {duration:.2f} ms",
            f"Billed Duration: {max(1, math.ceil(duration))} ms",
            f"Memory Size: {memory_mb} MB",
            f"Max Memory Used: {self.max_memory_mb} MB",
        ]
        if self.init_duration_ms is not None:
            parts.append(f"Init Duration: {self.init_duration_ms:.2f} ms")
        if self.restore_duration_ms is not None:
            parts.append(f"Restore Duration: {self.restore_duration_ms:.2f} ms")
            parts.append(f"Billed Restore Duration: {max(1, math.ceil(self.restore_duration_ms))} ms")
        if status is not None:
            parts.append(f"Status: {status}")
            if error_type and status == "error":
                parts.append(f"Error Type: {error_type}")
        return f"END RequestId: {self.request_id}\n" + "\t".join(parts) + "\t\n"

    def log_tail(self) -> str:
        """X-Amz-Log-Result: base64 of the last 4 KB of this invocation's log."""
        return base64.b64encode(bytes(self.log[-LOG_TAIL_BYTES:])).decode()

    def report_line(self) -> str:
        for line in reversed(self.log.decode("utf-8", "replace").splitlines()):
            if line.startswith("REPORT "):
                return line
        return ""


class FunctionNotFound(Exception):
    """An Invoke API name or qualifier that this local Lambda does not serve (404 ResourceNotFoundException)."""


@dataclass(frozen=True, slots=True)
class Target:
    version: str
    arn: str  # the invoked ARN, qualifier included when one was given
