"""The official clients against a real `python -m handler`, each answer checked against the native one.

Two hosts, each a real process on a free port: A serves the default embedding model (all-MiniLM-L6-v2) as its
default, with a tiny cross-encoder and a tiny classifier beside it (`WARMSTART_MODELS`, reached by `"model"`);
B serves the tiny classifier as its default (InferenceClient names no model in its body: the URL is the model).
The native answer is `POST /invocations` on the same host (and, for SageMaker's route itself, a direct invoke
of the same model in this process). The OpenAI client also runs against a Function URL in front of the local
Lambda (`infra.local`) serving the real `handler.app.lambda_handler`.

- openai: `embeddings.create` (floats, the client's default base64, explicit base64, `dimensions`, a typed
  error), `AsyncOpenAI`;
- langchain-openai: `OpenAIEmbeddings.embed_documents` / `embed_query` / `aembed_documents`, and the typed 400
  its default (token ids) meets;
- openai: `models.list` (every served model, with its task);
- cohere: `ClientV2.rerank` (`/v2/rerank`), `Client.rerank` (`/v1/rerank`), `ClientV2.embed` (`/v2/embed`: float,
  base64, a typed refusal), a rerank at the embedding default naming the served reranker;
- huggingface_hub: `InferenceClient.feature_extraction`, `sentence_similarity`, `text_classification`,
  `get_endpoint_info`, `health_check`; `text_classification` at an embedding default: a typed 400 naming the
  served classifier, never vectors;
- requests: SageMaker's `GET /ping`, `POST /invocations`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import requests

from tests.conftest import DIM, MODEL_KEY, ROOT, start
from tests.fixtures.drain_scenario import free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"),
]

TEXTS = ["the quick brown fox", "jumps over the lazy dog", "a third, longer sentence so the batch pads"]
QUERY = "what is the capital of germany"
DOCUMENTS = ["berlin is the capital of germany", "paris", "the quick brown fox", "machine learning model"]
LABELS = ["negative", "neutral", "positive"]


def cosine(a: Any, b: Any) -> float:
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def assert_same_vectors(got: Any, want: Any, exact: bool = True) -> None:
    got32, want32 = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got32.shape == want32.shape
    assert min(cosine(g, w) for g, w in zip(got32, want32, strict=True)) >= 0.99999
    if exact:
        assert np.array_equal(got32, want32)  # float32 through JSON and base64 alike: the very same bits


class Host:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log
        self.url = f"http://127.0.0.1:{port}"

    def post(self, path: str, body: Any) -> requests.Response:
        return requests.post(self.url + path, json=body, timeout=60)

    def vectors(self, texts: list[str]) -> list[list[float]]:
        """The native vectors of exactly this batch (a text's vector varies in its last bits with its batch's
        padding, so each client call is compared with the native answer to the same texts)."""
        vectors: list[list[float]] = self.native({"inputs": texts})["embeddings"]
        return vectors

    def native(self, body: dict[str, Any]) -> dict[str, Any]:
        r = self.post("/invocations", body)
        assert r.status_code == 200, r.text
        answer: dict[str, Any] = r.json()
        return answer


def start_host(log: Path, **env_extra: str) -> Host:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WARMSTART_", "AWS_LAMBDA_", "K_", "SAGEMAKER_"))}
    env.update(PYTHONPATH=str(ROOT), PORT=str(port), HOST="127.0.0.1", WARMSTART_WARMUP="0", **env_extra)
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "handler"], cwd=ROOT, env=env, stdout=out, stderr=out)
    return Host(proc, port, log)


def wait_ready(host: Host, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if host.proc.poll() is not None:
            raise RuntimeError(f"python -m handler exited: {host.log.read_text()[-3000:]}")
        try:
            if requests.get(host.url + "/ping", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    raise TimeoutError(host.log.read_text()[-3000:])


def stop(host: Host) -> None:
    host.proc.terminate()
    try:
        host.proc.wait(15)
    except subprocess.TimeoutExpired:
        host.proc.kill()
        host.proc.wait()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """The tiny cross-encoder and classifier, packed: kind → (directory, model id)."""
    from infra.pack.hf_pack import pack_from
    from tests.tiny_models import make_model_dir

    out: dict[str, tuple[Path, str]] = {}
    for kind, options in {
        "cross-encoder": {"activation": "torch.nn.Sigmoid"},
        "classifier": {"labels": LABELS, "num_labels": 3},
    }.items():
        root = tmp_path_factory.mktemp(kind)
        src = make_model_dir(root, "bert", kind, max_seq_length=32, **options)
        pack_from(src, root / "packed")
        manifest = json.loads((root / "packed" / "manifest.json").read_text())
        out[kind] = (root / "packed", manifest["id"])
    return out


@pytest.fixture(scope="module")
def hosts(
    model_dir: Path, tiny: dict[str, tuple[Path, str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Host, Host]]:
    tmp = tmp_path_factory.mktemp("hosts")
    extra = ",".join(str(tiny[k][0]) for k in ("cross-encoder", "classifier"))
    a = start_host(tmp / "a.log", WARMSTART_MODEL=str(model_dir), WARMSTART_MODELS=extra)
    b = start_host(tmp / "b.log", WARMSTART_MODEL=str(tiny["classifier"][0]))
    try:
        wait_ready(a)
        wait_ready(b)
        yield a, b
    finally:
        stop(a)
        stop(b)


@pytest.fixture(scope="module")
def host(hosts: tuple[Host, Host]) -> Host:
    return hosts[0]


@pytest.fixture(scope="module")
def native_vectors(host: Host) -> list[list[float]]:
    vectors: list[list[float]] = host.native({"inputs": TEXTS})["embeddings"]
    return vectors


# -- SageMaker: plain requests --------------------------------------------------------------------------------


def test_sagemaker_ping_and_invocations_equal_a_direct_invoke(host: Host, model_dir: Path) -> None:
    r = requests.get(host.url + "/ping", timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["model"] == MODEL_KEY
    r = requests.post(host.url + "/invocations", data=json.dumps({"inputs": TEXTS}), timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    direct = start(model_dir, warmup=False).handle({"inputs": TEXTS})  # the same model, as Lambda runs it
    assert_same_vectors(r.json()["embeddings"], direct["embeddings"])
    r = requests.post(host.url + "/invocations", data=b"{", timeout=10)
    assert r.status_code == 400 and r.json()["error"]["type"] == "InvalidJSONError"


# -- OpenAI ---------------------------------------------------------------------------------------------------


def test_openai_embeddings_float_base64_and_dimensions(host: Host, native_vectors: list[list[float]]) -> None:
    import openai

    client = openai.OpenAI(base_url=host.url + "/v1", api_key="unused", max_retries=0)
    # The client's default: it asks for base64 and decodes it into floats itself.
    default = client.embeddings.create(input=TEXTS, model="text-embedding-3-small")
    assert default.model == MODEL_KEY and [d.index for d in default.data] == [0, 1, 2]
    assert default.usage.prompt_tokens == default.usage.total_tokens > 0
    assert_same_vectors([d.embedding for d in default.data], native_vectors)
    floats = client.embeddings.create(input=TEXTS, model="all-minilm-l6-v2", encoding_format="float")
    assert_same_vectors([d.embedding for d in floats.data], native_vectors)
    raw = client.embeddings.create(input=TEXTS, model="text-embedding-3-small", encoding_format="base64")
    decoded = [np.frombuffer(base64.b64decode(str(d.embedding)), "<f4") for d in raw.data]
    assert_same_vectors(decoded, native_vectors)
    one = client.embeddings.create(input=TEXTS[0], model="text-embedding-3-small", dimensions=64)
    cut = np.asarray(host.vectors(TEXTS[:1])[0][:64], np.float32)
    assert len(one.data[0].embedding) == 64
    assert cosine(one.data[0].embedding, cut) >= 0.99999
    assert abs(float(np.linalg.norm(one.data[0].embedding)) - 1) < 1e-5
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(input=TEXTS[0], model="text-embedding-3-small", dimensions=DIM + 1)
    assert caught.value.status_code == 400
    assert caught.value.body["type"] == "InvalidInputError"  # type: ignore[index]  # the client unwraps "error"


def test_openai_async_client(host: Host, native_vectors: list[list[float]]) -> None:
    import openai

    async def both() -> list[Any]:
        async with openai.AsyncOpenAI(base_url=host.url + "/v1", api_key="unused", max_retries=0) as client:
            return list(
                await asyncio.gather(
                    client.embeddings.create(input=TEXTS, model="text-embedding-3-small"),
                    client.embeddings.create(input=TEXTS[1], model="text-embedding-3-small", encoding_format="float"),
                )
            )

    batch, single = asyncio.run(both())
    # Sent at once, the two may run as one dynamic batch: a text padded beside a longer one can differ from its
    # answer alone in the last bits (the batching contract is cosine >= 0.99999, docs/http-host.md).
    assert_same_vectors([d.embedding for d in batch.data], native_vectors, exact=False)
    assert_same_vectors([single.data[0].embedding], host.vectors(TEXTS[1:2]), exact=False)


# -- LangChain ------------------------------------------------------------------------------------------------


def test_langchain_openai_embeddings(host: Host, native_vectors: list[list[float]]) -> None:
    from langchain_openai import OpenAIEmbeddings

    lc = OpenAIEmbeddings(
        model="text-embedding-3-small", base_url=host.url + "/v1", api_key="unused", check_embedding_ctx_length=False
    )
    assert_same_vectors(lc.embed_documents(TEXTS), native_vectors)
    assert_same_vectors([lc.embed_query(TEXTS[2])], host.vectors(TEXTS[2:]))
    assert_same_vectors(asyncio.run(lc.aembed_documents(TEXTS)), native_vectors)


def test_langchain_default_sends_token_ids_and_is_told_what_to_set(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    import openai
    import tiktoken
    from langchain_openai import OpenAIEmbeddings

    # tiktoken downloads its vocabularies; offline, a byte-level one stands in: the request is the same shape
    # (token id arrays), which is all this checks.
    ranks = {bytes([i]): i for i in range(256)}
    encoding = tiktoken.Encoding(name="bytes", pat_str=r"\S+|\s+", mergeable_ranks=ranks, special_tokens={})
    monkeypatch.setattr(tiktoken, "encoding_for_model", lambda name: encoding)
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: encoding)
    lc = OpenAIEmbeddings(model="text-embedding-3-small", base_url=host.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        lc.embed_documents(TEXTS)
    assert caught.value.body["type"] == "UnsupportedRequestError"  # type: ignore[index]
    assert "check_embedding_ctx_length=False" in caught.value.body["message"]  # type: ignore[index]


# -- Cohere ---------------------------------------------------------------------------------------------------


def test_cohere_v2_and_v1_rerank(host: Host, tiny: dict[str, tuple[Path, str]]) -> None:
    import cohere

    model = tiny["cross-encoder"][1]
    native = host.native({"query": QUERY, "documents": DOCUMENTS, "top_n": 3, "model": model})["results"]
    v2 = cohere.ClientV2(api_key="unused", base_url=host.url).rerank(
        model=model, query=QUERY, documents=DOCUMENTS, top_n=3
    )
    assert [(r.index, r.relevance_score) for r in v2.results] == [(r["index"], r["relevance_score"]) for r in native]
    v1 = cohere.Client(api_key="unused", base_url=host.url).rerank(
        model=model, query=QUERY, documents=DOCUMENTS, top_n=3
    )
    assert [(r.index, r.relevance_score) for r in v1.results] == [(r["index"], r["relevance_score"]) for r in native]
    with pytest.raises(cohere.core.ApiError) as caught:  # the default model is no reranker: a typed 400
        cohere.ClientV2(api_key="unused", base_url=host.url).rerank(model="rerank-v3.5", query=QUERY, documents=["a"])
    assert caught.value.status_code == 400
    assert caught.value.body["error"]["type"] == "UnsupportedRequestError"  # type: ignore[index]
    assert model in caught.value.body["error"]["message"]  # type: ignore[index]  # the reranker served here


def test_cohere_v2_embed_float_and_base64(host: Host, native_vectors: list[list[float]]) -> None:
    import cohere

    client = cohere.ClientV2(api_key="unused", base_url=host.url)
    got = client.embed(
        texts=TEXTS, model="embed-v4.0", input_type="search_document", embedding_types=["float", "base64"]
    )
    assert got.texts == TEXTS and got.id
    assert_same_vectors(got.embeddings.float_, native_vectors)
    assert_same_vectors([np.frombuffer(base64.b64decode(b), "<f4") for b in got.embeddings.base64], native_vectors)
    with pytest.raises(cohere.core.ApiError) as caught:
        client.embed(texts=TEXTS, model="embed-v4.0", input_type="search_query", embedding_types=["int8"])
    assert caught.value.status_code == 400
    assert caught.value.body["error"]["message"].startswith("\"embedding_types\": 'int8'")  # type: ignore[index]


def test_openai_models_list_names_every_served_model_and_task(host: Host, tiny: dict[str, tuple[Path, str]]) -> None:
    import openai

    client = openai.OpenAI(base_url=host.url + "/v1", api_key="unused", max_retries=0)
    try:
        models = {m.id: m.model_extra["task"] for m in client.models.list()}  # type: ignore[index]
    finally:
        client.close()
    want = {"all-minilm-l6-v2": "embedding", tiny["cross-encoder"][1]: "rerank", tiny["classifier"][1]: "classify"}
    assert models == want


# -- Hugging Face InferenceClient -----------------------------------------------------------------------------


@pytest.fixture
def hub_client(monkeypatch: pytest.MonkeyPatch) -> Any:
    """InferenceClient, allowed to make requests: building the tiny models set HF_HUB_OFFLINE (never reach the
    Hub), which huggingface_hub reads once, at import, and which blocks every request, a local URL's too."""
    from huggingface_hub import InferenceClient, constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return InferenceClient


