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

from handler.core.errors import RequestError
from tests.conftest import TinyModel
from tests.functional.test_events import invoke

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
    reply = invoke(tiny.runtime, {"inputs": {"x": X, "k": K}}, None)
    assert reply["model"] == "tiny@1.0"
    expected = tiny.expected(X, K)
    np.testing.assert_allclose(np.array(reply["outputs"]["y"], np.float32), expected["y"], rtol=1e-6)
    assert reply["outputs"]["z"] == [6, -14]


def test_npy_in_and_out_round_trips_exactly(tiny: TinyModel) -> None:
    x, k = np.array(X, np.float32), np.array(K, np.int64)
    as_lists = invoke(tiny.runtime, {"inputs": {"x": X, "k": K}}, None)["outputs"]
    as_npy = invoke(tiny.runtime, {"inputs": {"x": npy(x), "k": npy(k)}, "output_format": "npy"}, None)["outputs"]
    y, z = from_npy(as_npy["y"]), from_npy(as_npy["z"])
    assert (y.dtype, y.shape, z.dtype, z.shape) == (np.float32, (2, 4), np.int64, (2,))
    # Same inputs by either route give bit-identical outputs, and the list form loses nothing.
    assert np.array_equal(y, np.array(as_lists["y"], np.float32))
    assert np.array_equal(z, np.array(as_lists["z"], np.int64))


def test_mixed_input_formats(tiny: TinyModel) -> None:
    reply = invoke(tiny.runtime, {"inputs": {"x": X, "k": npy(np.array(K, np.int64))}, "output_format": "list"}, None)
    assert reply["outputs"]["z"] == [6, -14]


def test_integers_are_accepted_for_a_float_input(tiny: TinyModel) -> None:
    reply = invoke(tiny.runtime, {"inputs": {"x": [[1, 2, 3]], "k": [0]}}, None)
    np.testing.assert_allclose(reply["outputs"]["y"], tiny.expected([[1, 2, 3]], [0])["y"], rtol=1e-6)


def test_over_http(tiny: TinyModel, load_event: Callable[[str], Any]) -> None:
    event = load_event("http_api_v2.json")
    event["body"] = json.dumps({"inputs": {"x": X, "k": K}})
    response = invoke(tiny.runtime, event, None)
    assert response["statusCode"] == 200
    assert json.loads(response["body"])["outputs"]["z"] == [6, -14]
    event["body"] = json.dumps({"inputs": {"x": X}})
    response = invoke(tiny.runtime, event, None)
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
        invoke(tiny.runtime, {"inputs": inputs}, None)
    assert type(info.value).__name__ == "InvalidInputError"
    for fragment in fragments:
        assert fragment in str(info.value)
    assert invoke(tiny.runtime, {"inputs": {"x": X, "k": K}}, None)["outputs"]["z"] == [6, -14]


def test_object_arrays_are_refused_without_unpickling(tiny: TinyModel) -> None:
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    bad = {"npy": base64.b64encode(buf.getvalue()).decode()}
    with pytest.raises(RequestError, match=r"inputs\.x"):
        invoke(tiny.runtime, {"inputs": {"x": bad, "k": K}}, None)


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
        invoke(tiny.runtime, payload, None)


def test_embedding_requests_are_refused_by_a_tensor_model(tiny: TinyModel) -> None:
    with pytest.raises(RequestError, match="named tensors"):
        invoke(tiny.runtime, {"inputs": ["some text"]}, None)


# -- values that must convert exactly or be refused (issue 15) ------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "fragments"),
    [
        ({"x": X, "k": [2**63, 1]}, ["inputs.k", "[1, 9223372036854775808]", "int64"]),
        ({"x": X, "k": [-(2**63) - 1, 1]}, ["inputs.k", "int64"]),
        ({"x": [[1e300, 0.0, 0.0], [1.0, 2.0, 3.0]], "k": K}, ["inputs.x", "1e+300", "overflow float32"]),
        ({"x": [[2**24 + 1, 0, 0], [1, 2, 3]], "k": K}, ["inputs.x", "16777217", "float32 exactly"]),
    ],
)
def test_values_that_would_wrap_or_overflow_are_refused(
    inputs: dict[str, Any], fragments: list[str], tiny: TinyModel
) -> None:
    with pytest.raises(RequestError) as info:
        invoke(tiny.runtime, {"inputs": inputs}, None)
    assert type(info.value).__name__ == "InvalidInputError"
    for fragment in fragments:
        assert fragment in str(info.value)


