"""One invocation as the platform sees it: the event, the answer, the log, Lambda's START/END/REPORT lines."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

# Error types the platform (not the function) puts in an invocation's answer.
EXIT_ERROR = "Runtime.ExitError"
OUT_OF_MEMORY = "Runtime.OutOfMemory"
TIMEOUT_ERROR = "Sandbox.Timedout"
RESPONSE_TOO_LARGE = "Function.ResponseSizeTooLarge"
INVALID_ENTRYPOINT = "Runtime.InvalidEntrypoint"
SERVICE_SHUTDOWN = "Runtime.Shutdown"
UNHANDLED = "Unhandled"  # X-Amz-Function-Error value
# Error types a runtime puts in the Lambda-Runtime-Function-Error-Type header around a snapshot; the
# platform reports those, not the exception's class name from the body.
BEFORE_SNAPSHOT_ERROR = "Runtime.BeforeSnapshotError"
AFTER_RESTORE_ERROR = "Runtime.AfterRestoreError"

MAX_REQUEST_PAYLOAD = 6_291_456  # sync invoke request body
MAX_RESPONSE_PAYLOAD = 6_291_556  # what the Runtime API accepts on /response (Lambda's own figure)
MAX_ASYNC_PAYLOAD = 1_048_576  # Event invoke request body (Lambda raised it from 256 KB in 2025)
LOG_TAIL_BYTES = 4096
# What an invocation's log keeps, however much the function prints: its head (START, init output) and its
# tail (the 4 KB Tail answer, END/REPORT), with a marker where the middle was dropped. CloudWatch would
# have it all; the local Lambda echoes it all to stderr when asked, and keeps only this much in memory.
LOG_KEEP_BYTES = 32 * 1024
LOG_HEAD_BYTES = 8 * 1024
LOG_MARKER = b"\n[... the local Lambda dropped log output here ...]\n"
HISTORY_PAYLOAD_BYTES = 4096  # what LocalLambda.history keeps of each event and answer


def bounded_append(buf: bytearray, data: bytes, *, keep: int = LOG_KEEP_BYTES, head: int = LOG_HEAD_BYTES) -> None:
    """buf += data, then drop from the middle (after `head` bytes and a marker) so that buf stays under
    `keep` (amortized: it shrinks to 3/4 of `keep` when it grows past it)."""
    buf += data
    if len(buf) <= keep:
        return
    start = head
    if buf[head : head + len(LOG_MARKER)] != LOG_MARKER:
        buf[head:head] = LOG_MARKER
    start = head + len(LOG_MARKER)
    excess = len(buf) - keep * 3 // 4
    del buf[start : start + excess]


def bounded_prepend(buf: bytearray, data: bytes | bytearray) -> None:
    joined = bytearray(data)
    bounded_append(joined, bytes(buf))
    buf[:] = joined


class Stream(Protocol):
    """What an invocation needs of its streamed response (infra.local.stream.ResponseStream): its end."""

    def end(self, error: tuple[str, str] | None = None) -> None: ...


@dataclass(slots=True)
class Outcome:
    payload: bytes
    error_type: str | None = None  # set when the function (or the platform on its behalf) failed

    @classmethod
    def error(cls, error_type: str, message: str) -> Outcome:
        body = json.dumps({"errorMessage": message, "errorType": error_type})
        return cls(body.encode(), error_type)

    @classmethod
    def from_runtime(cls, body: bytes, error_type: str | None) -> Outcome:
        """A runtime's /error body goes to the invoker as is; its type comes from the body, else the header.
        Around a snapshot the header's platform type wins (`Runtime.BeforeSnapshotError`,
        `Runtime.AfterRestoreError`) and the hook's own error becomes the message."""
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            return cls.error(error_type or "Unhandled", body.decode("utf-8", "replace"))
        if error_type in (BEFORE_SNAPSHOT_ERROR, AFTER_RESTORE_ERROR):
            message = f"{parsed.get('errorType', 'Error')}: {parsed.get('errorMessage', '')}"
            payload = {"errorMessage": message, "errorType": error_type, "stackTrace": parsed.get("stackTrace", [])}
            return cls(json.dumps(payload).encode(), error_type)
        return cls(body, str(parsed.get("errorType") or error_type or "Unhandled"))


