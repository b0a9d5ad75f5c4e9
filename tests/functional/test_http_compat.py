"""Compatible APIs on the HTTP host (OpenAI, text-embeddings-inference), media types, JSON 404/405, and the
drain's effect on health and new requests. The embedding routes run the real default model and are compared
with the native route byte for byte; rerank and classify map their shapes onto a fake task (the real tasks
come with the models issue)."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from handler.api.encode import dumps
from handler.core.config import Config
from handler.http_host.host import Host
from handler.http_host.routes import create_app
from handler.http_host.settings import HostSettings
from handler.runtime.invocation import Runtime
from handler.runtime.workers import Sizing, WorkerPool
from tests.conftest import DIM, MODEL_KEY

TEXTS = ["the quick brown fox", "jumps over the lazy dog", "a third, longer sentence so the batch pads"]


def vector_text(vector: list[float]) -> bytes:
    """A vector's text as the edge's encoder writes it (the parsed float64s print as the float32s did)."""
    return dumps(vector)


@pytest.fixture(scope="module")
def runtime(new_runtime: Callable[..., Runtime]) -> Runtime:
    return new_runtime()


def client_for(runtime: Runtime, settings: HostSettings | None = None, max_queue: int = 4) -> TestClient:
    workers = WorkerPool(Sizing(min_workers=1, max_workers=2, max_queue=max_queue), cpus=2)
    return TestClient(create_app(Host(lambda: runtime, workers, settings)))


@pytest.fixture
def client(runtime: Runtime) -> Iterator[TestClient]:
    with client_for(runtime) as c:
        yield c


@pytest.fixture
def native(client: TestClient) -> tuple[bytes, list[list[float]]]:
    r = client.post("/invocations", json={"inputs": TEXTS})
    assert r.status_code == 200
    return r.content, r.json()["embeddings"]


def test_openai_embeddings_equal_native_byte_for_byte(client: TestClient, native: tuple[bytes, Any]) -> None:
    raw, vectors = native
    r = client.post("/v1/embeddings", json={"input": TEXTS, "model": "text-embedding-3-small"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == MODEL_KEY  # an unknown model name means the default
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and {d["object"] for d in body["data"]} == {"embedding"}
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    for i, d in enumerate(body["data"]):
        assert d["embedding"] == vectors[i]
        assert vector_text(vectors[i]) in raw and vector_text(vectors[i]) in r.content


def test_openai_single_string_and_model_by_id(client: TestClient, native: tuple[bytes, Any]) -> None:
    r = client.post("/v1/embeddings", json={"input": TEXTS[0], "model": "all-minilm-l6-v2"})
    assert r.status_code == 200 and len(r.json()["data"]) == 1
    assert len(r.json()["data"][0]["embedding"]) == DIM


def test_openai_dimensions_and_base64(client: TestClient, native: tuple[bytes, Any]) -> None:
    _, vectors = native
    r = client.post("/v1/embeddings", json={"input": TEXTS, "dimensions": 64, "encoding_format": "base64"})
    assert r.status_code == 200, r.text
    for i, d in enumerate(r.json()["data"]):
        got = np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
        cut = np.asarray(vectors[i][:64], np.float32)
        np.testing.assert_allclose(got, cut / np.linalg.norm(cut), rtol=1e-6)
        assert abs(float(np.linalg.norm(got)) - 1) < 1e-5
    full = client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "base64"}).json()["data"]
    # The JSON answer's floats are float32's shortest text: read back as float32, the very same bits.
    got = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in full])
    assert np.array_equal(got, np.asarray(vectors, np.float32))


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"input": []}, "InvalidInputError"),
        ({"inputs": ["x"]}, "InvalidInputError"),  # the native field is not OpenAI's
        ({"input": [[101, 102]]}, "UnsupportedRequestError"),  # token arrays
        ({"input": "x", "encoding_format": "int8"}, "InvalidInputError"),
        ({"input": "x", "dimensions": 0}, "InvalidInputError"),
        ({"input": "x", "dimensions": 385}, "InvalidInputError"),
        ({"input": "x", "model": "all-minilm-l6-v2@9.9"}, "UnknownModelError"),
    ],
)
def test_openai_errors(client: TestClient, body: dict[str, Any], error: str) -> None:
    r = client.post("/v1/embeddings", json=body)
    assert r.status_code in (400, 404) and r.json()["error"]["type"] == error, r.text


def test_tei_embed_equals_native(client: TestClient, native: tuple[bytes, Any]) -> None:
    _, vectors = native
    r = client.post("/embed", json={"inputs": TEXTS, "normalize": True, "truncate": True})
    assert r.status_code == 200 and r.content == vector_text(vectors)
    single = client.post("/embed", json={"inputs": TEXTS[0]}).json()
    # TEI answers a list of vectors for one string too (a batch of one: compared with the native batch of one).
    assert single == client.post("/invocations", json={"inputs": TEXTS[0]}).json()["embeddings"]
    assert len(client.post("/embed", json={"inputs": TEXTS, "dimensions": 8}).json()[0]) == 8
    r = client.post("/embed", json={"inputs": TEXTS, "normalize": False})
    assert r.status_code == 400 and r.json()["error"]["type"] == "UnsupportedRequestError"


def test_routes_needing_another_task_say_so(client: TestClient) -> None:
    r = client.post("/rerank", json={"query": "q", "texts": ["a", "b"]})
    assert r.status_code == 400 and "needs a rerank, " in r.json()["error"]["message"]  # and the other tasks that can
    r = client.post("/predict", json={"inputs": "a"})
    assert r.status_code == 400 and "classify model" in r.json()["error"]["message"]


def test_info_health_and_json_404_405(client: TestClient) -> None:
    info = client.get("/info").json()
    assert info["model_id"] == "all-minilm-l6-v2" and "embedding" in info["model_type"]
    assert info["max_client_batch_size"] == 256
    assert client.get("/health").status_code == 200
    r = client.get("/nope")
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError" and "/v1/embeddings" in r.text
    listed = r.json()["error"]["message"].split("routes: ", 1)[1].split(", ")
    assert len(listed) == len(set(listed)) and "/" in listed  # each route once (`/` has a GET and a POST)
    r = client.post("/ping")
    assert r.status_code == 405 and r.json()["error"]["type"] == "MethodNotAllowedError"
    r = client.get("/embed")
    assert r.status_code == 405 and r.json()["error"]["type"] == "MethodNotAllowedError"


def test_media_types_on_embedding(client: TestClient, native: tuple[bytes, Any]) -> None:
    _, vectors = native
    r = client.post("/invocations", json={"inputs": TEXTS}, headers={"accept": "application/x-npy"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-npy"
    array = np.load(io.BytesIO(r.content))
    assert array.dtype == np.float32 and np.array_equal(array, np.asarray(vectors, np.float32))
    r = client.post("/invocations", content=b"a,b", headers={"content-type": "text/csv"})
    assert r.status_code == 415 and r.json()["error"]["type"] == "UnsupportedMediaTypeError"
    r = client.post("/invocations", json={"inputs": ["x"]}, headers={"accept": "text/csv"})
    assert r.status_code == 406 and r.json()["error"]["type"] == "NotAcceptableError"
    r = client.post("/invocations", content=b"\x93NUMPY", headers={"content-type": "application/x-npy"})
    assert r.status_code == 415 and "tensor" in r.json()["error"]["message"]


NPY = {"accept": "application/x-npy"}
SIMILARITY = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS}}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"input": TEXTS, "encoding_format": "base64"}),
        ("/invocations", {"inputs": TEXTS, "encoding_format": "base64"}),
    ],
)
def test_npy_with_base64_is_406_naming_both(client: TestClient, path: str, body: Any) -> None:
    """Issue 32 fault 10: .npy asked for with `encoding_format: base64` was a 500 InternalError (the base64
    strings went into a float32 array). The two are different encodings of one answer: 406, saying so."""
    r = client.post(path, json=body, headers=NPY)
    assert r.status_code == 406 and r.headers["content-type"] == "application/json", r.text
    error = r.json()["error"]
    assert (
        error["type"] == "NotAcceptableError"
        and "base64" in error["message"]
        and "application/json" in error["message"]
    )


@pytest.mark.parametrize("path", ["/similarity", "/"])
def test_npy_similarity_is_the_scores(client: TestClient, path: str) -> None:
    """Issue 32 fault 10: `POST /similarity` with Accept .npy answered the raw embeddings ([n, 384]) instead of
    the route's answer, the scores."""
    scores = client.post(path, json=SIMILARITY).json()
    r = client.post(path, json=SIMILARITY, headers=NPY)
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-npy", r.text
    array = np.load(io.BytesIO(r.content))
    assert array.dtype == np.float32 and array.shape == (len(TEXTS),)  # one score per sentence
    assert np.array_equal(array, np.asarray(scores, np.float32))