def test_inference_client_feature_extraction_and_similarity(
    host: Host, native_vectors: list[list[float]], hub_client: Any
) -> None:
    client = hub_client(model=host.url)
    got = client.feature_extraction(TEXTS)
    assert got.dtype == np.float32 and got.shape == (3, DIM)
    assert_same_vectors(got, native_vectors)
    assert_same_vectors(client.feature_extraction(TEXTS[0], normalize=True, truncate=True), host.vectors(TEXTS[:1]))
    scores = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    want = [cosine(native_vectors[0], v) for v in native_vectors[1:]]
    assert np.allclose(scores, want, atol=1e-6), (scores, want)
    # get_endpoint_info and health_check refuse unless the provider is named (the default is resolved per call).
    named = hub_client(model=host.url, provider="hf-inference")
    info = named.get_endpoint_info()
    assert info["model_id"] == "all-minilm-l6-v2" and info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_client_batch_size"] == 256 and info["max_batch_tokens"] >= info["max_input_length"] > 0
    assert named.health_check()


def test_inference_client_text_classification(hosts: tuple[Host, Host], hub_client: Any) -> None:
    _, b = hosts
    native = b.native({"inputs": [TEXTS[0]]})["predictions"][0]
    client = hub_client(model=b.url)
    got = client.text_classification(TEXTS[0])
    assert [(p.label, p.score) for p in got] == [(p["label"], p["score"]) for p in native]
    assert {p.label for p in got} == set(LABELS)
    top = client.text_classification(TEXTS[0], top_k=1)
    assert [(p.label, p.score) for p in top] == [(native[0]["label"], native[0]["score"])]
    info = hub_client(model=b.url, provider="hf-inference").get_endpoint_info()
    assert info["model_type"]["classifier"]["id2label"] == {str(i): label for i, label in enumerate(LABELS)}


