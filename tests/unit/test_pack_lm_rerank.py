"""Decoder rerankers: a tiny random Qwen3ForCausalLM saved as sentence-transformers saves a CrossEncoder with a
LogitScore module ("yes" minus "no" at the last real position, a chat template per pair, a default prompt),
packed once for both backends and served through the rerank routes, against `CrossEncoder.predict`; a tiny random
Gemma3ForCausalLM in bge-reranker-v2-gemma's shape (BOS, a true token only, soft-capped logits) the same way."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.core.config import Config
from handler.core.errors import InvalidInputError
from handler.runtime.invocation import Runtime
from handler.tasks.lm_pairs import PairTemplate
from handler.tasks.tokens import Kept
from infra.pack.hf_pack import pack_from
from infra.pack.hf_source import UnsupportedModelError, read_source
from infra.pack.lm_rerank import LMRerankError, pair_template
from tests.lm_rerankers import TEMPLATE, make_reranker_dir

QUERY = "what is a cold start?"
DOCUMENTS = [
    "the first request of a new instance",
    "a warm call",
    "",
    "ünïcödé 日本語 テキスト emoji 🙂",
    "the quick brown fox jumps over the lazy dog . " * 60,  # past 512 tokens: truncated, the suffix restored
    "paris is the capital of france .",
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    from sentence_transformers import CrossEncoder

    root = tmp_path_factory.mktemp("lmrerank")
    src = make_reranker_dir(root)
    packed = pack_from(src, root / "packed", model_id="tiny-lm-reranker", version="1", fuse=False)
    want = CrossEncoder(str(src), local_files_only=True).predict([(QUERY, d) for d in DOCUMENTS])
    return src, packed, want


@pytest.fixture(scope="module", params=["onnx", "torch"])
def runtime(request: pytest.FixtureRequest, built: tuple[Path, Path, Any]) -> Iterator[Runtime]:
    yield Runtime.start(Config(model_dir=built[1], backend=request.param, warmup=True), environ={}, emit=None)


def test_manifest_holds_the_template_and_both_backends(built: tuple[Path, Path, Any]) -> None:
    manifest = json.loads((built[1] / "manifest.json").read_text())
    assert (manifest["task"], manifest["activation"], manifest.get("unsupported_backends")) == (
        "rerank",
        "sigmoid",
        None,
    )
    assert set(manifest["backends"]) == {"onnx", "torch"}
    assert [i["name"] for i in manifest["inputs"]] == ["input_ids", "attention_mask"]
    pair = manifest["pair_template"]
    assert pair["prefix"].endswith("<Instruct>: Given a web search query, retrieve relevant passages\n<Query>: ")
    assert (pair["middle"], pair["suffix"]) == (
        "\n<Document>: ",
        "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n",
    )


def test_scores_equal_cross_encoder_predict(runtime: Runtime, built: tuple[Path, Path, Any]) -> None:
    want = built[2]
    reply = runtime.serve({"query": QUERY, "documents": [{"text": d} for d in DOCUMENTS], "return_documents": True})
    got = np.zeros(len(DOCUMENTS), np.float32)
    for item in reply["results"]:
        got[item["index"]] = item["relevance_score"]
        assert item["document"]["text"] == DOCUMENTS[item["index"]]
    assert np.abs(got - want).max() < 1e-4
    assert [r["index"] for r in reply["results"]] == np.argsort(-want, kind="stable").tolist()
    assert reply["usage"]["tokens"] > 512  # the long document was truncated at 512


def test_a_request_instruction_replaces_the_default_prompt(runtime: Runtime, built: tuple[Path, Path, Any]) -> None:
    """`instruction` fills the template's system slot, as `CrossEncoder.predict(prompt=...)` renders it."""
    from sentence_transformers import CrossEncoder

    instruction = "Find passages that define serverless terms"
    want = CrossEncoder(str(built[0]), local_files_only=True).predict(
        [(QUERY, d) for d in DOCUMENTS], prompt=instruction
    )
    assert np.abs(want - built[2]).max() > 1e-3  # the instruction changes the scores
    reply = runtime.serve({"query": QUERY, "documents": DOCUMENTS, "instruction": instruction})
    got = np.zeros(len(DOCUMENTS), np.float32)
    for item in reply["results"]:
        got[item["index"]] = item["relevance_score"]
    assert np.abs(got - want).max() < 1e-4
    assert [r["index"] for r in reply["results"]] == np.argsort(-want, kind="stable").tolist()
    for bad, message in ((3, "instruction must be a string"), ("", '"instruction" is empty')):
        with pytest.raises(InvalidInputError, match=message):
            runtime.serve({"query": QUERY, "documents": DOCUMENTS, "instruction": bad})


def test_cohere_and_tei_routes_over_http(runtime: Runtime, built: tuple[Path, Path, Any]) -> None:
    from starlette.testclient import TestClient

    from handler.http_host.host import Host
    from handler.http_host.routes import create_app
    from handler.runtime.workers import Sizing, WorkerPool

    want = built[2]
    workers = WorkerPool(Sizing(min_workers=1, max_workers=2, max_queue=4), cpus=2)
    with TestClient(create_app(Host(lambda: runtime, workers, None))) as client:
        cohere = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS, "top_n": 2})
        tei = client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS})
    assert cohere.status_code == 200 and tei.status_code == 200, (cohere.text, tei.text)
    top = np.argsort(-want, kind="stable")[:2].tolist()
    assert [r["index"] for r in cohere.json()["results"]] == top
    scores = {r["index"]: r["score"] for r in tei.json()}
    assert max(abs(scores[i] - float(want[i])) for i in range(len(DOCUMENTS))) < 1e-4


