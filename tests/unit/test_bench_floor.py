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
