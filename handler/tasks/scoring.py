"""Scores from model outputs: softmax / sigmoid as `transformers`' text-classification pipeline computes
them (float64 from float32 logits, max-shifted), and ranking (highest first, ties by index)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # types only: numpy.typing's import dedents docstrings with regexes, at init
    import numpy.typing as npt


def softmax(logits: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    x = np.asarray(logits, dtype=np.float64)
    shifted = np.exp(x - x.max(axis=-1, keepdims=True))  # no overflow for large logits
    return shifted / shifted.sum(axis=-1, keepdims=True)  # type: ignore[no-any-return]


def sigmoid(x: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def rank(scores: npt.NDArray[np.floating], top: int | None = None) -> npt.NDArray[np.intp]:
    """Indices of `scores` (1-D) highest first; equal scores keep index order. `top`: at most that many."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    return order if top is None else order[:top]