def test_suffix_written_back_over_a_truncated_row() -> None:
    template = PairTemplate({"prefix": "", "middle": "", "suffix": "", "suffix_ids": (7, 8)})
    rows = [Kept([1, 2, 3, 4], [1, 1, 1, 1], [0] * 4), Kept([1, 2, 0, 0], [1, 1, 0, 0], [0] * 4)]
    fixed = template.restore(rows, max_length=4)
    assert [r.ids for r in fixed] == [[1, 2, 7, 8], [1, 2, 0, 0]]
    assert template.texts([("q", "d")]) == ["qd"]


def _copy(src: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(src, tmp_path / "copy"))


def test_refusals_are_one_line(built: tuple[Path, Path, Any], tmp_path: Path) -> None:
    src = _copy(built[0], tmp_path)
    with pytest.raises(UnsupportedModelError, match="packs as --task rerank only"):
        read_source(src, "classify")
    score = src / "1_LogitScore" / "config.json"
    score.write_text(json.dumps({"true_token_id": 10**6, "false_token_id": 1}))
    with pytest.raises(LMRerankError, match=r"true_token_id 1000000; expected a token id in 0\.\.401"):
        read_source(src)
    score.write_text(json.dumps({"true_token_id": 400, "false_token_id": 401}))
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "final_logit_softcapping": 30.0}))
    with pytest.raises(LMRerankError, match="final_logit_softcapping is not supported"):
        read_source(src)


def test_a_template_that_rewrites_the_text_is_refused(built: tuple[Path, Path, Any]) -> None:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(built[0]))
    tokenizer.chat_template = TEMPLATE.replace(
        "map(attribute='content') | first }}\n<D", "map(attribute='content') | first | upper }}\n<D"
    )
    with pytest.raises(LMRerankError, match="not a literal template"):
        pair_template(built[0], built[0], tokenizer)
    tokenizer.chat_template = "{{ messages[0].content }}"
    with pytest.raises(LMRerankError, match="query, then the document, once each"):
        pair_template(built[0], built[0], tokenizer)


def test_requests_batched_together_answer_as_alone(runtime: Runtime, built: tuple[Path, Path, Any]) -> None:
    """Two requests in one model run (the HTTP host's dynamic batching): rows of different lengths, padded
    right to the longest of both, each request's scores as its own call gives them."""
    from handler.tasks.batch import run_prepared

    payloads = [{"query": QUERY, "documents": DOCUMENTS[:2]}, {"query": "paris ?", "documents": DOCUMENTS[3:]}]
    with runtime.registry.lease(None) as model:
        task = model.task
        alone = [task(p) for p in payloads]
        together = run_prepared(task, [task.prepare(p) for p in payloads], max_tokens=1 << 20)
    for a, b in zip(alone, together, strict=True):
        assert [r["index"] for r in a["results"]] == [r["index"] for r in b["results"]]
        diff = [
            abs(x["relevance_score"] - y["relevance_score"]) for x, y in zip(a["results"], b["results"], strict=True)
        ]
        assert max(diff) < 1e-5
    assert [r["relevance_score"] for r in together[0]["results"]] == pytest.approx(
        sorted(built[2][:2].tolist(), reverse=True), abs=1e-4
    )


GEMMA_CAP = 0.5  # tests.lm_rerankers.make_gemma_reranker_dir's final_logit_softcapping


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """bge-reranker-v2-gemma's shape (tiny, random), packed once for both backends; CrossEncoder.predict's scores."""
    from sentence_transformers import CrossEncoder

    from tests.lm_rerankers import make_gemma_reranker_dir

    root = tmp_path_factory.mktemp("gemmarerank")
    src = make_gemma_reranker_dir(root, softcap=GEMMA_CAP)
    packed = pack_from(src, root / "packed", model_id="tiny-gemma-reranker", version="1", fuse=False)
    return packed, CrossEncoder(str(src), local_files_only=True).predict([(QUERY, d) for d in DOCUMENTS])


def test_gemma_reranker_bos_once_true_token_only_soft_capped(gemma: tuple[Path, Any]) -> None:
    """The template renders <bos> and the tokenizer adds it: the served text leaves it out (one BOS a row, as
    apply_chat_template gives); the score is the "Yes" logit alone, soft-capped in the graph."""
    packed, want = gemma
    manifest = json.loads((packed / "manifest.json").read_text())
    assert (manifest["family"], manifest["pair_template"]["prefix"], manifest["pair_template"]["middle"]) == (
        "gemma3_text",
        "A: ",
        "\nB: ",
    )
    logits = np.log(want / (1 - want))  # sigmoid activation: the capped logits, inside +-cap
    assert np.abs(logits).max() < GEMMA_CAP and np.abs(logits).max() > GEMMA_CAP / 2  # the cap bends them
    assert "instruction" not in manifest["pair_template"]  # its template renders no system message
    for backend in ("onnx", "torch"):
        runtime = Runtime.start(Config(model_dir=packed, backend=backend, warmup=False), environ={}, emit=None)
        with pytest.raises(InvalidInputError, match="without an instruction slot"):
            runtime.serve({"query": QUERY, "documents": DOCUMENTS, "instruction": "Find the code"})
        reply = runtime.serve({"query": QUERY, "documents": DOCUMENTS})
        got = np.zeros(len(DOCUMENTS), np.float32)
        for item in reply["results"]:
            got[item["index"]] = item["relevance_score"]
        assert np.abs(got - want).max() < 1e-4, backend
        assert [r["index"] for r in reply["results"]] == np.argsort(-want, kind="stable").tolist(), backend
