"""`handler.tasks.batch`: several requests' texts in one model run, each answered as its own call would be.

The fake backend computes from the masked ids only (tests/unit/test_text_tasks.py), so a batched answer
equals the single call's exactly when rows are padded and masked right; the real model's padding numerics
are tested in tests/functional/test_batching.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.core.errors import InvalidInputError
from handler.tasks.batch import Prepared, groups, run_prepared
from tests.unit.test_text_tasks import make, roundtrip

MIXED = ["the fox", "the quick brown fox jumps over the lazy dog", "a", "query passage a b c d"]


@pytest.mark.parametrize(
    ("task_name", "payloads"),
    [
        (
            "embedding",
            [
                {"inputs": [MIXED[0]]},
                {"inputs": MIXED[1:3], "dimensions": 2},
                {"inputs": [MIXED[3]], "encoding_format": "base64"},
            ],
        ),
        (
            "rerank",
            [
                {"query": "fox", "documents": MIXED},
                {"query": "the quick brown dog", "documents": MIXED[:2], "top_n": 1, "return_documents": True},
            ],
        ),
        ("classify", [{"inputs": MIXED[:1]}, {"inputs": MIXED, "top_k": 2}, {"inputs": MIXED[2:3], "top_k": 1}]),
    ],
)
def test_batched_answers_equal_single_calls(tmp_path: Path, task_name: str, payloads: list[dict[str, Any]]) -> None:
    task, backend = make(tmp_path, task_name)
    singles = [task(p) for p in payloads]
    backend.feeds.clear()
    batched = run_prepared(task, [task.prepare(p) for p in payloads], max_tokens=10_000)
    assert len(backend.feeds) == 1  # one model run for all of them
    rows = backend.feeds[0]["input_ids"].shape[0]
    assert rows == sum(len(p.get("inputs", p.get("documents", []))) for p in payloads)
    # options per caller, token counts without the batch's padding; the same bytes out of the encoder
    assert [roundtrip(a) for a in batched] == [roundtrip(a) for a in singles]


def test_rows_are_padded_with_the_pad_id_and_a_zero_mask(tmp_path: Path) -> None:
    task, backend = make(tmp_path, "embedding")
    run_prepared(task, [task.prepare({"inputs": ["a"]}), task.prepare({"inputs": [MIXED[1]]})], 10_000)
    ids, mask = backend.feeds[0]["input_ids"], backend.feeds[0]["attention_mask"]
    short = int(mask[0].sum())
    assert short < ids.shape[1] and (ids[0, short:] == task.encoder.pad_id).all() and (mask[0, short:] == 0).all()


def test_token_bound_splits_runs_and_a_long_request_runs_alone(tmp_path: Path) -> None:
    task, backend = make(tmp_path, "embedding")
    prepared = [task.prepare({"inputs": [t]}) for t in [*MIXED, "b"]]
    assert groups(prepared, max_tokens=1) == [[i] for i in sorted(range(5), key=lambda i: prepared[i].length)]
    bound = 2 * max(p.length for p in prepared)
    out = run_prepared(task, prepared, max_tokens=bound)
    assert all(isinstance(o, dict) for o in out)
    shapes = [f["input_ids"].shape for f in backend.feeds]
    assert len(shapes) > 1 and sum(rows for rows, _ in shapes) == 5
    assert all(rows * width <= bound for rows, width in shapes)
    assert [width for _, width in shapes] == sorted(width for _, width in shapes)  # shortest first


def test_a_bad_finish_is_that_requests_error_only(tmp_path: Path) -> None:
    task, _ = make(tmp_path, "embedding")
    good = task.prepare({"inputs": ["the fox"]})

    def broken(rows: Any, tokens: int) -> dict[str, Any]:
        raise InvalidInputError("this request's own problem")

    out = run_prepared(task, [good, Prepared(task.encoder.tokenize(["a dog"]), broken), good], 10_000)
    assert isinstance(out[1], InvalidInputError)
    assert roundtrip(out[0]) == roundtrip(out[2]) == roundtrip(task({"inputs": ["the fox"]}))


def test_a_failed_run_is_retried_per_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    task, backend = make(tmp_path, "classify")
    real = backend.run

    def run(feeds: dict[str, np.ndarray]) -> Any:
        if feeds["input_ids"].shape[0] > 1:
            raise MemoryError("too big together")
        if int(feeds["attention_mask"].sum()) > 6:
            raise ValueError("too long alone")
        return real(feeds)

    monkeypatch.setattr(backend, "run", run)
    out = run_prepared(task, [task.prepare({"inputs": [t]}) for t in MIXED[:3]], 10_000)
    assert isinstance(out[1], ValueError) and isinstance(out[0], dict) and isinstance(out[2], dict)


def test_dimensions_over_the_models_are_refused_at_prepare(tmp_path: Path) -> None:
    task, _ = make(tmp_path, "embedding")
    with pytest.raises(InvalidInputError, match="dimensions"):
        task.prepare({"inputs": ["x"], "dimensions": 99})


def test_a_request_with_nothing_to_run_is_answered_without_a_model_run(tmp_path: Path) -> None:
    task, backend = make(tmp_path, "embedding")
    answered = {"answered": "without the model"}  # a sparse model's static query encoder's answer
    seen: list[int] = []
    prepared = [task.prepare({"inputs": ["a"]}), Prepared([], lambda rows, tokens: answered)]
    out = run_prepared(task, prepared, 10_000, lambda i, outcome: seen.append(i))
    assert out[1] == answered and isinstance(out[0], dict) and len(backend.feeds) == 1
    assert seen == [1, 0]  # reported first, before the model runs
    backend.feeds.clear()
    assert run_prepared(task, [Prepared([], lambda rows, tokens: answered)], 10_000) == [answered]
    assert backend.feeds == []
