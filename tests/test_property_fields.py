"""Any JSON value in any request field of every task and every compatible route, through the real runtime:
a direct invoke, an HTTP API (v2) event on the route's path, and the HTTP host's body path. Each answer is a
normal one or a `RequestError` (4xx), never another exception type or a 500, and the instance keeps serving.

The models are real and tiny, served by onnxruntime: the default embedding model, a rerank and a classify
graph over the default model's tokenizer (the scores are sums of the attention mask: cheap, deterministic),
and the tiny tensor graph of tests/conftest.py."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handler.api.compat import LAMBDA_PATHS, NATIVE, ROUTES
from handler.core.errors import RequestError
from handler.runtime.invocation import Runtime
from infra.pack import pack_onnx
from tests.conftest import DEFAULT_MODEL, http_v2_event, start, write_tiny_onnx

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
LIMITS = {"warmup": False, "max_inputs": 4, "max_chars": 64, "threads": 1}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
# Values close to valid ones are where type confusion hides: names of prompts, formats, models, sizes.
near_values = st.sampled_from(
    ["query", "float", "base64", "list", "npy", "all-minilm-l6-v2", "tiny@1.0", "Right", "text", "x", ""]
) | st.sampled_from([0, 1, 2, 3, 384, -1, 2**63, True, False, None, [], {}, [1], ["x"], {"text": "x"}, {"npy": "x"}])
values = json_values | near_values

# Each case: a model kind, a route path, a valid request, and the fields that route reads (any may be
# replaced, dropped or joined by an unknown one).
CASES: dict[str, tuple[str, str, dict[str, Any], list[str]]] = {
    "embedding": (
        "embedding",
        NATIVE.path,
        {"inputs": ["a b"], "dimensions": 8, "encoding_format": "float"},
        ["inputs", "prompt_name", "prompt", "dimensions", "encoding_format", "model"],
    ),
    "rerank": (
        "rerank",
        NATIVE.path,
        {"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1, "return_documents": True},
        ["query", "documents", "top_n", "return_documents", "model"],
    ),
    "classify": ("classify", NATIVE.path, {"inputs": ["a b"], "top_k": 2}, ["inputs", "top_k", "model"]),
    "tensor": (
        "tensor",
        NATIVE.path,
        {"inputs": {"x": [[1.0, 2.0, 3.0]], "k": [1]}, "output_format": "list"},
        ["inputs", "output_format", "model"],
    ),
    "openai": (
        "embedding",
        "/v1/embeddings",
        {"input": ["a"], "model": "text-embedding-3-small", "encoding_format": "base64", "dimensions": 8},
        ["input", "model", "encoding_format", "dimensions", "user"],
    ),
    "tei-embed": (
        "embedding",
        "/embed",
        {"inputs": "a", "normalize": True, "truncate": True, "dimensions": 8},
        ["inputs", "normalize", "truncate", "truncation_direction", "prompt_name", "dimensions"],
    ),
    "tei-rerank": (
        "rerank",
        "/rerank",
        {"query": "q", "texts": ["a", "b"], "return_text": True},
        ["query", "texts", "return_text", "raw_scores", "truncate"],
    ),
    "cohere-rerank": (
        "rerank",
        "/v2/rerank",
        {"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1, "return_documents": True},
        ["query", "documents", "top_n", "return_documents", "max_tokens_per_doc", "rank_fields", "model"],
    ),
    "tei-predict": (
        "classify",
        "/predict",
        {"inputs": ["a"], "raw_scores": False},
        ["inputs", "raw_scores", "truncate"],
    ),
}


def _text_graph(path: Path, task: str) -> dict[str, Any]:
    """input_ids, attention_mask → scores [batch] (rerank) or logits [batch, 3] (classify): the mask's sum."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper, save_model

    ids = ["batch", "sequence"]
    nodes = [
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Identity", ["input_ids"], ["unused"]),
    ]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "axes")]
    if task == "rerank":
        nodes.append(helper.make_node("ReduceSum", ["m", "axes"], ["scores"], keepdims=0))
        out, shape = "scores", ["batch"]
    else:
        nodes += [
            helper.make_node("ReduceSum", ["m", "axes"], ["s"], keepdims=1),
            helper.make_node("MatMul", ["s", "w"], ["logits"]),
        ]
        inits.append(numpy_helper.from_array(np.array([[0.1, -0.2, 0.3]], np.float32), "w"))
        out, shape = "logits", ["batch", 3]
    graph = helper.make_graph(
        nodes,
        task,
        [helper.make_tensor_value_info(n, TensorProto.INT64, ids) for n in ("input_ids", "attention_mask")],
        [
            helper.make_tensor_value_info(out, TensorProto.FLOAT, shape),
            helper.make_tensor_value_info("unused", TensorProto.INT64, ids),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    save_model(model, str(path))
    return {"name": out, "dtype": "float32", "shape": shape}


def text_model(root: Path, task: str) -> Path:
    root.mkdir()
    shutil.copy(DEFAULT_MODEL / "tokenizer.json", root / "tokenizer.json")
    output = _text_graph(root / "model.onnx", task)
    files = {
        name: {"size": (root / name).stat().st_size, "sha256": hashlib.sha256((root / name).read_bytes()).hexdigest()}
        for name in ("model.onnx", "tokenizer.json")
    }
    ids = {"dtype": "int64", "shape": ["batch", "sequence"]}
    raw: dict[str, Any] = {
        "format": "warmstart-packed-model",
        "format_version": 1,
        "id": f"tiny-{task}",
        "version": "1",
        "task": task,
        "family": "bert",
        "default_backend": "onnx",
        "files": files,
        "backends": {"onnx": {"model": "model.onnx", "files": ["model.onnx"]}},
        "inputs": [{"name": "input_ids", **ids}, {"name": "attention_mask", **ids}],
        "outputs": [output],
        "tokenizer": {"file": "tokenizer.json", "truncation": 16, "padding": "longest", "pad_id": 0},
        "max_seq_length": 16,
    }
    raw |= {"activation": "identity"} if task == "rerank" else {"labels": ["neg", "neutral", "pos"]}
    (root / "manifest.json").write_text(json.dumps(raw))
    return root


@pytest.fixture(scope="module")
def runtimes(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Runtime]:
    tmp = tmp_path_factory.mktemp("field-models")
    write_tiny_onnx(tmp / "tiny.onnx")
    tensor = pack_onnx(tmp / "tiny.onnx", tmp / "tensor", "tiny", "1.0")
    return {
        "embedding": start(model_dir, "onnx", **LIMITS),
        "rerank": start(text_model(tmp / "rerank", "rerank"), "onnx", **LIMITS),
        "classify": start(text_model(tmp / "classify", "classify"), "onnx", **LIMITS),
        "tensor": start(tensor, "onnx", **LIMITS),
    }


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    case = draw(st.sampled_from(sorted(CASES)))
    _, _, base, fields = CASES[case]
    body = dict(base)
    for field in draw(st.lists(st.sampled_from(fields) | st.text(max_size=6), min_size=1, max_size=3, unique=True)):
        if draw(st.integers(0, 9)) == 0:
            body.pop(field, None)
        else:
            body[field] = draw(values)
    if case == "tensor" and draw(st.booleans()):  # inside the named inputs too
        body["inputs"] = {"x": draw(values), "k": draw(values)} if draw(st.booleans()) else {"x": draw(values)}
    return case, body


def check(runtime: Runtime, path: str, body: dict[str, Any]) -> None:
    failed = runtime.counted().get("failed", 0)
    if path == NATIVE.path:  # a direct invoke is the native request
        with contextlib.suppress(RequestError):  # raised: awslambdaric reports its class name
            json.loads(runtime.lambda_reply(body, None))  # answered: the JSON bytes awslambdaric posts
    if path == NATIVE.path or path in LAMBDA_PATHS:
        response = runtime.handle(http_v2_event(path, body), None)
        assert 200 <= response["statusCode"] < 500, response["body"]
        if response["statusCode"] != 200:
            assert json.loads(response["body"])["error"]["type"].endswith("Error")
    status, raw, _ = runtime.handle_http(json.dumps(body).encode(), ROUTES[path])
    assert 200 <= status < 500, raw
    assert runtime.counted().get("failed", 0) == failed  # no fault of ours counted


@SETTINGS
@given(request=requests())
def test_any_value_in_any_field_is_an_answer_or_a_request_error(
    runtimes: dict[str, Runtime], request: tuple[str, dict[str, Any]]
) -> None:
    case, body = request
    kind, path, base, _ = CASES[case]
    runtime = runtimes[kind]
    check(runtime, path, body)
    check(runtime, path, base)  # still serving, and the valid request is valid
    status, _, _ = runtime.handle_http(json.dumps(base).encode(), ROUTES[path])
    assert status == 200


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_valid_requests_are_answered(runtimes: dict[str, Runtime], case: str) -> None:
    kind, path, base, _ = CASES[case]
    status, raw, _ = runtimes[kind].handle_http(json.dumps(base).encode(), ROUTES[path])
    assert status == 200, raw