@pytest.mark.parametrize(
    ("path", "body"),
    [("/tokenize", {"inputs": "x"}), ("/decode", {"ids": [1, 2]}), ("/rerank", {"query": "q", "texts": ["a"]})],
)
def test_json_only_routes_refuse_npy_at_the_headers_and_fall_back_to_json(
    client: TestClient, path: str, body: Any
) -> None:
    r = client.post(path, json=body, headers=NPY)
    assert r.status_code == 406 and r.json()["error"]["type"] == "NotAcceptableError"
    assert "application/json" in r.json()["error"]["message"], r.text
    r = client.post(path, json=body, headers={"accept": "application/x-npy, */*;q=0.1"})
    assert r.status_code != 406 and r.headers["content-type"] == "application/json", r.text


def test_payload_limit_is_the_hosts(runtime: Runtime) -> None:
    body = json.dumps({"inputs": ["x" * 2000]}).encode()
    with client_for(runtime, HostSettings(payload_limit=1000)) as c:
        r = c.post("/invocations", content=body)
        assert r.status_code == 413 and "1000" in r.json()["error"]["message"]
    with client_for(runtime, HostSettings(payload_limit=10_000)) as c:
        assert c.post("/invocations", content=body).status_code == 200


def test_draining_turns_health_503_and_refuses_new_requests(runtime: Runtime) -> None:
    host = Host(lambda: runtime, WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=2), cpus=1))
    with TestClient(create_app(host)) as c:
        assert c.get("/ping").status_code == 200
        assert c.portal is not None
        c.portal.call(host.drain.begin)  # on the app's loop, as the SIGTERM handler schedules it
        for path in ("/ping", "/healthz", "/health"):
            r = c.get(path)
            assert r.status_code == 503 and r.json()["status"] == "draining", path
        r = c.post("/v1/embeddings", json={"input": "x"})
        assert r.status_code == 503 and r.json()["error"]["type"] == "ServiceBusyError"
        assert r.headers["retry-after"] == "1"