def test_inference_client_text_classification_at_an_embedding_default_names_the_classifier(
    host: Host, tiny: dict[str, tuple[Path, str]], hub_client: Any
) -> None:
    from huggingface_hub.errors import HfHubHTTPError

    with pytest.raises(HfHubHTTPError) as caught:  # 200 with vectors before: the client crashed reading them
        hub_client(model=host.url).text_classification(TEXTS[0])
    assert caught.value.response is not None and caught.value.response.status_code == 400
    error = caught.value.response.json()["error"]
    assert error["type"] == "UnsupportedRequestError" and tiny["classifier"][1] in error["message"]


def test_tei_routes_follow_the_model_field(host: Host, tiny: dict[str, tuple[Path, str]]) -> None:
    """TEI's own routes (what its clients send, plain JSON) reach the model the request names."""
    classifier, reranker = tiny["classifier"][1], tiny["cross-encoder"][1]
    native = host.native({"inputs": TEXTS, "model": classifier})["predictions"]
    assert host.post("/predict", {"inputs": TEXTS, "model": classifier}).json() == native
    ranked = host.native({"query": QUERY, "documents": DOCUMENTS, "model": reranker})["results"]
    r = host.post("/rerank", {"query": QUERY, "texts": DOCUMENTS, "model": reranker, "return_text": True})
    assert r.json() == [
        {"index": x["index"], "score": x["relevance_score"], "text": DOCUMENTS[x["index"]]} for x in ranked
    ]
    tokens = host.post("/tokenize", {"inputs": "hello world"}).json()
    ids = [t["id"] for t in tokens[0]]
    assert tokens[0][0]["special"] and [t["text"] for t in tokens[0][1:-1]] == ["hello", "world"]
    assert host.post("/decode", {"ids": ids}).json() == ["hello world"]