def _hundredths(ms: float) -> int:
    """A duration as REPORT prints it (`{ms:.2f}`), in integer hundredths of a millisecond."""
    return int(Decimal(f"{ms:.2f}").scaleb(2))


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
    bill_init: bool = False  # on-demand: Lambda bills the INIT phase (since August 2025) in Billed Duration
    log: bytearray = field(default_factory=bytearray)
    outcome: Outcome | None = None
    # Event invokes: which attempt this is (1 + retries) and when the event was first accepted (epoch s).
    attempt: int = 1
    first_received: float = field(default_factory=time.time)
    # Response streaming: set when the runtime starts a streamed response (infra.local.stream).
    stream: Stream | None = None
    stream_started: asyncio.Future[Any] | None = None  # resolves to the ResponseStream

    @property
    def duration_ms(self) -> float:
        if self.started_at is None or self.ended_at is None:
            return 0.0
        return (self.ended_at - self.started_at) * 1000.0

    def start(self, *, instance_id: str, timeout_s: float) -> None:
        self.instance_id = instance_id
        self.started_at = time.perf_counter()
        self.deadline_ms = int((time.time() + timeout_s) * 1000)
        bounded_append(self.log, f"START RequestId: {self.request_id} Version: {self.version}\n".encode())

    def finish(self, outcome: Outcome, *, memory_mb: int, status: str | None = None) -> None:
        """Close the log with END/REPORT and hand the answer to whoever waits. Idempotent."""
        if self.outcome is not None:
            return
        self.outcome = outcome
        self.ended_at = time.perf_counter()
        if self.started_at is None:  # never reached the handler (init failed, instance died first)
            self.started_at = self.ended_at
        self.log += self.report_lines(memory_mb=memory_mb, status=status, error_type=outcome.error_type).encode()
        if self.stream is not None:  # ended by the platform (timeout, exit, shutdown): no more chunks
            self.stream.end()
        if self.stream_started is not None and not self.stream_started.done():
            self.stream_started.cancel()  # no stream will come: whoever waits for one has its outcome
        if not self.done.done():
            self.done.set_result(outcome)

    @property
    def billed_ms(self) -> int:
        # Billed from the figures REPORT prints (hundredths of a ms), so that a reader of the log gets the same
        # total: the unrounded sum could round up a millisecond the printed ones do not add up to.
        billed = _hundredths(self.duration_ms)
        if self.bill_init and self.init_duration_ms is not None:
            billed += _hundredths(self.init_duration_ms)
        return max(1, -(-billed // 100))

    def report_lines(self, *, memory_mb: int, status: str | None, error_type: str | None) -> str:
        duration = self.duration_ms
        parts = [
            f"REPORT RequestId: {self.request_id}",
            f"Duration: {duration:.2f} ms",
            f"Billed Duration: {self.billed_ms} ms",
            f"Memory Size: {memory_mb} MB",
            f"Max Memory Used: {self.max_memory_mb} MB",
        ]
        if self.init_duration_ms is not None:
            parts.append(f"Init Duration: {self.init_duration_ms:.2f} ms")
        if self.restore_duration_ms is not None:
            parts.append(f"Restore Duration: {self.restore_duration_ms:.2f} ms")
            parts.append(f"Billed Restore Duration: {max(1, -(-_hundredths(self.restore_duration_ms) // 100))} ms")
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

    def add_log(self, data: bytes) -> None:
        bounded_append(self.log, data)

    def prepend_log(self, data: bytes | bytearray) -> None:
        bounded_prepend(self.log, data)

    def history_size(self) -> int:
        size = len(self.payload) + len(self.log)
        return size + (len(self.outcome.payload) if self.outcome is not None else 0)

    def trim_for_history(self) -> None:
        """What LocalLambda.history keeps: the first 4 KB of the event and of the answer, the bounded log."""
        self.payload = self.payload[:HISTORY_PAYLOAD_BYTES]
        if self.outcome is not None and len(self.outcome.payload) > HISTORY_PAYLOAD_BYTES:
            self.outcome = Outcome(self.outcome.payload[:HISTORY_PAYLOAD_BYTES], self.outcome.error_type)


class FunctionNotFound(Exception):
    """An Invoke API name or qualifier that this local Lambda does not serve (404 ResourceNotFoundException)."""


class QualifierConflict(Exception):
    """A qualified name whose qualifier differs from the Qualifier parameter (400 InvalidParameterValueException)."""


class QueueFull(Exception):
    """The Event queue is at its bound (429 TooManyRequestsException)."""


@dataclass(frozen=True, slots=True)
class Target:
    version: str
    arn: str  # the invoked ARN, qualifier included when one was given