# -- Lambda: a Function URL path names a compatible API ----------------------------------------------------


def test_function_url_path_routes_to_openai(
    runtime: Runtime, load_event: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "workers", None)  # Lambda: one request at a time (the HTTP tests gave it a pool)
    event = load_event("function_url.json")
    event["body"] = json.dumps({"inputs": TEXTS})
    event["isBase64Encoded"] = False
    native = json.loads(runtime.handle(event, None)["body"])
    event["rawPath"] = "/v1/embeddings"
    event["body"] = json.dumps({"input": TEXTS})
    reply = runtime.handle(event, None)
    assert reply["statusCode"] == 200
    assert [d["embedding"] for d in json.loads(reply["body"])["data"]] == native["embeddings"]
    event["rawPath"] = "/embed"  # on Lambda, the native route's path since before TEI's routes
    event["body"] = json.dumps({"inputs": TEXTS})
    assert json.loads(runtime.handle(event, None)["body"]) == native
    event["rawPath"] = "/v2/embed"  # Cohere's, on a Function URL too
    event["body"] = json.dumps({"texts": TEXTS, "model": "embed-v4.0", "input_type": "search_query"})
    reply = runtime.handle(event, None)
    assert reply["statusCode"] == 200 and json.loads(reply["body"])["embeddings"]["float"] == native["embeddings"]


# -- rerank and classify: shapes mapped onto the native tasks (a fake task stands in) ----------------------


