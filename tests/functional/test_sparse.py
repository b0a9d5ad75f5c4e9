"""SPLADE (sentence-transformers `SparseEncoder`) packed and served: parity with `SparseEncoder.encode` on both
backends (the same non-zero indices, values within 1e-5), the answer's options and shapes (native, Milvus,
TEI's `/embed_sparse` batched on the HTTP host, `/info`), the pooling arithmetic against `SpladePooling` for
every setting, and the one-line refusals of what a SparseEncoder directory may hold that is not served.

One tiny random BERT MLM (weights scaled so the logits spread over both signs) packed once for the module.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.core.config import Config
from handler.core.errors import InvalidInputError
from handler.runtime.invocation import Runtime
from infra.pack.hf_source import UnsupportedModelError, read_source
from tests.functional.test_http_compat import client_for
from tests.tiny_models import build_config, build_tokenizer

TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog", "a", "query and a longer document text"]
PROMPTS = {"query": "query: ", "document": ""}


def make_splade(where: Path, pooling: str = "max", router: bool = False) -> Path:
    """A SparseEncoder directory as sentence-transformers 6 saves one: Transformer (fill-mask) + SpladePooling;
    `router`: as the document route of a Router whose query route is a SparseStaticEmbedding (random weights)."""
    import tempfile

    import torch
    import transformers
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import Router, SparseStaticEmbedding, SpladePooling, Transformer

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    tokenizer, vocab_size = build_tokenizer("bert", 64)
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(build_config("bert", vocab_size)).eval()
    with torch.no_grad():  # logits spread wider (varied values), most of them below 0 (sparse rows)
        model.bert.embeddings.word_embeddings.weight.mul_(2.0)  # tied: the MLM decoder's too
        model.cls.predictions.bias.sub_(3.0)
    with tempfile.TemporaryDirectory() as hf:
        model.save_pretrained(hf)
        tokenizer.save_pretrained(hf)
        mlm = Transformer(hf, transformer_task="fill-mask", model_kwargs={"local_files_only": True})
        modules: list[Any] = [mlm, SpladePooling(pooling)]
        if router:  # idf-like weights, a third of them 0 (terms a query never weighs)
            weight = torch.rand(vocab_size) * 3 * (torch.rand(vocab_size) > 0.33)
            query = SparseStaticEmbedding(tokenizer=mlm.tokenizer, weight=weight, frozen=True)
            modules = [Router.for_query_document(query_modules=[query], document_modules=modules)]
        SparseEncoder(modules=modules, prompts=PROMPTS).save(str(where))
    return where


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packed model: a Router (inference-free queries) whose document route is a plain SPLADE model."""
    return make_splade(tmp_path_factory.mktemp("splade") / "src", router=True)


