"""The buffer pool: size classes, no double lending, bounds, stats, and nothing returned aliases it."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from handler.backends.pool import MIN_CLASS, BufferPool, PoolError, current_arena, size_class


def test_size_classes_are_powers_of_two_from_one_page() -> None:
    assert size_class(0) == size_class(1) == size_class(MIN_CLASS) == MIN_CLASS
    assert size_class(MIN_CLASS + 1) == 2 * MIN_CLASS
    assert size_class(3 * 2**20) == 4 * 2**20


def test_take_gives_the_shape_and_dtype_and_reuses_after_the_request() -> None:
    pool = BufferPool()
    with pool.request() as arena:
        a = arena.take((2, 7), np.int64)
        assert (a.shape, a.dtype, a.flags.c_contiguous) == ((2, 7), np.int64, True)
        first = a.base
        assert current_arena() is arena
    assert current_arena() is None
    with pool.request() as arena:
        assert arena.take((3, 5), np.int64).base is first  # same class, same buffer, back from the free list
    s = pool.stats()
    assert (s["hits"], s["misses"], s["lent"], s["bytes_lent"]) == (1, 1, 0, 0)
    assert s["bytes_held"] == s["bytes_free"] == MIN_CLASS == s["high_water_bytes"]


def test_buffers_in_one_request_are_distinct() -> None:
    pool = BufferPool()
    with pool.request():
        pass
    with pool.request() as arena:
        views = [arena.take((16,), np.float32) for _ in range(4)]
        assert len({id(v.base) for v in views}) == 4
        assert pool.stats()["lent"] == 4


def test_never_lent_to_two_requests_at_once() -> None:
    pool = BufferPool(max_per_class=4)
    lent: set[int] = set()
    guard = threading.Lock()
    errors: list[str] = []

    def worker(seed: int) -> None:
        for i in range(300):
            with pool.request() as arena:
                buf = arena.take((64 + (i % 3) * 700,), np.int64)
                key = id(buf.base)
                with guard:
                    if key in lent:
                        errors.append("lent twice")
                    lent.add(key)
                buf[:] = seed  # another holder of the same buffer would see this change under it
                if not (buf == seed).all():
                    errors.append("clobbered")
                with guard:
                    lent.discard(key)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    s = pool.stats()
    assert s["lent"] == 0 and s["hits"] + s["misses"] == 8 * 300


def test_double_or_foreign_release_is_refused() -> None:
    pool = BufferPool()
    raw = pool.acquire(100)
    pool.release([raw])
    with pytest.raises(PoolError):
        pool.release([raw])
    with pytest.raises(PoolError):
        pool.release([np.empty(MIN_CLASS, np.uint8)])


def test_free_lists_are_bounded_per_class_and_in_bytes() -> None:
    pool = BufferPool(max_bytes=64 * MIN_CLASS, max_per_class=2)
    raws = [pool.acquire(10) for _ in range(5)]
    pool.release(raws)
    s = pool.stats()
    assert (s["classes"], s["dropped"], s["bytes_free"]) == ({MIN_CLASS: 2}, 3, 2 * MIN_CLASS)
    assert s["high_water_bytes"] == 5 * MIN_CLASS  # all five were out at once
    # Over a quarter of the budget: served, never kept.
    big = pool.acquire(32 * MIN_CLASS)
    pool.release([big])
    assert pool.stats()["bytes_free"] == 2 * MIN_CLASS


def test_total_bytes_bound() -> None:
    pool = BufferPool(max_bytes=8 * MIN_CLASS, max_per_class=100)
    pool.release([pool.acquire(MIN_CLASS * 2) for _ in range(10)])
    assert pool.stats()["bytes_free"] <= 8 * MIN_CLASS


def test_buffers_go_back_when_the_request_fails() -> None:
    pool = BufferPool()
    with pytest.raises(ValueError), pool.request() as arena:
        arena.take((10,), np.float32)
        raise ValueError
    assert pool.stats()["lent"] == 0


def test_custom_allocator_is_used_on_a_miss_only() -> None:
    calls: list[int] = []

    def alloc(n: int) -> Any:
        calls.append(n)
        return np.empty(n, np.uint8)

    pool = BufferPool(allocator=alloc)
    for _ in range(3):
        with pool.request() as arena:
            arena.take((5,), np.float64)
    assert calls == [MIN_CLASS]


def test_pinned_falls_back_to_plain_without_cuda() -> None:
    pool = BufferPool.for_device(cuda=False)
    assert pool.stats()["pinned"] is False
