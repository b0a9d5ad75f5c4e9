"""`Stream`: the pieces of one streamed answer, from the worker that makes them to the one consumer that sends
them on (`WorkerPool.submit_stream`).

Between them a buffer of at most `bound` pieces: a producer ahead of its consumer waits at `put` (so a slow
client holds `bound` pieces at most, never memory it can grow), and a consumer that leaves (`close`: a client
disconnect) wakes it, so the producer stops at its next piece and its worker is free. The producer's end is
`finish`: nothing more, or an error, which the consumer gets after every piece put before it (an error after
the first piece is delivered in-stream, where the consumer can still say so).

The consumer reads with `get` (blocking, for threads) or `poll` plus `on_ready` (a callback the producer calls
after each put and at the end, for an event loop that must not block).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from handler.core.errors import Abandoned

# Pieces a producer may run ahead of its consumer. A piece is small (a token, a chunk): a few dozen bound the
# memory per stream while a consumer that reads in bursts never stalls the producer.
DEFAULT_BOUND = 32


class _End:
    """The stream's end marker (`poll`'s answer once everything was read)."""

    def __repr__(self) -> str:
        return "END"


class _Empty:
    """`poll`'s answer when no piece is ready yet."""

    def __repr__(self) -> str:
        return "EMPTY"


END = _End()
EMPTY = _Empty()


class Stream:
    def __init__(
        self, bound: int = DEFAULT_BOUND, future: Future[int] | None = None, leave: Callable[[], Any] | None = None
    ) -> None:
        if bound < 1:
            raise ValueError(f"a stream's bound is at least 1 piece, got {bound}")
        self.bound = bound
        self._pieces: deque[Any] = deque()
        self._cond = threading.Condition()
        self._finished = False
        self._error: BaseException | None = None
        self._closed = False  # the consumer left
        self._ready: Callable[[], None] | None = None
        self._leave = leave  # the pool's: out of the queue if not started
        self.put_count = 0  # pieces the producer handed over
        self.high_water = 0  # most pieces ever waiting in the buffer
        self.future = future  # the worker's job: done when the producer has stopped

    # -- the producer's side (a worker thread)

    def put(self, piece: Any) -> bool:
        """Hand over one piece, waiting while the buffer is full. False once the consumer has left: the
        producer stops there (the piece is dropped)."""
        with self._cond:
            while len(self._pieces) >= self.bound and not self._closed:
                self._cond.wait()
            if self._closed:
                return False
            self._pieces.append(piece)
            self.put_count += 1
            self.high_water = max(self.high_water, len(self._pieces))
            self._cond.notify_all()
            ready = self._ready
        if ready is not None:
            ready()
        return True

    def finish(self, error: BaseException | None = None) -> None:
        """No more pieces: the end, or `error` after the pieces already put. Only the first call counts."""
        with self._cond:
            if self._finished:
                return
            self._finished, self._error = True, error
            self._cond.notify_all()
            ready = self._ready
        if ready is not None:
            ready()

    @property
    def closed(self) -> bool:
        return self._closed

    # -- the consumer's side

    def poll(self) -> Any:
        """The next piece; EMPTY when none is ready yet; END after the last; raises the producer's error
        once the pieces before it were read."""
        with self._cond:
            if self._pieces:
                piece = self._pieces.popleft()
                self._cond.notify_all()  # room for a waiting producer
                return piece
            if not self._finished:
                return EMPTY
            if self._error is not None:
                raise self._error
            return END

    def get(self, timeout: float | None = None) -> Any:
        """The next piece, waiting for it (END after the last; the producer's error raised). TimeoutError
        when none came within `timeout` seconds."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._pieces or self._finished, timeout):
                raise TimeoutError(f"no piece within {timeout} s")
        return self.poll()

    def __iter__(self) -> Iterator[Any]:
        """Every piece, blocking (a thread's consumer); the producer's error raised after the pieces before it.
        A consumer that stops iterating early should `close()`."""
        while (piece := self.get()) is not END:
            yield piece

    def on_ready(self, callback: Callable[[], None]) -> None:
        """`callback()` (from the producer's thread) after each piece put and at the end: an event loop's
        wake-up. Called once now, in case pieces came before."""
        with self._cond:
            self._ready = callback
        callback()

    def close(self) -> None:
        """The consumer has left: a producer waiting at `put` wakes, and its next `put` returns False; a job
        not started yet leaves the pool's queue."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._pieces.clear()  # nobody reads them: freed now
            self._cond.notify_all()
            leave = self._leave
        if leave is not None:
            leave()


def pump(stream: Stream, pieces: Callable[[], Iterator[Any]]) -> int:
    """The producer's loop, on a worker: each piece of `pieces()` into `stream` until the end, an error
    (finished with it) or the consumer leaving (the iterator closed there, so a generator's `finally` runs
    now, not when it is collected). Returns how many pieces were put."""
    it: Iterator[Any] | None = None
    try:
        if stream.closed:  # left before the job started
            stream.finish(Abandoned())
            return 0
        it = pieces()
        for piece in it:
            if not stream.put(piece):
                stream.finish(Abandoned())
                break
        else:
            stream.finish()
    except BaseException as e:
        stream.finish(e)
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    return stream.put_count


def job_done(stream: Stream, future: Future[Any]) -> None:
    """The worker's job ended: a stream whose producer never ran (refused by a drain, cancelled in the queue)
    ends too, so its consumer never waits for pieces that will not come."""
    if future.cancelled():
        stream.finish(Abandoned())
        return
    error = future.exception()
    stream.finish(error if error is not None else None)