class FakeTask:
    def __init__(self, name: str, answer: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.name = name
        self.answer = answer
        self.seen: list[Any] = []

    def __call__(self, payload: Any) -> dict[str, Any]:
        self.seen.append(payload)
        return {**self.answer(payload), "model": "fake@1"}

    def warmup(self) -> None:
        pass


def fake_runtime(runtime: Runtime, task: FakeTask) -> Runtime:
    config = Config(model_dir=Path(runtime.manifest.root), backend=None, warmup=False)
    return Runtime(config, runtime.manifest, runtime.backend, task, dict(runtime.init_report))  # type: ignore[arg-type]


def test_tei_rerank_maps_onto_the_rerank_task(runtime: Runtime) -> None:
    task = FakeTask(
        "rerank",
        lambda p: {"results": [{"index": 1, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.2}]},
    )
    with client_for(fake_runtime(runtime, task)) as c:
        r = c.post("/rerank", json={"query": "q", "texts": ["a", "b"], "return_text": True, "raw_scores": False})
        assert r.status_code == 200, r.text
        assert r.json() == [{"index": 1, "score": 0.9, "text": "b"}, {"index": 0, "score": 0.2, "text": "a"}]
        assert task.seen[-1] == {"query": "q", "documents": ["a", "b"], "return_documents": True}
        assert c.post("/rerank", json={"query": "q", "texts": ["a"]}).json()[0].keys() == {"index", "score"}
        r = c.post("/rerank", json={"query": "q", "texts": ["a"], "raw_scores": True})
        assert r.status_code == 400 and r.json()["error"]["type"] == "UnsupportedRequestError"
        r = c.post("/rerank", json={"texts": ["a"]})
        assert r.status_code == 400 and "query" in r.json()["error"]["message"]
        assert c.post("/embed", json={"inputs": "x"}).status_code == 400  # not an embedding model


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_cohere_jina_rerank_maps_onto_the_rerank_task(runtime: Runtime, path: str) -> None:
    answer = {
        "results": [{"index": 1, "relevance_score": 0.9, "document": {"text": "b"}}],
        "usage": {"tokens": 7},
    }
    task = FakeTask("rerank", lambda p: answer)
    with client_for(fake_runtime(runtime, task)) as c:
        body = {"model": "rerank-v3.5", "query": "q", "documents": ["a", {"text": "b"}], "top_n": 1}
        r = c.post(path, json=body | {"return_documents": True})
        assert r.status_code == 200, r.text
        assert r.json() == {"model": "fake@1", "results": answer["results"], "usage": {"total_tokens": 7}}
        # An unknown model name means the default model, as for OpenAI's route; documents pass as sent.
        want = {"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1, "return_documents": True}
        assert task.seen[-1] == want
        c.post(path, json=body)
        assert task.seen[-1]["return_documents"] is False
        for bad, error in [
            ({"documents": ["a"]}, "InvalidInputError"),
            ({"query": "q"}, "InvalidInputError"),
            ({"query": "q", "documents": ["a"], "max_tokens_per_doc": 10}, "UnsupportedRequestError"),
            ({"query": "q", "documents": ["a"], "return_documents": "yes"}, "InvalidInputError"),
        ]:
            r = c.post(path, json=bad)
            assert r.status_code == 400 and r.json()["error"]["type"] == error, r.text


def test_v1_rerank_needs_a_rerank_model(client: TestClient) -> None:
    r = client.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and "needs a rerank, multivector or hybrid model" in message, message


def test_tei_predict_maps_onto_the_classify_task(runtime: Runtime) -> None:
    def classify(p: dict[str, Any]) -> dict[str, Any]:
        return {"predictions": [[{"label": "pos", "score": 0.8}, {"label": "neg", "score": 0.2}] for _ in p["inputs"]]}

    task = FakeTask("classify", classify)
    with client_for(fake_runtime(runtime, task)) as c:
        one = c.post("/predict", json={"inputs": "great"})
        assert one.status_code == 200 and one.json() == [{"label": "pos", "score": 0.8}, {"label": "neg", "score": 0.2}]
        assert task.seen[-1] == {"inputs": ["great"]}
        batch = c.post("/predict", json={"inputs": ["a", "b"]}).json()
        assert len(batch) == 2 and batch[0][0]["label"] == "pos"
        r = c.post("/predict", json={"inputs": [["a", "b"]]})
        assert r.status_code == 400 and r.json()["error"]["type"] == "UnsupportedRequestError"


# -- application/x-npy in and out: a tensor model with one input and one output ----------------------------


def test_npy_body_and_answer_for_a_one_input_tensor_model(tmp_path: Path) -> None:
    from onnx import TensorProto, helper, save_model

    from infra.pack import pack_onnx

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])],
        "double",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    save_model(model, str(tmp_path / "double.onnx"))
    packed = pack_onnx(tmp_path / "double.onnx", tmp_path / "packed", "double", "1.0")
    runtime = Runtime.start(Config(model_dir=packed, backend=None, warmup=False), environ={}, emit=None)
    x = np.array([[1.5, -2.0, 3.25], [0.0, 1e-3, 7.0]], np.float32)
    buf = io.BytesIO()
    np.save(buf, x)
    npy = {"content-type": "application/x-npy", "accept": "application/x-npy"}
    with client_for(runtime) as c:
        r = c.post("/invocations", content=buf.getvalue(), headers=npy)
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-npy", r.text
        y = np.load(io.BytesIO(r.content))
        assert y.dtype == np.float32 and np.array_equal(y, x * 2)
        # .npy in, JSON out; JSON in, .npy out
        r = c.post("/invocations", content=buf.getvalue(), headers={"content-type": "application/x-npy"})
        y_text = r.json()["outputs"]["y"]
        assert np.array_equal(np.asarray(y_text, np.float32), x * 2) and y_text[1][1] == 0.002  # float32's shortest
        r = c.post("/invocations", json={"inputs": {"x": x.tolist()}}, headers={"accept": "application/x-npy"})
        assert np.array_equal(np.load(io.BytesIO(r.content)), x * 2)
        r = c.post("/invocations", content=b"garbage", headers=npy)
        assert r.status_code == 400 and r.headers["content-type"] == "application/json"
        assert "not a .npy array" in r.json()["error"]["message"]
        buf3 = io.BytesIO()
        np.save(buf3, np.zeros((2, 4), np.float32))
        r = c.post("/invocations", content=buf3.getvalue(), headers=npy)
        assert r.status_code == 400 and r.json()["error"]["type"] == "InvalidInputError"  # the manifest's shape


