"""bge-m3 (task hybrid) packed and served: dense, sparse and multi-vector answers from one model run on both
backends, against FlagEmbedding's formulas (`BGEM3FlagModel.encode` and `BGEM3Model`'s heads, re-implemented
here with torch: the CLS vector normalized; relu(sparse_linear) per token, the largest per token id, cls, eos,
pad and unk dropped; colbert_linear over the tokens after CLS, normalized, padding dropped), the routes'
shapes (`/v1/embeddings`, `/embed_sparse`, a ColBERT-scored `/v1/rerank`), and the one-line refusals.

One tiny random XLM-RoBERTa bge-m3 directory (sentence-transformers CLS pooling + the two heads' .pt files)
packed once for the module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.core.config import Config
from handler.core.errors import InvalidInputError
from handler.runtime.invocation import Runtime
from infra.pack.hf_checks import SourceError
from infra.pack.hf_source import UnsupportedModelError, read_source
from tests.functional.test_http_compat import client_for
from tests.tiny_models import HIDDEN, make_model_dir

TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog", "a", "query and a longer document text"]
COLBERT = 24  # bge-m3's colbert_linear keeps the width; any width is served


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    root = make_model_dir(tmp_path_factory.mktemp("m3"), "xlm-roberta", pooling="cls", normalize=True, layout="st")
    torch.manual_seed(1)
    sparse, colbert = torch.nn.Linear(HIDDEN, 1), torch.nn.Linear(HIDDEN, COLBERT)
    with torch.no_grad():
        sparse.weight.mul_(8.0)  # weights on both sides of 0: some tokens weigh nothing (relu)
    torch.save(sparse.state_dict(), root / "sparse_linear.pt")
    torch.save(colbert.state_dict(), root / "colbert_linear.pt")
    return root


@pytest.fixture(scope="module")
def runtimes(source: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Runtime]:
    from infra.pack.hf_pack import pack_from

    packed = pack_from(source, tmp_path_factory.mktemp("packed") / "m", backends=("onnx", "torch"))
    return {
        b: Runtime.start(Config(model_dir=packed, backend=b, warmup=False), environ={}, emit=None)
        for b in ("onnx", "torch")
    }


@pytest.fixture(scope="module")
def reference(source: Path) -> dict[str, Any]:
    """FlagEmbedding's three outputs for TEXTS, computed as its source does (no FlagEmbedding install)."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    model = transformers.AutoModel.from_pretrained(str(source), local_files_only=True).eval()
    sparse, colbert = torch.nn.Linear(HIDDEN, 1), torch.nn.Linear(HIDDEN, COLBERT)
    sparse.load_state_dict(torch.load(source / "sparse_linear.pt", weights_only=True))
    colbert.load_state_dict(torch.load(source / "colbert_linear.pt", weights_only=True))
    batch = tokenizer(TEXTS, padding=True, truncation=True, return_tensors="pt")
    unused = {tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
        dense = torch.nn.functional.normalize(hidden[:, 0], dim=-1).numpy()  # _dense_embedding (cls), normalized
        weights = torch.relu(sparse(hidden)).squeeze(-1).numpy()  # _sparse_embedding(return_embedding=False)
        mask = batch["attention_mask"]
        vecs = colbert(hidden[:, 1:]) * mask[:, 1:][:, :, None].float()  # _colbert_embedding
        vecs = torch.nn.functional.normalize(vecs, dim=-1).numpy()
    lexical, multi = [], []
    for row, ids, m, v in zip(weights, batch["input_ids"].tolist(), mask.tolist(), vecs, strict=True):
        result: dict[int, float] = {}
        for w, idx in zip(row, ids, strict=True):  # _process_token_weights
            if idx not in unused and w > 0 and w > result.get(idx, 0):
                result[idx] = float(w)
        lexical.append(dict(sorted(result.items())))
        multi.append(v[: sum(m) - 1])  # _process_colbert_vecs
    return {"dense": dense, "sparse": lexical, "colbert": multi}


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_three_outputs_match_flagembedding(
    runtimes: dict[str, Runtime], reference: dict[str, Any], backend: str
) -> None:
    got = runtimes[backend].serve(
        {"inputs": TEXTS, "return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
    )
    assert np.abs(np.asarray(got["dense_vecs"]) - reference["dense"]).max() < 1e-5
    assert any(len(r) < 5 for r in reference["sparse"])  # the relu drops tokens: the test sees it
    for entry, want in zip(got["lexical_weights"], reference["sparse"], strict=True):
        assert entry["indices"] == list(want)
        assert np.abs(np.asarray(entry["values"]) - list(want.values())).max(initial=0) < 1e-5
    for vecs, want in zip(got["colbert_vecs"], reference["colbert"], strict=True):
        assert np.asarray(vecs).shape == want.shape and np.abs(np.asarray(vecs) - want).max() < 1e-5


def test_each_output_chosen_per_request(runtimes: dict[str, Runtime], reference: dict[str, Any]) -> None:
    rt = runtimes["onnx"]
    assert set(rt.serve({"inputs": TEXTS})) == {"embeddings", "model", "usage"}
    only = rt.serve({"inputs": TEXTS, "return_dense": False, "return_sparse": True})
    assert set(only) == {"lexical_weights", "model", "usage"}
    top = rt.serve({"inputs": TEXTS[1], "return_sparse": True, "top_k": 2})["lexical_weights"][0]
    want = reference["sparse"][1]
    assert top["indices"] == sorted(sorted(want, key=lambda i: -want[i])[:2])
    vectors = rt.serve({"inputs": TEXTS, "input_type": "document"})["embeddings"]
    assert [np.asarray(v).shape for v in vectors] == [w.shape for w in reference["colbert"]]
    with pytest.raises(InvalidInputError, match="return_dense, return_sparse, return_colbert_vecs"):
        rt.serve({"inputs": "x", "return_dense": False})
    with pytest.raises(InvalidInputError, match="sparse_format"):
        rt.serve({"inputs": "x", "sparse_format": "csr"})


def test_routes_answer_dense_and_sparse(runtimes: dict[str, Runtime], reference: dict[str, Any]) -> None:
    with client_for(runtimes["onnx"]) as client:
        dense = client.post("/v1/embeddings", json={"input": TEXTS})
        sparse = client.post("/embed_sparse", json={"inputs": TEXTS})
        ranked = client.post("/v1/rerank", json={"query": TEXTS[0], "documents": TEXTS[1:]})
    assert dense.status_code == 200 and sparse.status_code == 200, (dense.text, sparse.text)
    assert ranked.status_code == 200, ranked.text
    q, *docs = reference["colbert"]  # FlagEmbedding's colbert_score: the best dot per query vector, averaged
    want = {i: float((q @ d.T).max(axis=1).sum() / len(q)) for i, d in enumerate(docs)}
    got_scores = {r["index"]: r["relevance_score"] for r in ranked.json()["results"]}
    assert [r["index"] for r in ranked.json()["results"]] == sorted(want, key=lambda i: -want[i])
    assert max(abs(got_scores[i] - want[i]) for i in want) < 1e-5
    got = np.asarray([d["embedding"] for d in dense.json()["data"]])
    assert np.abs(got - reference["dense"]).max() < 1e-5
    assert [[e["index"] for e in row] for row in sparse.json()] == [list(w) for w in reference["sparse"]]


def test_embedding_fields_refused(runtimes: dict[str, Runtime]) -> None:
    with client_for(runtimes["onnx"]) as client:
        cut = client.post("/v1/embeddings", json={"input": TEXTS, "dimensions": 4})
        named = client.post("/embed", json={"inputs": TEXTS, "prompt_name": "query"})
    for answer, field in ((cut, "dimensions"), (named, "prompt_name")):
        error = answer.json()["error"]
        assert answer.status_code == 400 and error["type"] == "InvalidInputError", answer.text
        assert error["message"].startswith(f'"{field}" is not served by a hybrid model'), answer.text


def test_refusals_are_one_line(source: Path, tmp_path: Path) -> None:
    import shutil

    from infra.pack.hf_pack import pack_from
    from infra.pack.precision import Precision

    assert read_source(source).task == "hybrid"
    assert read_source(source, task="embedding").task == "embedding"  # its dense output alone
    plain = tmp_path / "plain"
    shutil.copytree(source, plain)
    (plain / "colbert_linear.pt").unlink()
    with pytest.raises(UnsupportedModelError, match=r"^[^\n]*--task hybrid needs bge-m3's layout[^\n]*$"):
        read_source(plain, task="hybrid")
    (plain / "colbert_linear.pt").write_bytes(b"not a pickle")
    with pytest.raises(SourceError, match=r"^[^\n]*colbert_linear.pt: not loadable[^\n]*$"):
        read_source(plain)
    with pytest.raises(SourceError, match=r"^[^\n]*--dtype float16 is not served for hybrid[^\n]*$"):
        pack_from(source, tmp_path / "q", precision=Precision(dtype="float16"))


def test_int8_gate_measures_all_three_outputs(source: Path, tmp_path: Path) -> None:
    """`--quantize int8`: the record holds each output's figure and worst text, the gate's figure is the smallest
    of the three, and a threshold just above that one refuses (nothing written)."""
    import json

    from infra.pack.hf_pack import pack_from
    from infra.pack.precision import Precision
    from infra.pack.quality import QualityError

    # two batches of different lengths (the search's rows are the CLS rows)
    calibration = (*TEXTS, *(f"text {i} " + "word " * i for i in range(16)))
    int8 = Precision(quantize="int8", calibration=calibration, min_quality=0.0)
    packed = pack_from(source, tmp_path / "int8", backends=("onnx",), precision=int8)
    quality = json.loads((packed / "manifest.json").read_text())["precision"]["quality"]
    parts = {p: quality[p]["figure"] for p in ("dense", "sparse", "multivector")}
    assert all("worst_text" in quality[p] for p in parts) and quality["passed"] is True
    assert quality["figure"] == min(parts.values()) < 1.0 and parts[quality["weakest"]] == quality["figure"]
    above = Precision(quantize="int8", calibration=calibration, min_quality=quality["figure"] + 1e-6)
    with pytest.raises(QualityError, match=rf"^[^\n]*weakest '{quality['weakest']}'[^\n]*nothing was written"):
        pack_from(source, tmp_path / "refused", backends=("onnx",), precision=above)
    assert not (tmp_path / "refused").exists()


@pytest.mark.parametrize("part", ["dense", "sparse", "multivector"])
def test_int8_gate_figure_drops_with_each_output(part: str) -> None:
    """Each output broken alone lowers the gate's figure: none of the three is left out."""
    from types import SimpleNamespace

    from infra.pack.hybrid_quality import figures

    rng = np.random.default_rng(0)
    dim, texts = 8, [f"text {i}" for i in range(6)]  # 40 distinct ids a text: more than the sparse top k
    ids = np.stack([np.concatenate([[0], rng.permutation(np.arange(3, 200))[:38], [2]]) for _ in texts])
    ids[0, -5:] = 1  # padding
    feed = {"input_ids": ids, "attention_mask": (ids != 1).astype(np.int64)}
    want = rng.normal(size=(len(texts), 40, dim + 1 + 4)).astype(np.float32)
    want[:, :, dim] = rng.uniform(0.1, 1.0, size=want.shape[:2])
    got = want.copy()
    where = {  # the part's values shuffled among its own (the other parts untouched)
        "dense": np.s_[:, 0, :dim],
        "sparse": np.s_[:, 1:39, dim],
        "multivector": np.s_[:, 1:, dim + 1 :],
    }[part]
    got[where] = rng.permutation(want[where].ravel()).reshape(want[where].shape)
    model = SimpleNamespace(dimension=dim, hybrid=SimpleNamespace(unused_ids=(0, 1, 2)))
    same = figures(model, [feed], [want], [want], texts)
    out = figures(model, [feed], [want], [got], texts)
    assert same["figure"] == 1.0 and out["weakest"] == part and out["figure"] < 1.0, out