# -- Lambda: the OpenAI client against a Function URL in front of the local Lambda ---------------------------


class FunctionURL(BaseHTTPRequestHandler):
    """What a Lambda Function URL does: the HTTP request as a payload 2.0 event, the function's answer back."""

    invoke: Any = None
    template: ClassVar[dict[str, Any]] = {}

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        event = json.loads(json.dumps(self.template))
        path = self.path.split("?", 1)[0]
        event.update(rawPath=path, body=body.decode(), isBase64Encoded=False)
        event["headers"] = {k.lower(): v for k, v in self.headers.items()}
        event["requestContext"]["http"].update(method="POST", path=path)
        answer = self.invoke(event)
        data = base64.b64decode(answer["body"]) if answer.get("isBase64Encoded") else answer["body"].encode()
        self.send_response(answer["statusCode"])
        for name, value in (answer.get("headers") or {}).items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_openai_client_through_a_function_url_on_the_local_lambda(
    model_dir: Path, native_vectors: list[list[float]], load_event: Any
) -> None:
    import openai

    from tests.fixtures.local_support import invoke, running

    env = {"WARMSTART_MODEL": str(model_dir), "WARMSTART_WARMUP": "0"}
    with running(handler="handler.app.lambda_handler", environment=env) as (_local, lam):
        handler = type(
            "Bound",
            (FunctionURL,),
            {"invoke": staticmethod(lambda event: invoke(lam, event)[1]), "template": load_event("function_url.json")},
        )
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/v1"
            client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
            got = client.embeddings.create(input=TEXTS, model="text-embedding-3-small")
            assert got.model == MODEL_KEY
            assert_same_vectors([d.embedding for d in got.data], native_vectors)
            floats = client.embeddings.create(input=TEXTS[0], model="x", encoding_format="float", dimensions=32)
            assert cosine(floats.data[0].embedding, native_vectors[0][:32]) >= 0.99999  # another batch: not bit-equal
            with pytest.raises(openai.BadRequestError) as caught:
                client.embeddings.create(input=[[1, 2, 3]], model="text-embedding-3-small")
            assert "check_embedding_ctx_length=False" in caught.value.body["message"]  # type: ignore[index]
        finally:
            server.shutdown()
            server.server_close()
