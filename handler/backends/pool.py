"""A size-classed, bounded, thread-safe pool of host buffers, reused across invocations.

Per request, `with pool.request() as arena:` opens an arena; `arena.take(shape, dtype)` lends a buffer
(token ids, masks, backend outputs) that goes back to the pool when the arena closes. The arena is also
the current one for the thread (a context variable), so a backend can bind its outputs into pooled memory
without a change to its `run(feeds)` signature. Whatever a request returns must be copied out (`tolist()`,
`np.save`) before its arena closes: nothing handed to a caller may alias a pooled buffer.

Why: a fresh numpy array per input and output means page faults and zeroing on every call, and garbage
for the allocator; a steady state that allocates nothing is also what makes a leak visible.
"""

from __future__ import annotations

import contextvars
import ctypes
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: numpy.typing's import dedents docstrings with regexes, at init
    import numpy as np
    import numpy.typing as npt

    Buffer = npt.NDArray[np.uint8]
    Allocator = Callable[[int], Buffer]

# One page: smaller requests round up, so a batch of one and a batch of a few share a class.
MIN_CLASS = 4096
DEFAULT_MAX_BYTES = 64 * 2**20
DEFAULT_MAX_PER_CLASS = 16

_current: contextvars.ContextVar[Arena | None] = contextvars.ContextVar("warmstart_arena", default=None)


class PoolError(RuntimeError):
    """A buffer released twice, or one the pool never lent: a bug in the caller, never a request's fault."""


def size_class(nbytes: int) -> int:
    return max(MIN_CLASS, 1 << max(0, nbytes - 1).bit_length())


def plain_allocator(nbytes: int) -> Buffer:
    import numpy as np  # deferred: a start whose backend takes no buffer (genai) never imports numpy

    return np.empty(nbytes, np.uint8)


def pinned_allocator() -> Allocator | None:
    """Page-locked host memory, so host↔device copies run at full speed and asynchronously.

    torch's pinned allocator when torch is already imported (the torch backend), the CUDA runtime through
    ctypes otherwise (onnxruntime-gpu ships it); None when neither works, and the caller keeps plain memory.
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():

        def torch_pinned(nbytes: int) -> Buffer:
            # .numpy() shares the memory and keeps the tensor alive through the array's base.
            array: Buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()
            return array

        return torch_pinned
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            cudart = ctypes.CDLL(name)
        except OSError:
            continue

        def cudart_pinned(nbytes: int, lib: Any = cudart) -> Buffer:
            import numpy as np  # deferred, as in plain_allocator

            ptr = ctypes.c_void_p()
            if lib.cudaHostAlloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes), 0) != 0 or not ptr.value:
                return plain_allocator(nbytes)
            block = (ctypes.c_uint8 * nbytes).from_address(ptr.value)
            weakref.finalize(block, lib.cudaFreeHost, ptr)
            return np.frombuffer(memoryview(block), np.uint8)  # its base keeps `block`, hence the memory, alive

        return cudart_pinned
    return None


class Arena:
    """The buffers one request holds; all go back to the pool together when the request ends."""

    __slots__ = ("_leases", "_pool")

    def __init__(self, pool: BufferPool) -> None:
        self._pool = pool
        self._leases: list[Buffer] = []

    def take(self, shape: tuple[int, ...], dtype: npt.DTypeLike) -> npt.NDArray[Any]:
        import numpy as np  # deferred, as in plain_allocator (a lookup in sys.modules once imported)

        dt = np.dtype(dtype)
        nbytes = dt.itemsize
        for d in shape:
            nbytes *= d
        raw = self._pool.acquire(nbytes)
        self._leases.append(raw)
        # A C-ordered view of the buffer's first bytes, built in one call (not a slice, a view and a reshape).
        return np.ndarray(shape, dt, raw)

    def close(self) -> None:
        leases, self._leases = self._leases, []
        self._pool.release(leases)


class BufferPool:
    """Free lists per power-of-two size class. Bounded: at most `max_bytes` and `max_per_class` buffers per
    class are kept free; past that a returned buffer is dropped (freed), and a request larger than a
    quarter of `max_bytes` is served from fresh memory and never kept."""

    def __init__(
        self,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_per_class: int = DEFAULT_MAX_PER_CLASS,
        allocator: Allocator | None = None,
        pinned: bool = False,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_per_class = max_per_class
        self.pinned = pinned
        self._alloc = allocator or plain_allocator
        self._free: dict[int, list[Buffer]] = {}
        self._lent: dict[int, int] = {}  # id(buffer) → size class, for every buffer out on loan
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.dropped = 0
        self.bytes_free = 0
        self.bytes_lent = 0
        self.high_water = 0

    @classmethod
    def for_device(cls, cuda: bool, **kwargs: Any) -> BufferPool:
        allocator = pinned_allocator() if cuda else None
        return cls(allocator=allocator, pinned=allocator is not None, **kwargs)

    def acquire(self, nbytes: int) -> Buffer:
        cls_ = size_class(nbytes)
        with self._lock:
            self.bytes_lent += cls_
            free = self._free.get(cls_)
            if free:  # a hit, the steady state: one lock, and held + free bytes unchanged (no new high water)
                raw = free.pop()
                self.bytes_free -= cls_
                self.hits += 1
                self._lent[id(raw)] = cls_
                return raw
            self.misses += 1
            self.high_water = max(self.high_water, self.bytes_lent + self.bytes_free)
        raw = self._alloc(cls_)  # outside the lock: a big allocation must not stall other requests
        with self._lock:
            self._lent[id(raw)] = cls_
        return raw

    def release(self, buffers: list[Buffer]) -> None:
        with self._lock:
            for raw in buffers:
                cls_ = self._lent.pop(id(raw), None)
                if cls_ is None:
                    raise PoolError("buffer released twice or never lent by this pool")
                self.bytes_lent -= cls_
                free = self._free.setdefault(cls_, [])
                if (
                    len(free) < self.max_per_class
                    and self.bytes_free + cls_ <= self.max_bytes
                    and cls_ * 4 <= self.max_bytes
                ):
                    free.append(raw)
                    self.bytes_free += cls_
                else:
                    self.dropped += 1

    @contextmanager
    def request(self) -> Iterator[Arena]:
        arena = Arena(self)
        token = _current.set(arena)
        try:
            yield arena
        finally:
            _current.reset(token)
            arena.close()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            total = self.hits + self.misses
            return {
                "hits": self.hits,
                "misses": self.misses,
                "hit_rate": round(self.hits / total, 6) if total else None,
                "dropped": self.dropped,
                "bytes_held": self.bytes_free + self.bytes_lent,
                "bytes_free": self.bytes_free,
                "bytes_lent": self.bytes_lent,
                "high_water_bytes": self.high_water,
                "lent": len(self._lent),
                "classes": {c: len(f) for c, f in sorted(self._free.items()) if f},
                "pinned": self.pinned,
                "max_bytes": self.max_bytes,
            }


def current_arena() -> Arena | None:
    """The arena of the request running on this thread, if any (backends bind outputs into it)."""
    return _current.get()
