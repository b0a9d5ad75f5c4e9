"""`--quantize int8`'s sensitivity search: which MatMul groups stay float32 so that the worst calibration text
passes the gate.

The worst texts are the special tokens' alone (`[PAD] [SEP]`, `</s> <pad>`: their tokens carry the model's
largest activations), and their error does not add up group by group: a proxy (each group's own int8 error)
ranked MiniLM's FFN outputs first, and keeping them float32 lowered the worst text. So it is measured: the HARD
worst rows of the all-int8 graph (each run alone, unpadded) are run with each candidate group kept float32, and
groups are kept greedily (each step the one that lifts their worst the most) until they clear the target, then
every text is run again (ROUNDS times at most, the new worst rows joining the hard ones); the best full run's
groups are kept. The gate then runs every text. At most
`budget` of the groups stay float32: the speed targets hold only while most run in int8.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HARD = 16  # the worst rows the search measures on (each run alone: a trial is a fraction of a gate run)
MARGIN = 0.002  # the search aims this far above the gate's threshold: the gate runs on every text, the search on few
BUDGET = 0.25  # at most this fraction of the groups kept float32 (MiniLM: 6 of 24, mpnet: 12 of 48)
RECHECK = 6  # candidates measured again at each greedy step after the first (the rest keep their last measure)
ROUNDS = 3  # full runs (new worst rows each) before the search stops
Feeds = dict[str, Any]


@dataclass
class Search:
    """What the search found: the groups kept float32 (in the order chosen), each trial's worst cosine on the
    hard rows, and the full runs' worst cosines."""

    kept: list[str] = field(default_factory=list)
    sensitivity: dict[str, float] = field(default_factory=dict)  # group -> worst hard cosine, it alone int8
    steps: list[tuple[str, float]] = field(default_factory=list)  # (group added, worst hard cosine after)
    full: list[float] = field(default_factory=list)
    paths: list[dict[str, Any]] = field(default_factory=list)  # the float paths tried first (quantize.choose_paths)

    def to_json(self) -> dict[str, Any]:
        return {
            "kept_float": list(self.kept),
            "steps": [[g, round(c, 6)] for g, c in self.steps],
            "full_min_cosine": [round(c, 6) for c in self.full],
            "float_paths_tried": self.paths,
        }


def cosines(want: Any, got: Any) -> Any:
    want, got = np.asarray(want, np.float64), np.asarray(got, np.float64)
    want, got = want.reshape(len(want), -1), got.reshape(len(got), -1)
    norms = np.linalg.norm(want, axis=1) * np.linalg.norm(got, axis=1)
    return np.where(norms > 0, (want * got).sum(axis=1) / np.where(norms > 0, norms, 1.0), 1.0)


def single_rows(feeds: Sequence[Feeds], rows: Sequence[int]) -> list[Feeds]:
    """The calibration rows `rows` (numbered across the batches) as one-row feeds cut to their own length."""
    out = []
    starts = np.cumsum([0, *[len(next(iter(f.values()))) for f in feeds]])
    for row in rows:
        batch = int(np.searchsorted(starts, row, side="right") - 1)
        feed, at = feeds[batch], row - int(starts[batch])
        mask = feed.get("attention_mask")
        length = int(mask[at].sum()) if mask is not None else next(iter(feed.values())).shape[1]
        out.append({k: v[at : at + 1, :length] for k, v in feed.items()})
    return out


def search(
    run: Callable[[Sequence[str], Sequence[Feeds]], Any],
    groups: Sequence[str],
    feeds: Sequence[Feeds],
    want: Any,
    target: float,
    budget: float = BUDGET,
) -> tuple[Search, Any]:
    """The groups to keep float32, and the int8 answers on every feed with them kept. `run(keep, feeds)`: the
    answers (rows concatenated) of the int8 graph with the groups `keep` left float32 (quantize.int8_answers);
    `want`: the float32 answers on `feeds` (rows concatenated). Each group's sensitivity is measured: the hard
    rows' worst cosine with it kept float32 too. A proxy (each group's own int8 error) ranked MiniLM's FFN
    outputs first and lowered the worst text: the special-token texts' error does not add up group by group."""
    result = Search()
    most = max(1, int(len(groups) * budget))
    got = run((), feeds)
    best: tuple[float, list[str], Any] = (-2.0, [], got)
    hard_rows: list[int] = []
    for _ in range(ROUNDS):
        worst = cosines(want, got)
        result.full.append(float(worst.min()))
        if worst.min() > best[0]:
            best = (float(worst.min()), list(result.kept), got)
        if worst.min() >= target or len(result.kept) >= most:
            break
        # the hard rows accumulate: a group kept for one text's sake can break another (MiniLM's layer 0 FFN
        # output lifted `[SEP]` and sank `[PAD] [SEP]` to 0.86)
        hard_rows += [int(i) for i in np.argsort(worst)[:HARD] if int(i) not in hard_rows]
        hard = single_rows(feeds, hard_rows)
        hard_want = np.asarray(want)[hard_rows]

        def worst_hard(keep: Sequence[str], hard: list[Feeds] = hard, hard_want: Any = hard_want) -> float:
            return float(cosines(hard_want, run(keep, hard)).min())

        # Greedy: each step keeps the group whose float32 lifts the hard rows' worst the most, measured; after
        # the first step only the RECHECK best of the last measures are measured again (a pack-time budget).
        result.sensitivity = {g: worst_hard([*result.kept, g]) for g in groups if g not in result.kept}
        while len(result.kept) < most:
            pick = max(result.sensitivity, key=result.sensitivity.__getitem__)
            result.kept.append(pick)
            reached = result.sensitivity.pop(pick)
            result.steps.append((pick, reached))
            if reached >= target + MARGIN or not result.sensitivity:
                break
            for g in sorted(result.sensitivity, key=lambda g: -result.sensitivity[g])[:RECHECK]:
                result.sensitivity[g] = worst_hard([*result.kept, g])
        got = run(result.kept, feeds)
    else:
        worst = cosines(want, got)
        result.full.append(float(worst.min()))
        if worst.min() > best[0]:
            best = (float(worst.min()), list(result.kept), got)
    result.kept = best[1]  # the best full run's groups (never worse than all int8)
    return result, best[2]
