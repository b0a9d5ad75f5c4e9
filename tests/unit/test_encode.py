"""The edge's encoder (`handler.api.encode`): float32 answers as JSON text that parses back to the same float32,
NaN never written, and what awslambdaric does with the bytes it is handed."""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from handler.api import encode
from handler.api.encode import dumps


def _reads_back(array: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """The answer as a client reads it: `json.loads` (float64), then float32, as numpy, PyTorch or an OpenAI
    client does."""
    return np.asarray(json.loads(dumps(array)), dtype=np.float32).reshape(array.shape)


def _all_exponents() -> npt.NDArray[np.float32]:
    """Every finite exponent (subnormals' included), both signs, each with its lowest and highest 2,048
    mantissas and 2,048 random ones: the ends of each binade, where the shortest decimal is hardest."""
    rng = np.random.default_rng(33)
    exponents = np.arange(255, dtype=np.uint32) << 23  # 0: subnormals (and zero); 254: the largest finite
    ends = np.concatenate([np.arange(2048), (1 << 23) - 1 - np.arange(2048), rng.integers(0, 1 << 23, 2048)])
    bits = (exponents[:, None] | ends.astype(np.uint32)[None, :]).ravel()
    return np.concatenate([bits, bits | np.uint32(1 << 31)]).view(np.float32)


def _cases() -> dict[str, npt.NDArray[np.float32]]:
    rng = np.random.default_rng(28)
    bits = rng.integers(0, 2**32, size=2_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    embedding = rng.normal(0, 0.05, (32, 384)).astype(np.float32)
    embedding /= np.linalg.norm(embedding, axis=1, keepdims=True)
    with_tiny = embedding[:3].copy()
    with_tiny[:, ::50] = np.float32(2.4921127e-33)  # as the default model's vectors hold
    with_tiny[1, 7], with_tiny[2, 9] = 0.0, -0.0
    return {
        "random bit patterns, every finite one alike (2 M)": bits[np.isfinite(bits)],
        "every exponent's ends, both signs (1.5 M)": _all_exponents(),
        # Where float32 midpoints are short decimals: a parser going through float64 rounds twice.
        "integers 2^20..2^34": rng.integers(2**20, 2**34, 500_000).astype(np.float32),
        "every subnormal below 2^-140, both signs": np.concatenate(
            [np.arange(1, 1 << 9, dtype=np.uint32), np.arange(1, 1 << 9, dtype=np.uint32) | np.uint32(1 << 31)]
        ).view(np.float32),
        "unit vectors, batch 32": embedding,
        "unit vectors with tiny values and zeros": with_tiny,
        "one vector": embedding[:1],
        "a float32 midpoint's neighbour (64311768: 6.431177e7 is halfway)": np.array([64311768.0], np.float32),
        "extremes": np.array([3.4028235e38, -3.4028235e38, 1.1754944e-38, 1e-45, -1e-45, 0.0, -0.0], np.float32),
        "empty": np.zeros((0, 384), np.float32),
    }


CASES = _cases()


@pytest.mark.parametrize("case", list(CASES))
def test_float32_answers_parse_back_to_the_same_float32(case: str) -> None:
    array = CASES[case]
    got = _reads_back(array)
    differ = np.flatnonzero(got.view(np.uint32).ravel() != array.view(np.uint32).ravel())  # -0.0 included
    assert not differ.size, [(float(array.ravel()[i]), float(got.ravel()[i])) for i in differ[:5]]


def test_float32_text_is_the_shortest_that_reads_back() -> None:
    """Nine significant digits at most (float64's repr takes up to 17), and no digit that could go: numpy's own
    shortest float32 repr is never shorter."""
    v = np.random.default_rng(0).normal(0, 0.05, 20_000).astype(np.float32)
    words = dumps(v).decode()[1:-1].split(",")
    for word, x in zip(words, v.tolist(), strict=True):
        digits = word.lstrip("-").split("e")[0].replace(".", "").lstrip("0")
        assert len(digits) <= 9
        assert len(digits) <= len(str(np.float32(x)).lstrip("-").split("e")[0].replace(".", "").lstrip("0"))
    assert dumps(np.array([[0.1, 1e-5], [1.0, -0.0]], np.float32)) == b"[[0.1,0.00001],[1.0,-0.0]]"


def test_nan_and_infinity_are_written_null_so_tasks_refuse_them_first() -> None:
    """What orjson does with them (valid JSON, never `NaN`): the reason `handler.tasks.arrays.finite` stops such
    an answer before the edge (tests/unit/test_text_tasks.py: a 500 ModelOutputError)."""
    out = dumps({"v": np.array([np.nan, np.inf, -np.inf, 1.5], np.float32), "s": float("nan")})
    assert out == b'{"v":[null,null,null,1.5],"s":null}'
    json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (np.float32(0.1), b"0.1"),  # a score: float32 scalars at their shortest too
        (np.array([1, 2], np.int64), b"[1,2]"),
        (np.array([True, False]), b"[true,false]"),
        (np.array([0.1], np.float16), b"[0.099975586]"),  # float16 reads back exactly, through float32
        (np.arange(6, dtype=np.float32).reshape(2, 3).T, b"[[0.0,3.0],[1.0,4.0],[2.0,5.0]]"),  # not contiguous
        (np.arange(6, dtype=np.float32)[::2], b"[0.0,2.0,4.0]"),  # a strided view
        (np.array(["a", "b"]), b'["a","b"]'),  # a dtype orjson does not write: through tolist
        ({1: "int key"}, b'{"1":"int key"}'),  # as json.dumps writes it
        ("é ✓", '"é ✓"'.encode()),  # UTF-8, not \\u escapes
        ([np.float64(0.1), np.int32(7), np.bool_(True)], b"[0.1,7,true]"),
    ],
)
def test_what_an_answer_may_hold(value: Any, text: bytes) -> None:
    assert dumps(value) == text


