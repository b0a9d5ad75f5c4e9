"""The Open Inference Protocol (KServe v2, Triton) on the HTTP host and on Lambda HTTP events: health, server
and model metadata, inference for embedding, rerank, classify and tensor models, typed 400s for bad tensors and
404s naming the served models; and Triton's own client (`tritonclient.http`) against a live host."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from handler.runtime.invocation import Runtime
from tests.conftest import DIM, MODEL_KEY, TinyModel, invoke, start
from tests.functional.test_http_compat import client_for
from tests.functional.test_own_model import packer

TEXTS = ["the quick brown fox", "jumps over the lazy dog", "a third sentence"]
MODEL_ID, MODEL_VERSION = MODEL_KEY.split("@", 1)


@pytest.fixture(scope="module")
def runtime(new_runtime: Callable[..., Runtime]) -> Runtime:
    return new_runtime()


@pytest.fixture(scope="module")
def client(runtime: Runtime) -> Iterator[TestClient]:
    with client_for(runtime) as c:
        yield c


def text_input(name: str, texts: list[str]) -> dict[str, Any]:
    return {"name": name, "shape": [len(texts)], "datatype": "BYTES", "data": texts}


def lambda_event(method: str, path: str, body: Any = None) -> dict[str, Any]:
    event: dict[str, Any] = {
        "version": "2.0",
        "rawPath": path,
        "requestContext": {"http": {"method": method, "path": path}, "stage": "$default"},
        "isBase64Encoded": False,
    }
    if body is not None:
        event["body"] = json.dumps(body)
    return event


def on_lambda(runtime: Runtime, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    reply = invoke(runtime, lambda_event(method, path, body))
    return reply["statusCode"], json.loads(reply["body"])


def test_health_and_server_metadata(client: TestClient) -> None:
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").json() == {"ready": True}
    server = client.get("/v2").json()
    assert server["name"] == "warmstart" and server["extensions"] == [] and server["version"]


def test_model_metadata_and_ready(client: TestClient) -> None:
    r = client.get(f"/v2/models/{MODEL_ID}")
    assert r.status_code == 200, r.text
    assert r.json() == {
        "name": MODEL_ID,
        "versions": [MODEL_VERSION],
        "platform": "onnxruntime_onnx",  # Triton's name for the backend
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, DIM]}],
    }
    assert client.get(f"/v2/models/{MODEL_ID}/versions/{MODEL_VERSION}").json()["name"] == MODEL_ID
    ready = client.get(f"/v2/models/{MODEL_ID}/ready")
    assert ready.status_code == 200 and ready.json() == {"name": MODEL_ID, "ready": True}


@pytest.mark.parametrize("path", ["/v2/models/nope", "/v2/models/nope/ready", "/v2/models/nope/infer"])
def test_an_unknown_model_is_a_404_naming_the_served_ones(client: TestClient, path: str) -> None:
    body = {"inputs": [text_input("text", TEXTS)]}
    r = client.post(path, json=body) if path.endswith("infer") else client.get(path)
    assert r.status_code == 404
    error = r.json()["error"]
    assert isinstance(error, str) and "'nope'" in error and MODEL_KEY in error


def test_embedding_inference_equals_the_native_route(client: TestClient) -> None:
    native = client.post("/invocations", json={"inputs": TEXTS}).json()["embeddings"]
    r = client.post(f"/v2/models/{MODEL_ID}/infer", json={"id": "42", "inputs": [text_input("text", TEXTS)]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model_name"] == MODEL_ID and body["model_version"] == MODEL_VERSION and body["id"] == "42"
    [out] = body["outputs"]
    assert out["name"] == "embedding" and out["datatype"] == "FP32" and out["shape"] == [3, DIM]
    assert out["data"] == [x for row in native for x in row]  # row-major, the same float32s


@pytest.mark.parametrize(
    ("tensor", "status", "fragment"),
    [
        (
            {"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a"]},
            400,
            "shape [2] holds 2 elements; data has 1",
        ),
        ({"name": "text", "shape": [1], "datatype": "FP32", "data": [1.0]}, 400, "is FP32; the model takes BYTES"),
        ({"name": "text", "shape": [1], "datatype": "TEXT", "data": ["a"]}, 400, "datatype 'TEXT'; valid: FP32"),
        ({"name": "words", "shape": [1], "datatype": "BYTES", "data": ["a"]}, 400, "inputs must be exactly ['text']"),
        ({"name": "text", "shape": [1], "datatype": "BYTES"}, 400, 'no "data"'),
    ],
)
def test_bad_tensors_are_typed_400s(client: TestClient, tensor: dict[str, Any], status: int, fragment: str) -> None:
    r = client.post(f"/v2/models/{MODEL_ID}/infer", json={"inputs": [tensor]})
    assert r.status_code == status and fragment in r.json()["error"], r.text


def test_unknown_requested_output_and_wrong_method(client: TestClient) -> None:
    body = {"inputs": [text_input("text", TEXTS)], "outputs": [{"name": "logits"}]}
    r = client.post(f"/v2/models/{MODEL_ID}/infer", json=body)
    assert r.status_code == 400 and "['logits']" in r.json()["error"] and "embedding" in r.json()["error"]
    assert client.get(f"/v2/models/{MODEL_ID}/infer").status_code == 405
    assert client.post("/v2/health/live").status_code == 405
    assert isinstance(client.post("/v2/health/live").json()["error"], str)


def test_on_lambda_http_events(runtime: Runtime, client: TestClient) -> None:
    assert on_lambda(runtime, "GET", "/v2/health/ready") == (200, {"ready": True})
    assert on_lambda(runtime, "GET", f"/v2/models/{MODEL_ID}") == (200, client.get(f"/v2/models/{MODEL_ID}").json())
    body = {"inputs": [text_input("text", TEXTS)]}
    status, answer = on_lambda(runtime, "POST", f"/v2/models/{MODEL_ID}/infer", body)
    assert status == 200 and answer == client.post(f"/v2/models/{MODEL_ID}/infer", json=body).json()
    status, answer = on_lambda(runtime, "GET", "/v2/models/nope")
    assert status == 404 and MODEL_KEY in answer["error"]
    status, answer = on_lambda(runtime, "POST", f"/v2/models/{MODEL_ID}/infer", {"inputs": []})
    assert status == 400 and '"inputs" must be a non-empty array' in answer["error"]
    # Cohere's /v2/rerank is still Cohere's (not this protocol's path).
    status, answer = on_lambda(runtime, "POST", "/v2/rerank", {"query": "q", "documents": ["d"]})
    assert "error" in answer and not isinstance(answer["error"], str)


# ------------------------------------------------------------------------------------------------ tensor


def test_tensor_model(tiny_tensor_model: Callable[..., TinyModel]) -> None:
    tiny = tiny_tensor_model()
    x, k = [[1.0, 2.0, 3.0], [-1.0, 0.5, 2.0]], [3, -7]
    with client_for(tiny.runtime) as c:
        meta = c.get("/v2/models/tiny").json()
        assert meta["inputs"] == [
            {"name": "x", "datatype": "FP32", "shape": [-1, 3]},
            {"name": "k", "datatype": "INT64", "shape": [-1]},
        ]
        assert [(o["name"], o["datatype"]) for o in meta["outputs"]] == [("y", "FP32"), ("z", "INT64")]
        inputs = [
            {"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [v for row in x for v in row]},
            {"name": "k", "shape": [2], "datatype": "INT64", "data": k},
        ]
        r = c.post("/v2/models/tiny/infer", json={"inputs": inputs, "outputs": [{"name": "z"}]})
        assert r.status_code == 200, r.text
        assert r.json()["outputs"] == [{"name": "z", "datatype": "INT64", "shape": [2], "data": [6, -14]}]
        body = c.post("/v2/models/tiny/infer", json={"inputs": inputs}).json()
        y = next(o for o in body["outputs"] if o["name"] == "y")
        np.testing.assert_allclose(np.reshape(y["data"], y["shape"]), tiny.expected(x, k)["y"], rtol=1e-6)
        wrong = [inputs[0], {"name": "k", "shape": [2], "datatype": "FP32", "data": [3.0, -7.0]}]
        r = c.post("/v2/models/tiny/infer", json={"inputs": wrong})
        assert r.status_code == 400 and "input 'k' is FP32; the model takes INT64" in r.json()["error"]
        fractional = [inputs[0], {"name": "k", "shape": [2], "datatype": "INT64", "data": [3.5, 1]}]
        r = c.post("/v2/models/tiny/infer", json={"inputs": fractional})
        assert r.status_code == 400 and "INT64 data must be numbers" in r.json()["error"]
        short = [{**inputs[0], "shape": [2, 2]}, inputs[1]]
        r = c.post("/v2/models/tiny/infer", json={"inputs": short})
        assert r.status_code == 400 and "shape [2, 2] holds 4 elements; data has 6" in r.json()["error"]


# ------------------------------------------------------------------------------------------- rerank, classify


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, Path]]:
    return packer(tmp_path_factory, ())


def test_rerank_scores_in_document_order(built: Callable[..., tuple[Path, Path]]) -> None:
    _, packed = built("bert", "cross-encoder")
    runtime = start(packed)
    docs = ["berlin is the capital of germany", "paris", "the quick brown fox"]
    native = runtime.handle({"query": "capital of germany", "documents": docs}, None)
    want = {r["index"]: r["relevance_score"] for r in native["results"]}
    with client_for(runtime) as c:
        name = c.get("/v2").json() and runtime.manifest.id
        meta = c.get(f"/v2/models/{name}").json()
        assert meta["outputs"] == [{"name": "scores", "datatype": "FP32", "shape": [-1]}]
        body = {"inputs": [text_input("query", ["capital of germany"]), text_input("documents", docs)]}
        r = c.post(f"/v2/models/{name}/infer", json=body)
        assert r.status_code == 200, r.text
        [out] = r.json()["outputs"]
        assert out["shape"] == [3]
        np.testing.assert_allclose(out["data"], [want[i] for i in range(3)], rtol=1e-6)
        two = {"inputs": [text_input("query", ["a", "b"]), text_input("documents", docs)]}
        r = c.post(f"/v2/models/{name}/infer", json=two)
        assert r.status_code == 400 and "the model takes one" in r.json()["error"]


def test_classify_scores_in_label_order(built: Callable[..., tuple[Path, Path]]) -> None:
    labels = ["negative", "neutral", "positive"]
    _, packed = built("bert", "classifier", labels=labels)
    runtime = start(packed)
    native = runtime.handle({"inputs": TEXTS}, None)["predictions"]
    want = [[next(p["score"] for p in row if p["label"] == label) for label in labels] for row in native]
    with client_for(runtime) as c:
        name = runtime.manifest.id
        assert c.get(f"/v2/models/{name}").json()["outputs"] == [
            {"name": "scores", "datatype": "FP32", "shape": [-1, 3]}
        ]
        r = c.post(f"/v2/models/{name}/infer", json={"inputs": [text_input("text", TEXTS)]})
        assert r.status_code == 200, r.text
        [out] = r.json()["outputs"]
        assert out["shape"] == [3, 3]
        np.testing.assert_allclose(np.reshape(out["data"], (3, 3)), want, rtol=1e-6)


# ------------------------------------------------------------------------------------------ Triton's client


@pytest.fixture(scope="module")
def live_url(runtime: Runtime) -> Iterator[str]:
    import uvicorn

    from handler.http_host.host import Host
    from handler.http_host.routes import create_app
    from handler.runtime.workers import Sizing, WorkerPool
    from tests.fixtures.drain_scenario import free_port

    port = free_port()
    workers = WorkerPool(Sizing(min_workers=1, max_workers=2, max_queue=4), cpus=2)
    app = create_app(Host(lambda: runtime, workers))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    yield f"127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_tritonclient(live_url: str, client: TestClient) -> None:
    import tritonclient.http as http  # a dev dependency: never skipped
    from tritonclient.utils import InferenceServerException

    triton = http.InferenceServerClient(live_url)
    try:
        assert triton.is_server_live() and triton.is_server_ready()
        assert triton.is_model_ready(MODEL_ID)
        assert not triton.is_model_ready("nope")
        meta = triton.get_model_metadata(MODEL_ID)
        assert meta["name"] == MODEL_ID and meta["outputs"][0]["datatype"] == "FP32"
        assert triton.get_server_metadata()["name"] == "warmstart"
        text = http.InferInput("text", [len(TEXTS)], "BYTES")
        text.set_data_from_numpy(np.array(TEXTS, dtype=object), binary_data=False)
        result = triton.infer(MODEL_ID, [text], outputs=[http.InferRequestedOutput("embedding", binary_data=False)])
        got = result.as_numpy("embedding")
        native = client.post("/invocations", json={"inputs": TEXTS}).json()["embeddings"]
        assert got.dtype == np.float32 and got.shape == (3, DIM)
        np.testing.assert_array_equal(got, np.asarray(native, np.float32))
        assert triton.infer(MODEL_ID, [text]).as_numpy("embedding").shape == (3, DIM)  # no outputs named: all
        binary = http.InferInput("text", [1], "BYTES")
        binary.set_data_from_numpy(np.array(["a"], dtype=object))  # the client's default: binary data
        with pytest.raises(InferenceServerException, match=r"binary_data=False"):
            triton.infer(MODEL_ID, [binary])
        with pytest.raises(InferenceServerException, match="is FP32; the model takes BYTES"):
            wrong = http.InferInput("text", [1], "FP32")
            wrong.set_data_from_numpy(np.zeros(1, np.float32), binary_data=False)
            triton.infer(MODEL_ID, [wrong])
    finally:
        triton.close()
