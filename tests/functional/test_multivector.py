"""Task multivector end to end: a tiny random PyLate ColBERT directory packed (both backends, once), its token
vectors and MaxSim rerank against sentence-transformers' MultiVectorEncoder (which loads PyLate directories;
PyLate itself does not install beside this venv's torch: its parity figure is in docs/benchmarks.md), the
refusals, the HTTP host's routes, /info, the OpenAPI document and dynamic batching."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from handler.core.config import Config
from handler.http_host.host import Host
from handler.http_host.routes import create_app
from handler.runtime.invocation import HttpCall, Runtime
from handler.runtime.workers import Sizing, WorkerPool
from tests.colbert_models import DIMENSION, make_colbert_dir

QUERIES = ["hello world", "what is the capital of france?", "a b c d e f g h i j k l m n o p q r s t"]
# No word outside the tiny vocabulary: sentence-transformers keeps [UNK] tokens that PyLate skips.
DOCUMENTS = ["paris is the capital city of france.", "the quick brown fox, jumps over the lazy dog!", "berlin"]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_colbert_dir(tmp_path_factory.mktemp("colbert") / "src")


@pytest.fixture(scope="module")
def packed(source: Path) -> Path:
    from infra.pack.hf_pack import pack_from

    return pack_from(source, source.parent / "packed")


@pytest.fixture(scope="module", params=["onnx", "torch"])
def runtime(packed: Path, request: pytest.FixtureRequest) -> Runtime:
    return Runtime.start(Config(model_dir=packed, backend=request.param, warmup=True), environ={}, emit=None)


@pytest.fixture(scope="module")
def reference(source: Path) -> tuple[list[Any], list[Any]]:
    from sentence_transformers import MultiVectorEncoder

    model = MultiVectorEncoder(str(source), device="cpu", local_files_only=True)
    return list(model.encode_query(QUERIES)), list(model.encode_document(DOCUMENTS))


def test_vectors_equal_the_reference_encoder(runtime: Runtime, reference: tuple[list[Any], list[Any]]) -> None:
    queries = runtime.serve({"inputs": QUERIES, "input_type": "query"})["embeddings"]
    documents = runtime.serve({"inputs": DOCUMENTS})["embeddings"]
    for got, want in zip(queries + documents, reference[0] + reference[1], strict=True):
        assert got.shape == np.asarray(want).shape  # the same tokens kept: expansion, skip-list, padding
        assert np.abs(got - np.asarray(want)).max() < 1e-5
    assert all(len(q) == 12 for q in queries)  # expanded to query_length, the marker included
    assert len(documents[2]) == 4  # [CLS] [D] berlin [SEP]
    assert np.allclose(np.linalg.norm(documents[1], axis=1), 1, atol=1e-5)


def test_rerank_scores_by_maxsim(runtime: Runtime, reference: tuple[list[Any], list[Any]]) -> None:
    for i, query in enumerate(QUERIES):
        q = np.asarray(reference[0][i])
        want = np.array([(q @ np.asarray(d).T).max(axis=1).sum() for d in reference[1]])
        answer = runtime.serve({"query": query, "documents": DOCUMENTS, "top_n": 2, "return_documents": True})
        results = answer["results"]
        assert [r["index"] for r in results] == list(np.argsort(-want, kind="stable")[:2])
        for r in results:
            assert abs(float(r["relevance_score"]) - want[r["index"]]) < 1e-4
            assert r["document"] == {"text": DOCUMENTS[r["index"]]}


def test_base64_and_the_skip_list_drops_unknown_tokens_as_pylate_does(packed: Path) -> None:
    rt = Runtime.start(Config(model_dir=packed, backend="onnx", warmup=False), environ={}, emit=None)
    vectors = rt.serve({"inputs": ["berlin € ."]})["embeddings"][0]
    assert len(vectors) == 4  # "€" is [UNK] (PyLate maps the skip-list's unknown words to it), "." skipped
    encoded = rt.serve({"inputs": ["berlin € ."], "encoding_format": "base64"})["embeddings"][0]
    decoded = np.frombuffer(__import__("base64").b64decode(encoded), "<f4").reshape(-1, DIMENSION)
    assert np.array_equal(decoded, vectors)
    with pytest.raises(Exception, match="input_type"):
        rt.serve({"inputs": ["x"], "input_type": "passage"})


def test_http_routes_info_openapi_and_batching(packed: Path) -> None:
    rt = Runtime.start(Config(model_dir=packed, backend="onnx", warmup=False), environ={}, emit=None)
    workers = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=16, batch_wait_s=0), cpus=1)
    with TestClient(create_app(Host(lambda: rt, workers))) as client:
        cohere = client.post("/v1/rerank", json={"query": QUERIES[1], "documents": DOCUMENTS, "model": "x"})
        tei = client.post("/rerank", json={"query": QUERIES[1], "texts": DOCUMENTS})
        assert cohere.status_code == tei.status_code == 200
        assert [r["index"] for r in cohere.json()["results"]] == [r["index"] for r in tei.json()]
        info = client.get("/info").json()
        assert info["model_type"]["multivector"]["query_length"] == 12
        document = client.get("/openapi.json").json()
        assert "multivector" in json.dumps(document)
        bad = client.post("/v1/embeddings", json={"input": "x", "model": "x"})
        assert bad.status_code in (400, 404, 422) and "multivector" in bad.text
    # Several requests queued together: one batch, each answered as it is alone.
    rt.workers = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=64, batch_wait_s=0), cpus=1)
    calls = [
        HttpCall(json.dumps({"inputs": [QUERIES[0]], "input_type": "query"}).encode()),
        HttpCall(json.dumps({"query": QUERIES[1], "documents": DOCUMENTS}).encode()),
        HttpCall(json.dumps({"inputs": DOCUMENTS[1:]}).encode()),
        HttpCall(json.dumps({"inputs": [], "input_type": "query"}).encode()),
    ]
    import threading

    started, release = threading.Event(), threading.Event()
    rt.workers.submit(lambda: (started.set(), release.wait(30)))
    assert started.wait(30)
    futures = [rt.workers.submit_batch(rt.handle_http_batch, c) for c in calls]
    release.set()
    batched = [f.result(60) for f in futures]
    assert rt.workers.stats()["largest_batch"] >= 3
    for call, (status, body, _) in zip(calls, batched, strict=True):
        alone = rt.handle_http(call.raw, call.route, call.content, call.accept, call.limit)
        assert status == alone[0]
        if status == 200:
            assert np.allclose(_numbers(json.loads(body)), _numbers(json.loads(alone[1])), atol=1e-5)
    assert [s for s, _, _ in batched] == [200, 200, 200, 400]
    rt.workers.shutdown()


def _numbers(answer: dict[str, Any]) -> list[float]:
    if "results" in answer:
        return [r["relevance_score"] for r in answer["results"]]
    return [x for text in answer["embeddings"] for row in text for x in row]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"task": "embedding"}, "this is a PyLate (ColBERT) model: --task multivector"),
        ({"config": {"similarity_fn_name": "cosine"}}, "similarity 'cosine'; supported: MaxSim"),
        ({"config": {"query_length": 100_000}}, "query_length 100000; supported: an integer, 2 to"),
        ({"config": {"prompts": {"query": "q: "}}}, "prompts are not supported for multivector"),
        ({"dense": {"use_residual": True}}, "use_residual=true is not supported"),
        ({"dense": {"activation_function": "my.Act"}}, "activation_function 'my.Act' is not supported"),
    ],
)
def test_refusals_are_one_line(source: Path, tmp_path: Path, change: dict[str, Any], message: str) -> None:
    import shutil

    from infra.pack.hf_checks import SourceError
    from infra.pack.hf_source import read_source

    copy = tmp_path / "src"
    shutil.copytree(source, copy)
    for key, name in (("config", "config_sentence_transformers.json"), ("dense", "1_Dense/config.json")):
        if key in change:
            path = copy / name
            path.write_text(json.dumps({**json.loads(path.read_text()), **change[key]}))
    with pytest.raises(SourceError) as e:
        read_source(copy, change.get("task", "auto"))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_an_unknown_marker_and_reduced_precision_are_refused(source: Path, tmp_path: Path) -> None:
    import shutil

    from infra.pack.hf_checks import SourceError
    from infra.pack.hf_pack import pack_from
    from infra.pack.precision import Precision

    copy = tmp_path / "src"
    shutil.copytree(source, copy)
    path = copy / "config_sentence_transformers.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "query_prefix": "[unused0]"}))
    with pytest.raises(SourceError, match="query_prefix '\\[unused0\\]' is not a token"):
        pack_from(copy, tmp_path / "out")
    with pytest.raises(SourceError, match="--dtype float16 is not served for multivector"):
        pack_from(source, tmp_path / "out", precision=Precision(dtype="float16"))
    assert not (tmp_path / "out").exists()


def test_the_int8_gate_ranks_by_maxsim() -> None:
    from infra.pack.late_quality import agreement, token_rows

    rng = np.random.default_rng(0)
    out = rng.standard_normal((2, 6, 7, DIMENSION)).astype(np.float32)
    out /= np.linalg.norm(out, axis=-1, keepdims=True)
    masks = [np.array([[1] * 7] * 3 + [[1] * 4 + [0] * 3] * 3)] * 2
    want = token_rows(list(out), masks)
    assert [len(t) for t in want[:6]] == [7, 7, 7, 4, 4, 4]
    same = agreement(want, want)
    assert same["figure"] == same["top1_agreement"] == 1.0 and same["items"] == 12
    shuffled = agreement(want, want[::-1])  # another text's vectors in every row: rankings disagree
    assert shuffled["figure"] < 0.5
    broken = [w.copy() for w in want]
    broken[3][0, 0] = np.nan
    assert agreement(want, broken)["figure"] == 0.0
