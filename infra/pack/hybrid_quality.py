"""The int8 quality gate's figure for task hybrid (bge-m3): the smallest of its three outputs' figures.

The graph's one output is per token [hidden, unit length | lexical weight | multi-vector, unit length]
(infra.pack.hybrid_source); each part is sliced as the task reads it and measured as the task that serves it
alone is: dense (the CLS row) by the embedding task's min cosine; sparse (the largest weight per token id, the
dropped ids zeroed) by the sparse task's top-k term overlap; multi-vector (the rows after CLS, padding dropped)
by the multivector task's MaxSim ranking agreement. A gate on one of them alone would pass a pack whose other
outputs int8 broke; each part's record names its worst input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from infra.pack.quality import SPARSE_TOP_K

METRIC = f"min(dense min cosine, sparse top-{SPARSE_TOP_K} term overlap, MaxSim ranking agreement) vs float32"
PARTS = ("dense", "sparse", "multivector")


def figures(
    source: Any, feeds: Sequence[Any], want: Sequence[Any], got: Sequence[Any], texts: Sequence[str] | None
) -> dict[str, Any]:
    """The gate's figures from per-batch float32 (`want`) and int8 (`got`) outputs on `feeds`, rows in `texts`'
    order (None: no text named)."""
    from infra.pack.late_quality import agreement, token_rows
    from infra.pack.quality import measure

    dim = int(source.dimension)
    unused = np.asarray(source.hybrid.unused_ids, np.int64)
    masks = [np.asarray(f["attention_mask"]) for f in feeds]
    a = [np.asarray(w, np.float32) for w in want]
    b = [np.asarray(g, np.float32) for g in got]
    parts = {
        "dense": measure("embedding", _cls(a, dim), _cls(b, dim), texts=texts),
        "sparse": sparse_figures(_lexical(a, feeds, dim, unused), _lexical(b, feeds, dim, unused), texts),
        "multivector": agreement(
            token_rows([x[:, 1:, dim + 1 :] for x in a], [m[:, 1:] for m in masks]),
            token_rows([x[:, 1:, dim + 1 :] for x in b], [m[:, 1:] for m in masks]),
            texts,
        ),
    }
    weakest = min(PARTS, key=lambda p: parts[p]["figure"])
    out: dict[str, Any] = {"metric": METRIC, "figure": parts[weakest]["figure"], "weakest": weakest}
    if "worst_text" in parts[weakest]:
        out["worst_text"] = parts[weakest]["worst_text"]
    return {**out, **parts, "items": sum(len(m) for m in masks)}


def _cls(outputs: Sequence[npt.NDArray[np.float32]], dim: int) -> npt.NDArray[np.float32]:
    return np.concatenate([x[:, 0, :dim] for x in outputs])


def _lexical(
    outputs: Sequence[npt.NDArray[np.float32]], feeds: Sequence[Any], dim: int, unused: npt.NDArray[np.int64]
) -> list[npt.NDArray[np.float32]]:
    """Per text, the largest lexical weight of each of its token ids (ascending id; FlagEmbedding's dropped ids
    weigh 0): the same ids for float32 and int8, as both read the same tokens."""
    rows = []
    for out, feed in zip(outputs, feeds, strict=True):
        for weights, ids, keep in zip(
            out[:, :, dim], np.asarray(feed["input_ids"]), np.asarray(feed["attention_mask"]).astype(bool), strict=True
        ):
            ids, weights = ids[: len(keep)][keep], weights[: len(keep)][keep]
            unique, where = np.unique(ids, return_inverse=True)
            vec = np.zeros(len(unique), np.float32)
            np.maximum.at(vec, where, weights)
            vec[np.isin(unique, unused)] = 0.0
            rows.append(vec)
    return rows


def sparse_figures(
    want: Sequence[npt.NDArray[np.float32]], got: Sequence[npt.NDArray[np.float32]], texts: Sequence[str] | None
) -> dict[str, Any]:
    """quality.sparse_overlap over the texts' own ids (zero-padded to the longest: a zero is never in float32's
    top k) and the text whose overlap is the smallest."""
    from infra.pack.quality import METRICS, shown, sparse_overlap

    width = max((len(w) for w in want), default=0)
    a, b = (np.zeros((len(want), max(width, 1))) for _ in range(2))
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        a[i, : len(w)], b[i, : len(g)] = w, g
    bad = int(np.sum(~np.all(np.isfinite(b), axis=1)))
    if bad:  # as quality.measure: a NaN weight is no figure
        return {"metric": METRICS["sparse"], "figure": 0.0, "non_finite_rows": bad, "items": len(b)}
    out = sparse_overlap(a, b)
    if texts is not None:
        shares = [sparse_overlap(a[i : i + 1], b[i : i + 1])["figure"] for i in range(len(a))]
        out["worst_text"] = shown(texts[int(np.argmin(shares))])
    return out