@pytest.mark.parametrize("n", [2**64, -(2**63) - 1, 10**40, -(10**40)])
def test_integers_past_64_bits_are_written_as_json_writes_them(n: int) -> None:
    """A warm ping echoes its `correlation_id`, any JSON value a caller sends: an integer past 64 bits is
    valid JSON that orjson will not write (it raised, found by tests/test_property.py). Written exactly."""
    out = dumps({"correlation_id": [n, {"k": n}], "v": np.array([1.5], np.float32)})
    assert out == b'{"correlation_id":[%d,{"k":%d}],"v":[1.5]}' % (n, n)
    assert json.loads(out)["correlation_id"] == [n, {"k": n}]


def test_a_value_nested_past_orjsons_depth_is_still_written() -> None:
    deep: Any = 7
    for _ in range(400):
        deep = [deep]
    assert json.loads(dumps({"correlation_id": deep})) == {"correlation_id": deep}


def test_an_unknown_type_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="not JSON serializable: set"):
        dumps({"x": {1, 2}})


def test_orjson_is_imported_by_the_first_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deferred: importing the module (the Lambda init's chain does) imports no orjson; the first call does."""
    monkeypatch.setattr(encode, "_encode", None)
    monkeypatch.delitem(sys.modules, "orjson")
    import handler.api.encode  # noqa: F401 (already imported: must not bring orjson back)

    assert "orjson" not in sys.modules
    assert dumps([np.float32(1.5)]) == b"[1.5]"
    assert "orjson" in sys.modules


def test_awslambdaric_posts_the_bytes_it_is_handed_as_they_are() -> None:
    """Its marshaller re-encodes any answer but `bytes` (with simplejson, which cannot even write a numpy
    array): the Lambda entry point hands it bytes (`Runtime.lambda_reply`)."""
    from awslambdaric.lambda_runtime_marshaller import LambdaMarshaller

    answer = {"embeddings": np.array([[0.1, -0.2]], np.float32), "model": "m@1"}
    reply = dumps(answer)
    posted, content_type = LambdaMarshaller().marshal_response(reply)
    assert posted is reply and content_type == "application/unknown"
    with pytest.raises(Exception, match="not JSON serializable"):
        LambdaMarshaller().marshal_response(answer)
