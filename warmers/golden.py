"""Checking golden answers (recorded in the manifest at pack time by `infra.pack.golden`) against what a
deployed version answers. Standard library only: it runs in the PreTraffic hook, shipped in warmer.zip."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# Embeddings: the project's parity contract with sentence-transformers; other numbers: absolute.
TOLERANCE = {"cosine": 0.9999, "atol": 1e-4}


def _numbers(value: Any) -> list[float] | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, list):
        out: list[float] = []
        for v in value:
            flat = _numbers(v)
            if flat is None:
                return None
            out += flat
        return out
    return None


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


def compare(case: dict[str, Any], actual: Any, tolerance: dict[str, float] | None = None) -> str | None:
    """None when `actual` (the response's value under the case's key) matches; else what differs."""
    tol = {**TOLERANCE, **(tolerance or {})}
    expected = case.get("expected")
    if case.get("key") == "embeddings":
        if not isinstance(actual, list) or not isinstance(expected, list) or len(actual) != len(expected):
            return f"expected {len(expected or [])} vectors, got {type(actual).__name__}"
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            ne, na = _numbers(e), _numbers(a)
            if ne is None or na is None or len(ne) != len(na):
                return f"vector {i}: shape differs"
            cos = _cosine(ne, na)
            if cos < tol["cosine"]:
                return f"vector {i}: cosine {cos:.6f} < {tol['cosine']}"
        return None
    ne, na = _numbers(expected), _numbers(actual)
    if ne is None or na is None:
        return None if expected == actual else "value differs"
    if len(ne) != len(na):
        return f"{len(na)} numbers, expected {len(ne)}"
    worst = max((abs(x - y) for x, y in zip(ne, na, strict=True)), default=0.0)
    return None if worst <= tol["atol"] else f"max abs difference {worst:.3g} > {tol['atol']}"
