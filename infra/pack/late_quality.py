"""The int8 quality gate's figure for task multivector: MaxSim ranking agreement with float32.

Each calibration batch's token vectors are kept where its attention mask is 1 (padding dropped), then the first
`QUERIES` texts each rank every calibration text by MaxSim (the sum over the query's vectors of its best dot
product with the text's), once with the float32 graph's vectors and once with the int8 graph's. The figure is
the smaller of the top-1 agreement (the same best text) and the mean Spearman correlation of the rankings. The
texts are tokenized as plain documents (no marker, no expansion): a check of the graph's precision on the same
inputs, not of the task's layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

METRIC = "min(top-1 agreement, Spearman) of MaxSim rankings vs float32"
QUERIES = 32  # texts ranking the others: 32 x every text's MaxSim stays seconds for a 512-token, 128-wide model


def token_rows(outputs: Sequence[Any], masks: Sequence[Any]) -> list[npt.NDArray[np.float32]]:
    """Each text's real token vectors, from per-batch (batch, sequence, width) outputs and their masks."""
    rows = []
    for out, mask in zip(outputs, masks, strict=True):
        for vectors, keep in zip(np.asarray(out, np.float32), np.asarray(mask).astype(bool), strict=True):
            rows.append(vectors[: len(keep)][keep])
    return rows


def maxsim_matrix(queries: Sequence[npt.NDArray[np.float32]], docs: Sequence[npt.NDArray[np.float32]]) -> Any:
    """scores[q, d]: MaxSim of query q against document d (documents padded with -inf rows, so never a max)."""
    width = docs[0].shape[1]
    longest = max(len(d) for d in docs)
    padded = np.full((len(docs), longest, width), 0.0, np.float32)
    valid = np.zeros((len(docs), longest), bool)
    for i, d in enumerate(docs):
        padded[i, : len(d)] = d
        valid[i, : len(d)] = True
    scores = np.zeros((len(queries), len(docs)))
    for i, q in enumerate(queries):
        sims = np.einsum("qw,dtw->qdt", q, padded)
        sims = np.where(valid[None], sims, -np.inf).max(axis=2)
        scores[i] = np.where(np.isfinite(sims), sims, 0.0).sum(axis=0)
    return scores


def agreement(
    want: Sequence[npt.NDArray[np.float32]], got: Sequence[npt.NDArray[np.float32]], texts: Sequence[str] | None = None
) -> dict[str, Any]:
    """The gate's figures from the texts' float32 and reduced-precision token vectors (same texts, same order).
    `texts`: the rows' texts (the query whose ranking agrees least is named)."""
    from infra.pack.quality import shown, spearman

    bad = sum(1 for g in got if not np.all(np.isfinite(g)))
    if bad:
        return {"metric": METRIC, "figure": 0.0, "non_finite_rows": bad, "items": len(got)}
    n = min(QUERIES, len(want))
    a, b = maxsim_matrix(want[:n], want), maxsim_matrix(got[:n], got)
    same = np.argmax(a, axis=1) == np.argmax(b, axis=1)
    rhos = [spearman(x, y) for x, y in zip(a, b, strict=True)]
    top1, rho = float(np.mean(same)), float(np.mean(rhos))
    cos = [float((w * g).sum(axis=1).min()) for w, g in zip(want, got, strict=True) if len(w) and w.shape == g.shape]
    named = {} if texts is None else {"worst_text": shown(texts[int(np.argmin(np.minimum(same, rhos)))])}
    return {
        **named,
        "metric": METRIC,
        "figure": round(min(top1, rho), 6),
        "top1_agreement": round(top1, 6),
        "spearman": round(rho, 6),
        "min_token_cosine": round(min(cos), 6) if cos else 1.0,
        "queries": n,
        "items": len(want),
    }
