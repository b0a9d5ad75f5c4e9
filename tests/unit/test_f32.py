"""handler.core.f32 writes each float32 as orjson writes a numpy float32: the same bytes, over random bit patterns of
the whole range and the edges (a lean start's answers must equal the numpy path's, handler.core.numpy_gate)."""

from __future__ import annotations

from array import array

import numpy as np
import orjson
import pytest

from handler.core.f32 import F32Rows, texts


def orjson_texts(values: np.ndarray) -> list[str]:
    text: str = orjson.dumps(values.astype(np.float32), option=orjson.OPT_SERIALIZE_NUMPY).decode()
    return text[1:-1].split(",") if len(values) else []


def assert_same(values: np.ndarray) -> None:
    values = values.astype(np.float32)
    got, want = texts(values.tolist()), orjson_texts(values)
    bad = [(float(v), w, g) for v, w, g in zip(values, want, got, strict=True) if w != g]
    assert not bad, bad[:10]


def test_random_bit_patterns_of_the_whole_range_are_written_as_orjson_writes_them() -> None:
    bits = np.random.default_rng(38).integers(0, 2**32, 60_000, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32)
    assert_same(values[np.isfinite(values)])


def test_embedding_like_values_are_written_as_orjson_writes_them() -> None:
    rng = np.random.default_rng(1)
    assert_same(rng.standard_normal(384 * 20) / np.sqrt(384))
    assert_same(rng.uniform(-1e-4, 1e-4, 5_000))  # the exact path's range, where normalized vectors go small


def test_the_edges_are_written_as_orjson_writes_them() -> None:
    powers = np.float32(2.0) ** np.arange(-149, 128, dtype=np.float32)
    subnormals = np.arange(1, 2_000, dtype=np.uint32).view(np.float32)
    largest = np.array([0x7F7FFFFF, 0x7F7FFFFE, 0x00800000, 0x007FFFFF, 0x00800001], np.uint32).view(np.float32)
    plain_edges = [1e-7, 9.999999e-7, 1e-6, 1.5e-6, 1e-4, 9.9999e-5, 1e12, 9.999999e12, 1e13, 1.5e13, 16777216.0]
    digits = [
        float(f"{d}e{e}")
        for d in ("1", "12", "123", "1234", "12345", "123456", "1234567", "12345678", "123456789")
        for e in range(-12, 16, 3)
    ]
    for group in (powers, subnormals, largest, np.array(plain_edges), np.array(digits)):
        assert_same(np.concatenate([group, -group]))
    assert texts([0.0, -0.0]) == ["0.0", "-0.0"] == orjson_texts(np.array([0.0, -0.0]))


def test_rows_are_a_json_matrix_with_the_numpy_paths_bytes() -> None:
    matrix = (np.random.default_rng(2).standard_normal((3, 5)) / 3).astype(np.float32)
    rows = F32Rows(array("f", matrix.ravel().tobytes()), 5)
    assert len(rows) == 3
    assert rows.json() == orjson.dumps(matrix, option=orjson.OPT_SERIALIZE_NUMPY)
    assert F32Rows(array("f", [1.5]), 1).json() == b"[[1.5]]"


@pytest.mark.parametrize("width", [0, 2])
def test_values_that_are_not_whole_rows_are_refused(width: int) -> None:
    with pytest.raises(ValueError, match="not rows of"):
        F32Rows(array("f", [1.0, 2.0, 3.0]), width)
