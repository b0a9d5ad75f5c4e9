"""One streamed response between an instance's Runtime API connection (the writer) and its invoker (the reader).

Bounded: at most `buffer_bytes` wait for a slow reader. Past that the writer is told to pause (the Runtime API
stops reading the function's socket, so TCP holds the function's next writes: back-pressure, not memory), and
it resumes once the reader has taken the queue below half. A reader that stops reading for good (a client that
left, an Event invoke) discards instead: the function streams on to its end, as on Lambda, where a broken
client connection does not stop the function.

Lambda's limits: a streamed response may be up to 200 MB (`max_bytes`; past it the stream ends with
`Function.ResponseSizeTooLarge` and the rest is read and dropped). Lambda's 2 MB/s cap after the first 6 MB is
not emulated.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable

from infra.local.invocation import HISTORY_PAYLOAD_BYTES, RESPONSE_TOO_LARGE

STREAM_BUFFER_BYTES = 1024 * 1024
MAX_STREAM_RESPONSE = 200 * 1024 * 1024
DEFAULT_CONTENT_TYPE = "application/octet-stream"


class ResponseStream:
    def __init__(
        self,
        content_type: str = DEFAULT_CONTENT_TYPE,
        *,
        buffer_bytes: int = STREAM_BUFFER_BYTES,
        max_bytes: int = MAX_STREAM_RESPONSE,
    ) -> None:
        self.content_type = content_type or DEFAULT_CONTENT_TYPE
        self.buffer_bytes, self.max_bytes = buffer_bytes, max_bytes
        self.total = 0  # bytes the function streamed, kept or not
        self.queued = 0  # bytes waiting for the reader
        self.peak_queued = 0
        self.head = bytearray()  # the first bytes, for LocalLambda.history
        self.ended = False
        self.error: tuple[str, str] | None = None  # (type, details) when it ended in an error
        self.discarding = False
        self.pauses = 0  # how often the writer was paused (tests, benches)
        self.pause: Callable[[], None] | None = None  # set by the writer's connection
        self.resume: Callable[[], None] | None = None
        self._paused = False
        self._chunks: collections.deque[bytes] = collections.deque()
        self._wake = asyncio.Event()

    # -- the writer ------------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.ended or not data:
            return
        self.total += len(data)
        if self.total > self.max_bytes:
            message = f"Response payload size exceeded maximum allowed payload size ({self.max_bytes} bytes)."
            self.end((RESPONSE_TOO_LARGE, message))
            return
        if len(self.head) < HISTORY_PAYLOAD_BYTES:
            self.head += data[: HISTORY_PAYLOAD_BYTES - len(self.head)]
        if self.discarding:
            return
        self._chunks.append(data)
        self.queued += len(data)
        self.peak_queued = max(self.peak_queued, self.queued)
        self._wake.set()
        if self.queued >= self.buffer_bytes and not self._paused and self.pause is not None:
            self._paused = True
            self.pauses += 1
            self.pause()

    def end(self, error: tuple[str, str] | None = None) -> None:
        """The last chunk (and its trailers) arrived, or the platform ended it. Idempotent: the first wins."""
        if self.ended:
            return
        self.ended = True
        self.error = error
        self._wake.set()
        self._resume()  # a writer past the limit still has to be read to its end

    # -- the reader ------------------------------------------------------------------------------------

    async def chunks(self) -> AsyncIterator[bytes]:
        """The data as it arrives, until the end; then `error` says how it ended."""
        while True:
            while self._chunks:
                data = self._chunks.popleft()
                self.queued -= len(data)
                if self._paused and self.queued <= self.buffer_bytes // 2:
                    self._resume()
                yield data
            if self.ended:
                return
            self._wake.clear()
            await self._wake.wait()

    def discard(self) -> None:
        """Nobody will read on: drop what is queued and what comes (the function is not slowed down)."""
        self.discarding = True
        self._chunks.clear()
        self.queued = 0
        self._resume()

    def _resume(self) -> None:
        if self._paused:
            self._paused = False
            if self.resume is not None:
                self.resume()