def test_a_giant_declared_npy_shape_is_a_400(tiny: TinyModel, load_event: Callable[[str], Any]) -> None:
    """A 442-byte .npy declaring (2**40, 3): refused from its header, never allocated (it was MemoryError)."""
    event = load_event("tensor/npy_giant_shape_v2.json")
    response = invoke(tiny.runtime, event, None)
    assert response["statusCode"] == 400
    error = json.loads(response["body"])["error"]
    assert error["type"] == "InvalidInputError" and "1099511627776" in error["message"]
    with pytest.raises(RequestError, match=r"inputs\.x: shape \[1099511627776, 3\]") as info:
        invoke(tiny.runtime, json.loads(event["body"]), None)  # the same body as a direct invoke
    assert type(info.value).__name__ == "InvalidInputError"
    assert invoke(tiny.runtime, {"inputs": {"x": X, "k": K}}, None)["outputs"]["z"] == [6, -14]


def test_the_element_limit_is_a_setting(tiny_tensor_model: Callable[..., TinyModel]) -> None:
    small = tiny_tensor_model(max_elements=4)
    with pytest.raises(RequestError, match=r"inputs\.x: 6 elements; at most 4 \(WARMSTART_MAX_ELEMENTS\)"):
        invoke(small.runtime, {"inputs": {"x": X, "k": K}}, None)
    with pytest.raises(RequestError, match=r"inputs\.x: shape \[2, 3\] is 6 elements; at most 4"):
        invoke(small.runtime, {"inputs": {"x": npy(np.array(X, np.float32)), "k": K}}, None)


@pytest.fixture(scope="module")
def every_dtype(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A model with one input per dtype a manifest allows, each passed through by Identity."""
    from onnx import helper, save_model

    from handler.core.config import Config
    from handler.core.manifest import DTYPES
    from handler.runtime.invocation import Runtime
    from infra.pack import pack_onnx

    tmp = tmp_path_factory.mktemp("dtypes")
    kinds = {d: helper.np_dtype_to_tensor_dtype(np.dtype(d)) for d in DTYPES}
    graph = helper.make_graph(
        [helper.make_node("Identity", [f"in_{d}"], [f"out_{d}"]) for d in DTYPES],
        "dtypes",
        [helper.make_tensor_value_info(f"in_{d}", t, ["n"]) for d, t in kinds.items()],
        [helper.make_tensor_value_info(f"out_{d}", t, ["n"]) for d, t in kinds.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    save_model(model, str(tmp / "dtypes.onnx"))
    packed = pack_onnx(tmp / "dtypes.onnx", tmp / "packed", "dtypes", "1.0")
    return Runtime.start(Config(model_dir=packed, backend=None, warmup=False), environ={}, emit=None)


def test_in_range_lists_convert_to_every_dtype(every_dtype: Any) -> None:
    from handler.core.manifest import DTYPES
    from handler.tasks.arrays import int_range

    inputs: dict[str, Any] = {}
    for d in DTYPES:
        lo, hi = int_range(np.dtype(d)) if d != "bool" else (0, 1)
        inputs[f"in_{d}"] = [True, False, True] if d == "bool" else [lo, 0, hi]
    outputs = invoke(every_dtype, {"inputs": inputs}, None)["outputs"]
    for d in DTYPES:
        assert outputs[f"out_{d}"] == inputs[f"in_{d}"], d  # uint8 included (it was refused as int64)
    inputs["in_uint8"] = [0, 1, 256]
    with pytest.raises(RequestError, match=r"inputs\.in_uint8: values in \[0, 256\] do not fit uint8"):
        invoke(every_dtype, {"inputs": inputs}, None)
