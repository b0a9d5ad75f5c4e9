"""The quality gate of a reduced-precision pack: its answers against the float32 model's on calibration texts.

Embedding: cosine per text (the gate's figure is the minimum; the median is recorded too). Rerank: per
query group, whether the top document is the same (top-1 agreement) and the Spearman correlation of all the
scores; the figure is the smaller of the two. Classify: the fraction of texts whose labels agree (argmax for
single-label, each label's sigmoid > 0.5 for multi-label). The pack is refused below `min_quality` (`QualityError`,
raised before anything is published), and the figures go into the manifest (`precision.quality`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from infra.pack.hf_checks import SourceError

# The default thresholds on the gate's figure, per task. Embedding: the worst text's cosine (int8 on
# all-MiniLM-L6-v2 measured 0.997 on the built-in set, float16/bfloat16 higher: docs/models.md).
SPARSE_TOP_K = 32  # a SPLADE query has tens of terms; a document's weight sits in its largest ones
DEFAULT_MIN_QUALITY = {
    "embedding": 0.99,
    "rerank": 0.9,
    "classify": 0.95,
    "multivector": 0.9,
    "sparse": 0.9,
    "hybrid": 0.9,
}
METRICS = {
    "embedding": "min cosine vs float32",
    "rerank": "min(top-1 agreement, Spearman) vs float32",
    "classify": "label agreement vs float32",
    "sparse": f"min top-{SPARSE_TOP_K} term overlap vs float32",
}
BATCH = 16
# Calibration batches are truncated here at most (the model's max length when shorter): positions past it
# are rarely what a reduced precision breaks, and a 16 x 8,192-token batch through a 0.6B float32 graph would
# cost gigabytes of attention scores at pack time.
MAX_TOKENS = 512
Feeds = dict[str, npt.NDArray[np.int64]]


class QualityError(SourceError):
    """The reduced-precision model disagrees with float32 beyond the threshold (nothing is written)."""


def calibration_feeds(
    source: Any, tokenizer: Any, texts: Sequence[str], names: Sequence[str], template: dict[str, Any] | None = None
) -> tuple[list[Feeds], list[int]]:
    """Token batches (right padding, truncated at the model's max length or MAX_TOKENS, sorted by length so that
    batches pad little) and the order they hold the calibration items in. Rerank: (query, document) pairs, each
    one text through `template` for a decoder reranker (infra.pack.lm_rerank's pair_template)."""
    from infra.pack.calibration import pairs

    items: list[Any] = pairs(list(texts)) if source.task == "rerank" else list(texts)
    lengths = [len(i[0]) + len(i[1]) if isinstance(i, tuple) else len(i) for i in items]
    # Rerank keeps query groups in order (top-1 agreement is per group): batched as they come.
    order = list(range(len(items))) if source.task == "rerank" else sorted(range(len(items)), key=lengths.__getitem__)
    feeds = []
    for start in range(0, len(order), BATCH):
        chunk = [items[i] for i in order[start : start + BATCH]]
        kwargs: dict[str, Any] = {
            "padding": True,
            "truncation": True,
            "max_length": min(source.max_seq_length, MAX_TOKENS),
            "return_tensors": "np",
            "padding_side": "right",  # the exported graphs pool assuming right padding (the runtime pads right)
        }
        if template is not None:
            texts_ = [f"{template['prefix']}{q}{template['middle']}{d}{template['suffix']}" for q, d in chunk]
            encoded = tokenizer(texts_, **kwargs)
        elif source.task == "rerank":
            encoded = tokenizer([q for q, _ in chunk], [d for _, d in chunk], **kwargs)
        else:
            encoded = tokenizer(chunk, **kwargs)
        feed = {}
        for name in names:
            value = encoded.get(name)
            feed[name] = (np.zeros_like(encoded["input_ids"]) if value is None else np.asarray(value)).astype(np.int64)
        feeds.append(feed)
    return feeds, order


def measure(
    task: str,
    want: npt.ArrayLike,
    got: npt.ArrayLike,
    problem_type: str | None = None,
    group: int = 8,
    texts: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The agreement figures of `got` (reduced precision) with `want` (float32), rows in the same order.
    `texts`: the rows' texts (embedding: the worst one is named, and the retrieval check runs on the built-in
    queries and documents where they are among them)."""
    want = np.asarray(want, np.float64)
    got = np.asarray(got, np.float64)
    if not np.all(np.isfinite(got)):
        bad = int(np.sum(~np.all(np.isfinite(got.reshape(len(got), -1)), axis=1)))
        return {"metric": METRICS[task], "figure": 0.0, "non_finite_rows": bad, "items": len(got)}
    if task == "embedding":
        norms = np.linalg.norm(want, axis=1) * np.linalg.norm(got, axis=1)
        cos = np.where(norms > 0, (want * got).sum(axis=1) / np.where(norms > 0, norms, 1.0), 1.0)
        out: dict[str, Any] = {
            "metric": METRICS[task],
            "figure": round(float(cos.min()), 6),
            "min_cosine": round(float(cos.min()), 6),
            "p1_cosine": round(float(np.percentile(cos, 1)), 6),
            "median_cosine": round(float(np.median(cos)), 6),
            "items": len(cos),
        }
        if texts is not None:
            out["worst_text"] = shown(texts[int(np.argmin(cos))])
            out.update(retrieval(want, got, texts))
        return out
    if task == "sparse":
        return sparse_overlap(want, got)
    if task == "rerank":
        want, got = want.reshape(-1), got.reshape(-1)
        groups = [slice(i, i + group) for i in range(0, len(want), group)]
        top1 = float(np.mean([np.argmax(want[g]) == np.argmax(got[g]) for g in groups]))
        rho = spearman(want, got)
        return {
            "metric": METRICS[task],
            "figure": round(min(top1, rho), 6),
            "top1_agreement": round(top1, 6),
            "spearman": round(rho, 6),
            "max_abs_diff": round(float(np.max(np.abs(want - got))), 6),
            "items": len(want),
        }
    if problem_type == "multi_label_classification":
        agree = np.all((want > 0) == (got > 0), axis=1)  # logits: sigmoid > 0.5 is logit > 0
    else:
        agree = np.argmax(want, axis=1) == np.argmax(got, axis=1)
    return {
        "metric": METRICS[task],
        "figure": round(float(np.mean(agree)), 6),
        "label_agreement": round(float(np.mean(agree)), 6),
        "max_abs_diff": round(float(np.max(np.abs(want - got))), 6),
        "items": len(agree),
    }


def sparse_overlap(want: npt.NDArray[np.float64], got: npt.NDArray[np.float64]) -> dict[str, Any]:
    """Per text, the share of float32's largest SPARSE_TOP_K terms (fewer where it has fewer non-zero ones)
    that the reduced model also has among its own largest as many; the figure is the smallest share. Also the
    dot products' agreement (what a sparse index scores with): the largest relative difference of a text
    with itself."""
    shares = []
    for w, g in zip(want, got, strict=True):
        k = min(SPARSE_TOP_K, int(np.count_nonzero(w)))
        if k == 0:
            shares.append(1.0 if not np.count_nonzero(g) else 0.0)
            continue
        top_w = set(np.argsort(-w, kind="stable")[:k].tolist())
        top_g = set(np.argsort(-g, kind="stable")[:k].tolist())
        shares.append(len(top_w & top_g) / k)
    self_dot = (want * want).sum(axis=1)
    cross = (want * got).sum(axis=1)
    rel = np.abs(cross - self_dot) / np.maximum(self_dot, 1e-12)
    return {
        "metric": METRICS["sparse"],
        "figure": round(float(min(shares)), 6),
        "min_top_k_overlap": round(float(min(shares)), 6),
        "median_top_k_overlap": round(float(np.median(shares)), 6),
        "max_dot_rel_diff": round(float(rel.max()), 6),
        "items": len(shares),
    }


WORST_SHOWN = 80  # characters of the worst text kept in the record (a 2,000-character text is not a figure)


def shown(text: str) -> str:
    return text if len(text) <= WORST_SHOWN else f"{text[:WORST_SHOWN]}... ({len(text)} characters)"


def retrieval(want: npt.NDArray[np.float64], got: npt.NDArray[np.float64], texts: Sequence[str]) -> dict[str, Any]:
    """Top-1 and top-10 agreement with float32 on the built-in queries and documents
    (infra.pack.calibration.RETRIEVAL_*), found among `texts`: the fraction of queries whose best document is the
    same, and the mean overlap of the ten best. Empty when they are not all there (a user's --calibration)."""
    from infra.pack.calibration import RETRIEVAL_DOCS, RETRIEVAL_QUERIES

    row = {t: i for i, t in enumerate(texts)}
    if not all(t in row for t in (*RETRIEVAL_QUERIES, *RETRIEVAL_DOCS)):
        return {}
    q = [row[t] for t in RETRIEVAL_QUERIES]
    d = [row[t] for t in RETRIEVAL_DOCS]

    def ranked(e: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
        unit = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
        return np.argsort(-(unit[q] @ unit[d].T), axis=1, kind="stable")

    a, b = ranked(want), ranked(got)
    k = min(10, len(d))
    top1 = float(np.mean(a[:, 0] == b[:, 0]))
    topk = float(np.mean([len(set(x[:k]) & set(y[:k])) / k for x, y in zip(a, b, strict=True)]))
    return {"retrieval_top1_agreement": round(top1, 6), "retrieval_top10_agreement": round(topk, 6)}


def spearman(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> float:
    """Spearman's rank correlation (average ranks for ties); 1.0 when both are constant."""

    def ranks(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=np.float64)
        for value in np.unique(x):  # ties share their average rank
            tied = x == value
            if tied.sum() > 1:
                r[tied] = r[tied].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    sa, sb = ra.std(), rb.std()
    if sa == 0 or sb == 0:
        return 1.0 if sa == sb else 0.0
    return float(np.mean((ra - ra.mean()) * (rb - rb.mean())) / (sa * sb))


def compare(
    task: str,
    feeds: list[Feeds],
    reference: Callable[[Feeds], npt.NDArray[np.float32]],
    candidate: Callable[[Feeds], npt.NDArray[np.float32]],
    problem_type: str | None = None,
    texts: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run both models over the calibration batches; the figures. `texts`: the rows' texts, in feed order."""
    want = np.concatenate([np.asarray(reference(f), np.float32) for f in feeds])
    got = np.concatenate([np.asarray(candidate(f), np.float32) for f in feeds])
    return measure(task, want, got, problem_type, texts=texts)


SAMPLE_EVERY = 4  # fail fast: every 4th calibration batch (and the first two: the shortest texts, specials among
# them) is gated before the rest is run


def sample(feeds: Sequence[Feeds]) -> list[int]:
    """The batches the fail-fast check gates first (calibration_feeds sorts by length: a stride covers them)."""
    return [i for i in range(len(feeds)) if i < 2 or i % SAMPLE_EVERY == 0]


def texts_in_feed_order(items: Sequence[str], order: Sequence[int]) -> list[str]:
    return [items[i] for i in order]


def check(task: str, figures: dict[str, Any], min_quality: float | None, what: str, early: str = "") -> dict[str, Any]:
    """The figures with the threshold recorded; QualityError below it (the message names the figure). `early`:
    said when the refusal comes from the fail-fast sample (the rest was not run)."""
    threshold = DEFAULT_MIN_QUALITY[task] if min_quality is None else float(min_quality)
    out = {**figures, "min_quality": threshold, "passed": figures["figure"] >= threshold}
    if not out["passed"]:
        detail = ", ".join(
            f"{k} {v!r}" if isinstance(v, str) else f"{k} {v}"
            for k, v in figures.items()
            if k not in ("metric", "figure") and not isinstance(v, dict)  # hybrid's parts: its weakest is named
        )
        raise QualityError(
            f"{what}: quality {figures['figure']:.6f} ({figures['metric']}) is below --min-quality {threshold} "
            f"({detail}){early}; nothing was written. Lower --min-quality to accept it, or pack float32"
        )
    return out