@pytest.fixture(scope="module")
def plain(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The document route alone, as a plain SparseEncoder directory (Transformer -> SpladePooling)."""
    where = tmp_path_factory.mktemp("plain") / "src"
    shutil.copytree(source, where)
    (where / "router_config.json").unlink()
    shutil.rmtree(where / "query_0_SparseStaticEmbedding")
    modules = [
        {"idx": 0, "name": "0", "path": "document_0_Transformer", "type": ST6 + "base.modules.transformer.Transformer"},
        {"idx": 1, "name": "1", "path": "document_1_SpladePooling", "type": ST6 + SPLADE_POOLING},
    ]
    (where / "modules.json").write_text(json.dumps(modules))
    return where


@pytest.fixture(scope="module")
def packed(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from infra.pack.hf_pack import pack_from

    return pack_from(source, tmp_path_factory.mktemp("packed") / "m", backends=("onnx", "torch"))


@pytest.fixture(scope="module")
def runtimes(packed: Path) -> dict[str, Runtime]:
    return {
        b: Runtime.start(Config(model_dir=packed, backend=b, warmup=False), environ={}, emit=None)
        for b in ("onnx", "torch")
    }


@pytest.fixture(scope="module")
def reference(source: Path) -> Callable[..., np.ndarray[Any, Any]]:
    """`encode_document` (`query=True`: `encode_query`) as dense float32 rows."""
    from sentence_transformers import SparseEncoder

    encoder = SparseEncoder(str(source), device="cpu")

    def encode(texts: list[str], query: bool = False, **kwargs: Any) -> np.ndarray[Any, Any]:
        method = encoder.encode_query if query else encoder.encode_document
        return np.asarray(method(texts, convert_to_tensor=True, **kwargs).to_dense().numpy())

    return encode


def _dense(entries: list[dict[str, Any]], width: int) -> np.ndarray[Any, Any]:
    out = np.zeros((len(entries), width), np.float32)
    for row, e in zip(out, entries, strict=True):
        assert e["indices"] == sorted(e["indices"])  # ascending token ids
        row[e["indices"]] = e["values"]
    return out


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_the_same_terms_and_weights_as_sparse_encoder(
    runtimes: dict[str, Runtime], reference: Callable[..., Any], backend: str
) -> None:
    want = reference(TEXTS)
    got = runtimes[backend].serve({"inputs": TEXTS})
    width = want.shape[1]
    for row, entry in zip(want, got["embeddings"], strict=True):
        assert entry["indices"] == np.flatnonzero(row).tolist()  # the same non-zero terms, exactly
        assert 0 < len(entry["indices"]) < width  # sparse, not empty: the test can tell a wrong pooling
    assert np.abs(_dense(got["embeddings"], width) - want).max() <= 1e-5
    assert float(want.max()) > 1.0  # the scaled weights' values vary widely
    # The document route with the query prompt, as encode_document(prompt_name="query") prepends it.
    prompted = runtimes[backend].serve({"inputs": TEXTS[:2], "prompt_name": "query"})
    assert np.abs(_dense(prompted["embeddings"], width) - reference(TEXTS[:2], prompt_name="query")).max() <= 1e-5


def test_queries_use_the_inference_free_encoder(runtimes: dict[str, Runtime], reference: Callable[..., Any]) -> None:
    want = reference(TEXTS, query=True)  # encode_query: the static weights of the tokens present, the prompt
    got = runtimes["onnx"].serve({"inputs": TEXTS, "input_type": "query"})  # its prompt: "query"
    for row, entry in zip(want, got["embeddings"], strict=True):
        assert entry["indices"] == np.flatnonzero(row).tolist()
        assert entry["values"].tolist() == row[entry["indices"]].tolist()  # the weights themselves
    assert got["usage"]["tokens"] > 0
    bare = runtimes["onnx"].serve({"inputs": TEXTS, "input_type": "query", "prompt": ""})  # a prompt named: that
    assert bare != got and bare["embeddings"][0]["indices"] == np.flatnonzero(reference(TEXTS[:1], True, prompt=""))


def test_top_k_tokens_and_the_milvus_shape(runtimes: dict[str, Runtime], reference: Callable[..., Any]) -> None:
    rt = runtimes["onnx"]
    full = rt.serve({"inputs": TEXTS[1]})["embeddings"][0]
    top = rt.serve({"inputs": TEXTS[1], "top_k": 5, "return_tokens": True})["embeddings"][0]
    values = np.asarray(full["values"])
    kept = sorted(np.asarray(full["indices"])[np.argsort(-values, kind="stable")[:5]].tolist())
    assert top["indices"] == kept  # the 5 largest, in token id order
    want = reference([TEXTS[1]], max_active_dims=5)[0]
    assert top["indices"] == np.flatnonzero(want).tolist()  # what encode(max_active_dims=5) keeps
    assert len(top["tokens"]) == 5 and all(isinstance(t, str) and t for t in top["tokens"])
    milvus = rt.serve({"inputs": TEXTS[1], "sparse_format": "milvus"})["embeddings"][0]["sparse"]
    assert list(milvus) == [str(i) for i in full["indices"]]
    assert np.allclose([float(v) for v in milvus.values()], values)


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        ({"inputs": "x", "top_k": 0}, "top_k"),
        ({"inputs": "x", "sparse_format": "coo"}, "sparse_format"),
        ({"inputs": "x", "input_type": "passage"}, "input_type"),
        ({"inputs": "x", "return_tokens": "yes"}, "return_tokens"),
        ({"inputs": "x", "prompt_name": "passage"}, "prompt_name"),
        ({"inputs": []}, "inputs"),
    ],
)
def test_bad_requests_name_their_field(runtimes: dict[str, Runtime], request_: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInputError, match=field):
        runtimes["onnx"].serve(request_)


def test_embed_sparse_batched_on_the_http_host(runtimes: dict[str, Runtime]) -> None:
    rt = runtimes["onnx"]
    alone = [rt.serve({"inputs": [t]})["embeddings"][0] for t in TEXTS]
    query = {"inputs": TEXTS, "input_type": "query"}  # answered in the batch without a model run
    with client_for(rt) as client:
        # concurrent requests (the host may run them as one batch), no more than client_for's queue of 4 (else 503)
        with ThreadPoolExecutor(4) as pool:
            asked = pool.submit(client.post, "/invocations", json=query)
            replies = list(pool.map(lambda t: client.post("/embed_sparse", json={"inputs": t}), TEXTS))
            queried = asked.result()
        info = client.get("/info").json()
        wrong = client.post("/embed", json={"inputs": "x"})
    for reply, want in zip(replies, alone, strict=True):
        assert reply.status_code == 200, reply.text
        [row] = reply.json()
        assert [e["index"] for e in row] == want["indices"]
        assert np.allclose([e["value"] for e in row], want["values"], atol=1e-5)
    assert queried.status_code == 200, queried.text
    want = rt.serve(query)["embeddings"]
    assert [e["indices"] for e in queried.json()["embeddings"]] == [e["indices"] for e in want]
    assert info["model_type"] == {"embedding": {"pooling": "splade"}}
    assert wrong.status_code == 400 and "embedding" in wrong.json()["error"]["message"]


@pytest.mark.parametrize("pooling", ["max", "sum"])
@pytest.mark.parametrize("activation", ["relu", "log1p_relu"])
def test_the_graphs_pooling_is_splade_poolings(pooling: str, activation: str) -> None:
    import torch
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    from infra.pack.sparse_source import Splade, splade

    torch.manual_seed(1)
    logits = torch.randn(3, 7, 50) * 3
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
    want = SpladePooling(pooling, activation).eval()({"token_embeddings": logits.clone(), "attention_mask": mask})
    got = splade(logits, mask, Splade(pooling, activation))
    assert torch.equal(got > 0, want["sentence_embedding"] > 0)
    assert float((got - want["sentence_embedding"]).abs().max()) <= 1e-6


def _rewritten(source: Path, tmp: Path, modules: list[dict[str, Any]] | None = None, **pool: Any) -> Path:
    """A copy of `source` with its modules.json replaced and its SpladePooling config updated."""
    where = tmp / "edited"
    shutil.copytree(source, where)
    if modules is not None:
        (where / "modules.json").write_text(json.dumps(modules))
    if pool:
        path = next(where.glob("*SpladePooling/config.json"))
        path.write_text(json.dumps({**json.loads(path.read_text()), **pool}))
    return where


ST5 = "sentence_transformers.sparse_encoder.models."  # how sentence-transformers 5 names the modules
ST6, SPLADE_POOLING = "sentence_transformers.", "sparse_encoder.modules.splade_pooling.SpladePooling"
MLM = {"idx": 0, "name": "0", "path": "document_0_Transformer", "type": ST5 + "MLMTransformer"}
POOL = {"idx": 1, "name": "1", "path": "document_1_SpladePooling", "type": ST5 + "SpladePooling"}


def test_a_plain_directory_reads_as_the_routers_document_route(plain: Path, source: Path, tmp_path: Path) -> None:
    read, routed = read_source(plain), read_source(source)
    assert read.task == routed.task == "sparse" and read.model_root == plain / "document_0_Transformer"
    assert read.splade is not None and routed.splade is not None
    assert (read.splade.static_query, routed.splade.static_query) == (None, "query_0_SparseStaticEmbedding")
    assert read.splade.pooling == routed.splade.pooling == "max"
    assert read.prompts == PROMPTS and read.dimension == read.shape["logits"] == read.config["vocab_size"]
    st5 = read_source(_rewritten(plain, tmp_path, [MLM, POOL], pooling_strategy="sum"))  # 5.x's names
    assert st5.task == "sparse" and st5.splade is not None and st5.splade.pooling == "sum"


@pytest.mark.parametrize(
    ("modules", "pool", "message"),
    [
        (
            [MLM, POOL, {"idx": 2, "path": "2", "type": ST5 + "SparseAutoEncoder"}],
            {},
            "MLMTransformer -> SpladePooling -> SparseAutoEncoder; supported",
        ),
        ([MLM, {**POOL, "type": ST6 + "models.Dense"}], {}, "MLMTransformer -> Dense; supported"),
        (None, {"pooling_strategy": "mean"}, "pooling_strategy 'mean'; supported: max, sum"),
        (None, {"activation_function": "gelu"}, "activation_function 'gelu'; supported: relu, log1p_relu"),
    ],
)
def test_what_is_not_served_is_refused_in_one_line(
    plain: Path, tmp_path: Path, modules: Any, pool: dict[str, Any], message: str
) -> None:
    with pytest.raises(UnsupportedModelError, match=message) as caught:
        read_source(_rewritten(plain, tmp_path, modules, **pool))
    assert "\n" not in str(caught.value)


def test_a_router_without_a_static_query_encoder_is_refused(source: Path, tmp_path: Path) -> None:
    where = _rewritten(source, tmp_path)
    config = json.loads((where / "router_config.json").read_text())
    config["structure"]["query"] = config["structure"]["document"]  # an asymmetric model: queries run it too
    (where / "router_config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="Router routes query: Transformer -> SpladePooling; document"):
        read_source(where)


def test_a_task_other_than_sparse_is_refused(source: Path) -> None:
    with pytest.raises(UnsupportedModelError, match="packs as --task sparse, not embedding"):
        read_source(source, "embedding")
