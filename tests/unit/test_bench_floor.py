"""bench/coldstart/run.py's answer check: a variant whose embeddings differ from the floor's is not timed."""

from __future__ import annotations

import json

from bench.coldstart import run
from bench.handlers import floor_ort_build


def body(*vectors: list[float], **extra: object) -> bytes:
    return json.dumps({"embeddings": list(vectors), **extra}).encode()


def test_the_same_embeddings_within_tolerance_pass_and_others_are_named() -> None:
    floor = body([0.1, 0.2, 0.3])
    assert run.differs(body([0.1, 0.2, 0.30001], model="m@1"), floor) is None  # our extra fields do not matter
    assert "max |difference| 0.01" in (run.differs(body([0.1, 0.21, 0.3]), floor) or "")
    assert "shapes differ" in (run.differs(body([0.1, 0.2]), floor) or "")
    assert run.differs(b'{"warm": true}', floor) == "not both embeddings"


def test_the_floor_reads_its_build_steps_files() -> None:
    assert "floor_ort" in run.FLOOR_BUILT and "ours" not in run.FLOOR_BUILT
    _, env, _ = run.command("floor_ort", 1.0, None, run.runner.OPTIMIZED)
    assert env["WARMSTART_MODEL"] == str(run.runner.FLOOR)
    assert (floor_ort_build.MODEL, floor_ort_build.VOCAB) == ("model.onnx", "vocab.txt")


def test_a_target_is_judged_on_the_ratio_it_prints() -> None:
    # Within rounds ours is slower in 3 of 5 (median ratio 1.03x), but the floor's slow rounds lift its median
    # above ours' (ratio of the medians 0.52x): the printed within-round ratio decides, as the table says.
    res = run.runner.Results("test")
    for rnd, (ours, floor) in enumerate([(100, 50), (300, 290), (310, 600), (700, 650), (800, 900)]):
        res.rows += [
            {"round": rnd, "quota": 1.0, "cache": "warm", "variant": "ours", "first_ms": float(ours)},
            {"round": rnd, "quota": 1.0, "cache": "warm", "variant": "floor_ort", "first_ms": float(floor)},
        ]
    line = next(x for x in run.summarize(res, [1.0], ["warm"], ["ours", "floor_ort"]).splitlines() if "<= 1.0" in x)
    assert "1.03x" in line and line.rstrip(" |").endswith("NO")