# -- TEI's default route, parameters, tokenize/decode ------------------------------------------------------


def test_post_root_follows_the_models_task_as_tei_does(runtime: Runtime, client: TestClient) -> None:
    embed = client.post("/", json={"inputs": TEXTS}).json()
    assert embed == client.post("/embed", json={"inputs": TEXTS}).json()
    similar = client.post("/", json={"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS}}).json()
    assert (
        similar == client.post("/similarity", json={"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS}}).json()
    )
    assert abs(similar[0] - 1) < 1e-6 and all(-1 <= s <= 1 for s in similar)
    assert client.get("/").json() == {"ok": True}
    rerank = FakeTask("rerank", lambda p: {"results": [{"index": 0, "relevance_score": 0.5}]})
    with client_for(fake_runtime(runtime, rerank)) as c:
        assert c.post("/", json={"query": "q", "texts": ["a"]}).json() == [{"index": 0, "score": 0.5}]

    def classify(p: dict[str, Any]) -> dict[str, Any]:
        return {"predictions": [[{"label": "pos", "score": 0.8}] for _ in p["inputs"]]}

    task = FakeTask("classify", classify)
    with client_for(fake_runtime(runtime, task)) as c:
        assert c.post("/", json={"inputs": "a"}).json() == [{"label": "pos", "score": 0.8}]
        # The Inference API's shape (InferenceClient): with "parameters", a list per text, one text included.
        r = c.post("/", json={"inputs": "a", "parameters": {"top_k": 1, "function_to_apply": "softmax"}})
        assert r.json() == [[{"label": "pos", "score": 0.8}]] and task.seen[-1] == {"inputs": ["a"], "top_k": 1}
        r = c.post("/predict", json={"inputs": "a", "parameters": {"function_to_apply": "sigmoid"}})
        assert r.status_code == 400 and "softmax" in r.json()["error"]["message"]


def test_tokenize_and_decode_round_trip(client: TestClient) -> None:
    tokens = client.post("/tokenize", json={"inputs": ["hello world", "ünïcode"]}).json()
    assert [t["text"] for t in tokens[0]] == ["[CLS]", "hello", "world", "[SEP]"]
    assert tokens[0][1] == {"id": 7592, "text": "hello", "special": False, "start": 0, "stop": 5}
    ids = [[t["id"] for t in seq] for seq in tokens]
    assert client.post("/decode", json={"ids": ids}).json() == ["hello world", "unicode"]
    kept = client.post("/decode", json={"ids": ids[0], "skip_special_tokens": False}).json()
    assert kept == ["[CLS] hello world [SEP]"]
    bare = client.post("/tokenize", json={"inputs": "hello", "add_special_tokens": False}).json()
    assert [t["id"] for t in bare[0]] == [7592]
    r = client.post("/decode", json={"ids": [10**9]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "InvalidInputError"


def test_function_url_tokenize_route(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import http_v2_event

    monkeypatch.setattr(runtime, "workers", None)
    reply = runtime.handle(http_v2_event("/tokenize", {"inputs": "hello"}), None)
    assert reply["statusCode"] == 200 and json.loads(reply["body"])[0][1]["text"] == "hello"
    reply = runtime.handle(http_v2_event("/", {"inputs": ["hello"]}), None)  # `/` on Lambda: the native route
    assert "embeddings" in json.loads(reply["body"])


# -- Cohere's embed v2 -----------------------------------------------------------------------------------------


def test_cohere_v2_embed_float_and_base64_equal_native(client: TestClient, native: tuple[bytes, Any]) -> None:
    _, vectors = native
    body = {"texts": TEXTS, "model": "embed-v4.0", "input_type": "search_document"}
    r = client.post("/v2/embed", json=body | {"embedding_types": ["float", "base64"]})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer.keys() >= {"id", "embeddings", "texts", "meta"} and answer["texts"] == TEXTS
    assert answer["embeddings"]["float"] == vectors
    decoded = [np.frombuffer(base64.b64decode(b), "<f4") for b in answer["embeddings"]["base64"]]
    assert np.array_equal(decoded, np.asarray(vectors, np.float32))  # the same float32 bits
    assert answer["meta"]["billed_units"]["input_tokens"] > 0
    only_float = client.post("/v2/embed", json=body).json()["embeddings"]  # float when no type is asked
    assert only_float == {"float": vectors}
    cut = client.post("/v2/embed", json=body | {"output_dimension": 64}).json()["embeddings"]["float"]
    assert len(cut[0]) == 64 and abs(float(np.linalg.norm(cut[0])) - 1) < 1e-5


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"embedding_types": ["float", "int8"]}, "\"embedding_types\": 'int8' is not served"),
        ({"embedding_types": ["ubinary"]}, "\"embedding_types\": 'ubinary'"),
        ({"input_type": "image"}, '"input_type"'),
        ({"truncate": "START"}, '"truncate"'),
        ({"images": ["data:image/png;base64,AAAA"]}, '"images"'),
    ],
)
def test_cohere_v2_embed_refusals_name_the_field(client: TestClient, extra: dict[str, Any], named: str) -> None:
    r = client.post("/v2/embed", json={"texts": ["a"], "model": "m", "input_type": "search_query", **extra})
    assert r.status_code == 400 and r.json()["error"]["type"] == "UnsupportedRequestError"
    assert r.json()["error"]["message"].startswith(named)


def test_cohere_v2_embed_input_type_is_the_models_prompt(runtime: Runtime) -> None:
    def embed(p: dict[str, Any]) -> dict[str, Any]:
        return {"embeddings": [[1.0, 0.0] for _ in p["inputs"]], "usage": {"tokens": 3}}

    task = FakeTask("embedding", embed)
    task.prompts = {"query": "query: ", "passage": "passage: "}  # type: ignore[attr-defined]
    with client_for(fake_runtime(runtime, task)) as c:
        for input_type, prompt in [("search_query", "query"), ("search_document", "passage"), ("clustering", None)]:
            r = c.post("/v2/embed", json={"texts": ["x"], "model": "m", "input_type": input_type})
            assert r.status_code == 200, r.text
            assert task.seen[-1] == {"inputs": ["x"], **({"prompt_name": prompt} if prompt else {})}
        r = c.post("/v2/embed", json={"texts": ["x"], "model": "m", "input_type": "questions"})
        assert r.status_code == 400 and "search_query" in r.json()["error"]["message"]  # the choices, listed
