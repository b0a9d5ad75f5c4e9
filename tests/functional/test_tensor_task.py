"""The generic `tensor` task on a tiny packed ONNX model: x float32 [batch, 3], k int64 [batch] → y, z."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from handler.errors import RequestError
from tests.conftest import TinyModel

X = [[1.0, 2.0, 3.0], [-0.5, 0.25, 4.0]]
K = [3, -7]


def npy(array: npt.NDArray[Any]) -> dict[str, str]:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return {"npy": base64.b64encode(buf.getvalue()).decode()}


def from_npy(value: dict[str, str]) -> npt.NDArray[Any]:
    return np.load(io.BytesIO(base64.b64decode(value["npy"])), allow_pickle=False)  # type: ignore[no-any-return]


@pytest.fixture
def tiny(tiny_tensor_model: Callable[..., TinyModel]) -> TinyModel:
    return tiny_tensor_model()


def test_manifest_spec_comes_from_the_graph(tiny: TinyModel) -> None:
    manifest = json.loads((tiny.dir / "manifest.json").read_text())
    assert manifest["task"] == "tensor"
    assert manifest["inputs"] == [
        {"name": "x", "dtype": "float32", "shape": ["batch", 3]},
        {"name": "k", "dtype": "int64", "shape": ["batch"]},
    ]
    assert [o["name"] for o in manifest["outputs"]] == ["y", "z"]


def test_nested_lists_in_and_out(tiny: TinyModel) -> None:
    reply = tiny.runtime.handle({"inputs": {"x": X, "k": K}}, None)
    assert reply["model"] == "tiny@1.0"
    expected = tiny.expected(X, K)
    np.testing.assert_allclose(np.array(reply["outputs"]["y"], np.float32), expected["y"], rtol=1e-6)
    assert reply["outputs"]["z"] == [6, -14]


def test_npy_in_and_out_round_trips_exactly(tiny: TinyModel) -> None:
    x, k = np.array(X, np.float32), np.array(K, np.int64)
    as_lists = tiny.runtime.handle({"inputs": {"x": X, "k": K}}, None)["outputs"]
    as_npy = tiny.runtime.handle({"inputs": {"x": npy(x), "k": npy(k)}, "output_format": "npy"}, None)["outputs"]
    y, z = from_npy(as_npy["y"]), from_npy(as_npy["z"])
    assert (y.dtype, y.shape, z.dtype, z.shape) == (np.float32, (2, 4), np.int64, (2,))
    # Same inputs by either route give bit-identical outputs, and the list form loses nothing.
    assert np.array_equal(y, np.array(as_lists["y"], np.float32))
    assert np.array_equal(z, np.array(as_lists["z"], np.int64))


def test_mixed_input_formats(tiny: TinyModel) -> None:
    reply = tiny.runtime.handle({"inputs": {"x": X, "k": npy(np.array(K, np.int64))}, "output_format": "list"}, None)
    assert reply["outputs"]["z"] == [6, -14]


def test_integers_are_accepted_for_a_float_input(tiny: TinyModel) -> None:
    reply = tiny.runtime.handle({"inputs": {"x": [[1, 2, 3]], "k": [0]}}, None)
    np.testing.assert_allclose(reply["outputs"]["y"], tiny.expected([[1, 2, 3]], [0])["y"], rtol=1e-6)


def test_over_http(tiny: TinyModel, load_event: Callable[[str], Any]) -> None:
    event = load_event("http_api_v2.json")
    event["body"] = json.dumps({"inputs": {"x": X, "k": K}})
    response = tiny.runtime.handle(event, None)
    assert response["statusCode"] == 200
    assert json.loads(response["body"])["outputs"]["z"] == [6, -14]
    event["body"] = json.dumps({"inputs": {"x": X}})
    response = tiny.runtime.handle(event, None)
    assert response["statusCode"] == 400
    assert json.loads(response["body"])["error"]["type"] == "InvalidInputError"


@pytest.mark.parametrize(
    ("inputs", "fragments"),
    [
        ({"x": X}, ["missing ['k']"]),
        ({"x": X, "k": K, "q": [1]}, ["unknown ['q']"]),
        ({"x": npy(np.array(X, np.float64)), "k": K}, ["inputs.x", "float64", "float32"]),
        ({"x": X, "k": npy(np.array(K, np.int32))}, ["inputs.k", "int32", "int64"]),
        ({"x": X, "k": [1.5, 2.5]}, ["inputs.k", "int64"]),
        ({"x": [[1.0, 2.0, 3.0, 4.0]], "k": [1]}, ["inputs.x", "shape [1, 4]", "['batch', 3]"]),
        ({"x": [1.0, 2.0, 3.0], "k": [1]}, ["inputs.x", "shape [3]"]),
        ({"x": X, "k": [[1], [2]]}, ["inputs.k", "shape [2, 1]"]),
        ({"x": [[1.0, 2.0, 3.0], [1.0]], "k": K}, ["inputs.x", "rectangular"]),
        ({"x": [["a", "b", "c"]], "k": [1]}, ["inputs.x", "float32"]),
        ({"x": 1.0, "k": [1]}, ["inputs.x", "shape []"]),
        ({"x": {"npy": "not base64!"}, "k": K}, ["inputs.x", ".npy"]),
        ({"x": {"npy": base64.b64encode(b"not an npy file").decode()}, "k": K}, ["inputs.x", ".npy"]),
        ({"x": {"npy": 42}, "k": K}, ["inputs.x"]),
        ({"x": X, "k": [1, 2, 3]}, ["inputs.k", "dimension 'batch' is 3", "inputs.x has it as 2"]),
    ],
)
def test_bad_tensors_name_the_input(inputs: dict[str, Any], fragments: list[str], tiny: TinyModel) -> None:
    with pytest.raises(RequestError) as info:
        tiny.runtime.handle({"inputs": inputs}, None)
    assert type(info.value).__name__ == "InvalidInputError"
    for fragment in fragments:
        assert fragment in str(info.value)
    assert tiny.runtime.handle({"inputs": {"x": X, "k": K}}, None)["outputs"]["z"] == [6, -14]


def test_object_arrays_are_refused_without_unpickling(tiny: TinyModel) -> None:
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    bad = {"npy": base64.b64encode(buf.getvalue()).decode()}
    with pytest.raises(RequestError, match=r"inputs\.x"):
        tiny.runtime.handle({"inputs": {"x": bad, "k": K}}, None)


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({"inputs": [X, K]}, "named tensors"),
        ({"inputs": {"x": X, "k": K}, "output_format": "csv"}, "list, npy"),
        ({"x": X, "k": K}, 'no "inputs"'),
    ],
)
def test_bad_request_shapes(payload: dict[str, Any], fragment: str, tiny: TinyModel) -> None:
    with pytest.raises(RequestError, match=fragment):
        tiny.runtime.handle(payload, None)


def test_embedding_requests_are_refused_by_a_tensor_model(tiny: TinyModel) -> None:
    with pytest.raises(RequestError, match="named tensors"):
        tiny.runtime.handle({"inputs": ["some text"]}, None)
