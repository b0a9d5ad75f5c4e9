"""Memory bounded per request (issue 32 faults 4-5): every model run within `batch_tokens` padded tokens,
one request's rows included, with the same answers as one run; a prompt (or a rerank query) checked as a
text is, and counted with each text it goes in front of."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.core.config import Config
from handler.core.errors import InputTooLongError, InvalidEncodingError, InvalidInputError
from handler.tasks import tokens
from handler.tasks.batch import run_prepared
from handler.tasks.text import chunks
from tests.unit.test_text_tasks import make

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]
# Texts of many lengths: a request of them pads to the longest, 11 tokens with [CLS] and [SEP].
TEXTS = [" ".join(WORDS[: 1 + i % len(WORDS)]) for i in range(40)]
PAYLOADS = {
    "embedding": {"inputs": TEXTS},
    "rerank": {"query": "fox", "documents": TEXTS},
    "classify": {"inputs": TEXTS},
}


def config(tmp_path: Path, **settings: Any) -> Config:
    return Config(model_dir=tmp_path, backend=None, **settings)


def two(tmp_path: Path, task_name: str, **settings: Any) -> tuple[Any, Any, Any]:
    """The task with default settings, and with `settings` (and its fake backend), in folders of their own."""
    (tmp_path / "whole").mkdir()
    (tmp_path / "split").mkdir()
    whole, _ = make(tmp_path / "whole", task_name)
    task, backend = make(tmp_path / "split", task_name, config(tmp_path, **settings))
    return whole, task, backend


def padded(feeds: dict[str, Any]) -> int:
    rows, longest = feeds["input_ids"].shape
    return int(rows * longest)


@pytest.mark.parametrize(
    ("lengths", "budget", "want"),
    [
        ([10] * 7, 30, [(0, 3), (3, 6), (6, 7)]),
        ([10] * 3, 1000, [(0, 3)]),
        ([50, 10], 30, [(0, 1), (1, 2)]),  # a row over the budget runs alone
        ([2, 3, 9, 9], 20, [(0, 2), (2, 4)]),  # rows x the run's longest: 3 x 9 > 20
        ([], 10, []),
    ],
)
def test_chunks(lengths: list[int], budget: int, want: list[tuple[int, int]]) -> None:
    assert chunks(lengths, budget) == want


@pytest.mark.parametrize("task_name", ["embedding", "rerank", "classify"])
def test_one_request_runs_in_runs_within_the_budget_with_the_same_answer(tmp_path: Path, task_name: str) -> None:
    """One request of 40 rows ran as one 40-row model run whatever WARMSTART_BATCH_TOKENS said."""
    whole, task, backend = two(tmp_path, task_name, batch_tokens=64)
    want = whole(PAYLOADS[task_name])
    got = task(PAYLOADS[task_name])
    assert len(backend.feeds) > 1
    assert all(padded(feeds) <= 64 for feeds in backend.feeds)
    assert sum(feeds["input_ids"].shape[0] for feeds in backend.feeds) == len(TEXTS)
    np.testing.assert_equal(got, want)  # every row's answer, its order, and the token count


@pytest.mark.parametrize("task_name", ["embedding", "rerank", "classify"])
def test_a_batched_request_over_the_budget_is_split_and_put_back_together(tmp_path: Path, task_name: str) -> None:
    """The batch path ran a request over the budget alone, but as one run of all its rows."""
    task, backend = make(tmp_path, task_name, config(tmp_path, batch_tokens=64))
    small = PAYLOADS[task_name] | ({"documents": TEXTS[:2]} if task_name == "rerank" else {"inputs": TEXTS[:2]})
    payloads = [small, PAYLOADS[task_name], small]
    singles = [task(p) for p in payloads]
    backend.feeds.clear()
    out = run_prepared(task, [task.prepare(p) for p in payloads], max_tokens=64)
    np.testing.assert_equal(out, singles)
    assert all(padded(feeds) <= 64 for feeds in backend.feeds)


def test_a_row_longer_than_the_budget_runs_alone(tmp_path: Path) -> None:
    task, backend = make(tmp_path, "embedding", config(tmp_path, batch_tokens=4))
    task({"inputs": TEXTS[:5]})
    assert [feeds["input_ids"].shape[0] for feeds in backend.feeds] == [1] * 5


@pytest.mark.parametrize(
    ("payload", "error", "match"),
    [
        ({"inputs": ["x"], "prompt": "p" * 51}, InputTooLongError, '"prompt" has 51 characters; at most 50'),
        ({"inputs": ["x"], "prompt": "\ud800"}, InvalidEncodingError, '"prompt" is not valid Unicode'),
        ({"inputs": ["x"], "prompt": 3}, InvalidInputError, '"prompt" must be a string'),
        # Each within the limit, but the model reads them as one text.
        (
            {"inputs": ["a" * 30, "b"], "prompt": "p" * 30},
            InputTooLongError,
            r"the prompt \(30 characters\) and inputs\[0\] \(30\) have 60 characters together; at most 50",
        ),
    ],
)
def test_prompt_checked_as_a_text(tmp_path: Path, payload: Any, error: type[Exception], match: str) -> None:
    task, _ = make(tmp_path, "embedding", config(tmp_path, max_inputs=4, max_chars=50))
    with pytest.raises(error, match=match):
        task(payload)
    with pytest.raises(error, match=match):
        task.prepare(payload)
    assert len(task({"inputs": ["a" * 25], "prompt": "p" * 25})["embeddings"]) == 1  # 50 together: within


def test_prompt_names_text_counts_too(tmp_path: Path) -> None:
    task, _ = make(tmp_path, "embedding", config(tmp_path, max_chars=20), prompts={"query": "query: "})
    with pytest.raises(InputTooLongError, match=r"inputs\[0\] \(15\) have 22 characters"):
        task({"inputs": ["a" * 15], "prompt_name": "query"})


def test_rerank_query_counts_with_each_document(tmp_path: Path) -> None:
    task, _ = make(tmp_path, "rerank", config(tmp_path, max_inputs=4, max_chars=50))
    with pytest.raises(InputTooLongError, match=r"query \(40 characters\) and documents\[1\] \(11\)"):
        task({"query": "q" * 40, "documents": ["a", "b" * 11]})
    assert len(task({"query": "q" * 40, "documents": ["a" * 10]})["results"]) == 1


def test_batch_tokens_from_the_environment() -> None:
    assert Config.from_environ({}).batch_tokens == 8192
    assert Config.from_environ({"WARMSTART_BATCH_TOKENS": "512"}).batch_tokens == 512


def test_outputs_of_split_runs_equal_one_run_to_the_bit(tmp_path: Path) -> None:
    """The fake backend's output depends on each row's masked ids only, so split runs must give its bits."""
    whole, task, _ = two(tmp_path, "embedding", batch_tokens=32)
    with whole.pool.request():
        want, want_tokens = whole._run(TEXTS)
        want = want.copy()
    got, tokens = task.run_copy(TEXTS)
    assert np.array_equal(got, want) and tokens == want_tokens


@pytest.mark.parametrize("pairs", [False, True])
def test_long_requests_keep_no_overflow_and_the_same_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pairs: bool
) -> None:
    """Truncated encodings kept every token cut off: 256 inputs of 20,000 CJK characters held 730 MB."""
    task, _ = make(tmp_path, "rerank" if pairs else "embedding", config(tmp_path))
    long = [" ".join(WORDS * (1 + i % 50)) for i in range(30)]  # up to 450 words: cut at max length
    texts: list[Any] = [("the fox", t) for t in long] if pairs else long
    want = task.encoder._encode_batch(texts)  # one call: what a short request still gets
    assert any(e.overflowing for e in want)
    monkeypatch.setattr(tokens, "SLICE_CHARS", 2000, raising=False)  # several slices of a few texts each
    got = task.encoder.tokenize(texts)
    assert not any(getattr(e, "overflowing", None) for e in got)
    for field in ("ids", "attention_mask", "type_ids"):
        assert [getattr(e, field) for e in got] == [getattr(e, field) for e in want]
