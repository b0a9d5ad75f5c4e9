"""bench/generate/step_runs.py's pair timing and RSS, offline (no model): side by side has both runs in flight at
once, each on its own slots' binding; one after the other takes both runs' time."""

from __future__ import annotations

import threading
from typing import Any

from bench.generate import step_runs


class _Session:
    """Each run waits (up to 0.2 s, the GIL released as in ONNX Runtime's run) for a second run to be in flight,
    and notes how many were in flight at its start."""

    def __init__(self) -> None:
        self.both = threading.Condition()
        self.flying = 0
        self.starts: list[int] = []
        self.bindings: list[Any] = []

    def run_with_iobinding(self, binding: Any) -> None:
        with self.both:
            self.flying += 1
            self.starts.append(self.flying)
            self.bindings.append(binding)
            self.both.notify_all()
            self.both.wait_for(lambda: self.flying == 2, timeout=0.2)
        with self.both:
            self.flying -= 1


class _Runs:
    def __init__(self) -> None:
        self.session = _Session()
        self.made: list[tuple[int, int, int, int]] = []

    def binding(self, first: int, rows: int, width: int, past: int) -> tuple[Any, list[Any]]:
        self.made.append((first, rows, width, past))
        return (first, rows), []

    timed = step_runs.Runs.timed


def test_a_pair_runs_one_after_the_other_then_side_by_side_on_disjoint_slots() -> None:
    runs = _Runs()
    ws, cs, wo, co = step_runs.pair(runs, (4, 1, 60), (2, 32, 0), repeat=1)  # type: ignore[arg-type]
    assert runs.made == [(0, 4, 1, 60), (4, 2, 32, 0)]  # B's slots start after A's
    starts = runs.session.starts
    assert starts[:4] == [1, 1, 1, 1]  # one after the other (an untimed pair, then the timed one): never both
    assert 2 in starts[4:]  # side by side: both in flight at once
    assert set(runs.session.bindings) == {(0, 4), (4, 2)}
    assert ws >= 400  # each run alone waited its 0.2 s out
    assert cs < ws and co < wo + 50  # waiting is not CPU


def test_rss_is_this_process_resident_set() -> None:
    held = bytearray(64 * 1024 * 1024)  # 64 MB written: resident
    held[::4096] = b"\x01" * len(held[::4096])
    assert step_runs.rss_mb() >= 64
