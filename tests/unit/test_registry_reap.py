"""Freeing a replaced version: never inside the swap, and, when asked, at a moment with no request in flight
(bounded): freeing holds the GIL for milliseconds, which a request running then would wait out."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from pathlib import Path

from handler.models.registry import Registry
from tests.unit.test_registry import Clock, fake_load, fake_model


def swapped(tmp_path: Path) -> tuple[Registry, weakref.ref[object]]:
    """A registry whose default base@1 was just replaced by base@2 with no request holding it."""
    old = fake_load(fake_model(tmp_path, "base", "1", 1))
    registry = Registry(old, "v1-dir", clock=Clock())
    gone = weakref.ref(old.backend)
    del old
    registry.install(fake_load(fake_model(tmp_path, "base", "2", 1)), "v2-dir", "base@1", make_default=False)
    gc.collect()
    return registry, gone


def test_the_swap_does_not_free_the_old_version_reap_does(tmp_path: Path) -> None:
    registry, gone = swapped(tmp_path)
    assert gone() is not None  # not freed by the swap (it runs under the registry's lock)
    assert registry.describe()["retiring"] == []  # yet no longer counted as resident
    assert registry.reap() == 1
    gc.collect()
    assert gone() is None


def test_reap_waits_for_a_moment_with_no_request_in_flight(tmp_path: Path) -> None:
    registry, gone = swapped(tmp_path)
    done: list[float] = []
    with registry.lease():
        reaper = threading.Thread(target=lambda: done.append(registry.reap(idle_within_s=10)))
        reaper.start()
        time.sleep(0.2)
        assert not done and gone() is not None  # a request is in flight: the free waits
    reaper.join(5)  # the lease's release wakes it, long before the 10 s bound
    assert done == [1]
    gc.collect()
    assert gone() is None


def test_reap_waits_no_longer_than_its_bound(tmp_path: Path) -> None:
    registry, gone = swapped(tmp_path)
    with registry.lease():
        t0 = time.monotonic()
        assert registry.reap(idle_within_s=0.2) == 1  # saturating load: freed anyway once the bound runs out
        waited = time.monotonic() - t0
        gc.collect()
        assert gone() is None and 0.2 <= waited < 5


def test_reap_with_nothing_to_free_does_not_wait(tmp_path: Path) -> None:
    registry, _ = swapped(tmp_path)
    registry.reap()
    with registry.lease():
        t0 = time.monotonic()
        assert registry.reap(idle_within_s=10) == 0
        assert time.monotonic() - t0 < 1
