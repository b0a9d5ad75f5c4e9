"""Dynamic batching, the model's side: several requests' texts run as one model run, each request checked
and tokenized on its own first, so one bad input fails only its own request.

A text task's `prepare(payload)` checks the request and tokenizes it, and returns a `Prepared`: the request's
encodings and its `finish(rows, tokens)`, which turns its rows of the model's output into its answer with
its own options (dimensions, encoding format, top_n...). `run_prepared` pads the rows of a batch to the
longest (masked, as one request's own texts are padded), runs them in groups bounded by padded tokens
(shortest first, so rows of like length share a run), and hands each request its rows as soon as its run is
done. A request over the bound alone is split across runs too, and its rows put back together before its
`finish`. A model run that fails is run again one request at a time, so each request gets its own answer or
error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from handler.backends.contract import Backend
from handler.backends.pool import BufferPool, current_arena
from handler.core.types import Protocol
from handler.tasks.text import chunks
from handler.tasks.tokens import TextEncoder

if TYPE_CHECKING:  # types only: numpy.typing's import dedents docstrings with regexes, at init
    import numpy.typing as npt

    Finish = Callable[[npt.NDArray[Any], int], dict[str, Any]]


class Prepared:
    """One request, checked and tokenized: its encodings (padded to its own longest) and how its rows of
    the model's output become its answer (`finish` copies what it keeps: the rows are a pooled buffer's)."""

    __slots__ = ("encodings", "finish", "length")

    def __init__(self, encodings: Sequence[Any], finish: Finish) -> None:
        self.encodings = encodings
        self.finish = finish
        self.length = len(encodings[0].ids) if encodings else 0


class BatchModel(Protocol):
    """What `run_prepared` needs of a text task (`handler.tasks.text.TextModel` has it)."""

    encoder: TextEncoder
    backend: Backend
    output: str
    type_ids: bool
    pool: BufferPool
    batch_tokens: int  # padded tokens of one model run (Config.batch_tokens)


def groups(prepared: Sequence[Prepared], max_tokens: int) -> list[list[int]]:
    """Indices of `prepared` in model runs: shortest first, each run's rows x longest within `max_tokens`
    (a request over it alone runs alone, its rows split across runs by `_run_group`)."""
    order = sorted((i for i in range(len(prepared)) if prepared[i].encodings), key=lambda i: prepared[i].length)
    out: list[list[int]] = []
    current: list[int] = []
    rows = longest = 0
    for i in order:
        n, length = len(prepared[i].encodings), prepared[i].length
        if current and (rows + n) * max(longest, length) > max_tokens:
            out.append(current)
            current, rows, longest = [], 0, 0
        current.append(i)
        rows += n
        longest = max(longest, length)
    if current:
        out.append(current)
    return out


def run_prepared(
    model: BatchModel,
    prepared: Sequence[Prepared],
    max_tokens: int,
    report: Callable[[int, Any], None] | None = None,
    wanted: Callable[[int], bool] | None = None,
) -> list[Any]:
    """Each request's answer, or the exception that is its own error, in order. `report(i, outcome)`: called
    for each request as soon as its model run is done (shortest first: a small request is answered before
    a long one's run starts). `wanted(i)`: checked before each run; a request no longer wanted (its client
    left) is not run, not reported, and its result stays None."""
    results: list[Any] = [None] * len(prepared)
    for i, p in enumerate(prepared):  # nothing to run (a sparse model's static query encoder): answered first
        if not p.encodings:
            try:
                results[i] = p.finish(np.zeros((0, 0), np.float32), 0)
            except Exception as e:
                results[i] = e
            if report is not None:
                report(i, results[i])
    for group in groups(prepared, max_tokens):
        if wanted is not None:
            group = [i for i in group if wanted(i)]
            if not group:
                continue
        try:
            _run_group(model, prepared, group, results)
        except Exception as e:
            if len(group) == 1:
                results[group[0]] = e
            else:
                for i in group:  # the run failed as a whole: each request alone, each with its own outcome
                    try:
                        _run_group(model, prepared, [i], results)
                    except Exception as alone:
                        results[i] = alone
        if report is not None:
            for i in group:
                report(i, results[i])
    return results


def _run_group(model: BatchModel, prepared: Sequence[Prepared], group: list[int], results: list[Any]) -> None:
    """One group's requests answered. Their rows run in model runs of at most `model.batch_tokens` padded
    tokens (one request's rows too: a request of max inputs x max chars would otherwise be one run of tens of
    thousands of tokens, gigabytes of activations); a request's rows are reassembled before its `finish`."""
    encodings = [e for i in group for e in prepared[i].encodings]
    spans = chunks([len(e.ids) for e in encodings], model.batch_tokens)
    with model.pool.request():
        if len(spans) == 1:
            out, mask = run_encodings(model, encodings)
            counts = mask.sum(axis=1)
        else:  # each run's rows copied out: the pooled outputs of all runs are small (rows x output width)
            runs = [run_encodings(model, encodings[start:stop]) for start, stop in spans]
            out = np.concatenate([o for o, _ in runs])
            counts = np.concatenate([m.sum(axis=1) for _, m in runs])
        row = 0
        for i in group:
            n = len(prepared[i].encodings)
            try:  # finished inside the arena: the answer holds copies, never the pooled buffer
                results[i] = prepared[i].finish(out[row : row + n], int(counts[row : row + n].sum()))
            except Exception as e:
                results[i] = e
            row += n


def run_encodings(model: BatchModel, encodings: Sequence[Any]) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]:
    """The model's output for rows of (possibly) unequal lengths, padded to the longest with the pad id and
    a zero mask; the caller holds the arena."""
    arena = current_arena()
    assert arena is not None
    shape = (len(encodings), max(len(e.ids) for e in encodings))
    ids, mask = arena.take(shape, np.int64), arena.take(shape, np.int64)
    types = arena.take(shape, np.int64) if model.type_ids else None
    if all(len(e.ids) == shape[1] for e in encodings):
        TextEncoder.fill(encodings, ids, mask)
        if types is not None:
            TextEncoder.fill_type_ids(encodings, types)
    else:
        ids.fill(model.encoder.pad_id)
        mask.fill(0)
        if types is not None:
            types.fill(0)
        for r, e in enumerate(encodings):
            n = len(e.ids)
            ids[r, :n] = e.ids
            mask[r, :n] = e.attention_mask
            if types is not None:
                types[r, :n] = e.type_ids
    feeds = {"input_ids": ids, "attention_mask": mask}
    if types is not None:
        feeds["token_type_ids"] = types
    return model.backend.run(feeds)[model.output], mask
