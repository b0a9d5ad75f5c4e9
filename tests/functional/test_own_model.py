"""Your own model, end to end: tiny random models of every family, packed with `pack --from` (the CLI for
some, `pack_from` for the rest), served through the handler with JSON events on both backends, against the
libraries users would otherwise serve them with: `SentenceTransformer.encode` (cosine ≥ 0.9999),
`CrossEncoder.predict` and transformers' text-classification pipeline (max abs diff ≤ 1e-4).

The pack-time graph itself is checked in tests/unit/test_pack_from.py; this file checks what a caller gets.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from handler.core.errors import ConfigError, InvalidInputError
from infra.pack.hf_pack import pack_from
from tests.conftest import ROOT, start
from tests.test_parity import cosine
from tests.tiny_models import FAMILIES, make_model_dir

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning")

BACKENDS = ("onnx", "torch")
MAX_SEQ = 16  # short, so that LONG is truncated by every reference and by us
LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 6)
TEXTS = ["hello world", "what is the capital of france", "paris is the capital city of france", LONG, "a"]
QUERY = "what is the capital of germany"
DOCUMENTS = ["berlin is the capital of germany", "paris", "the quick brown fox", LONG, "machine learning model"]
# Embedders: each family with a pooling mode of its own, plus prompts and an un-normalized model.
EMBEDDERS: dict[str, dict[str, Any]] = {
    "bert": {"pooling": "cls", "prompts": {"query": "query: ", "passage": "passage: "}},
    "roberta": {"pooling": "mean", "normalize": False},
    "xlm-roberta": {"pooling": "max", "prompts": {"query": "query: "}, "default_prompt_name": "query"},
    "distilbert": {"pooling": "lasttoken"},
    "mpnet": {"pooling": "mean"},
}


def packer(tmp_path_factory: pytest.TempPathFactory, through_cli: tuple[str, ...]) -> Callable[..., tuple[Path, Path]]:
    """(source, packed) per (family, kind, options), each built and packed once; the families named in
    `through_cli` are packed by `python -m infra.cli pack --from`, the others by `pack_from`."""
    cache: dict[str, tuple[Path, Path]] = {}
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    def make(family: str, kind: str, **options: Any) -> tuple[Path, Path]:
        key = f"{family}|{kind}|{sorted(options.items())}"
        if key not in cache:
            root = tmp_path_factory.mktemp(f"{family}-{kind}")
            src = make_model_dir(root, family, kind, max_seq_length=MAX_SEQ, **options)
            out = root / "packed"
            if family in through_cli:
                cmd = [sys.executable, "-m", "infra.cli", "pack", "--from", str(src), "--out", str(out)]
                done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
                assert done.returncode == 0, done.stderr
            else:
                pack_from(src, out)
            cache[key] = (src, out)
        return cache[key]

    return make


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., tuple[Path, Path]]]:
    """Every model packed once; bert goes through the CLI."""
    yield packer(tmp_path_factory, ("bert",))


# ---------------------------------------------------------------------------------------------- embedding


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_embeddings_equal_sentence_transformers(
    built: Callable[..., tuple[Path, Path]], family: str, backend: str
) -> None:
    from sentence_transformers import SentenceTransformer

    options = EMBEDDERS[family]
    src, packed = built(family, "sentence-transformers", **options)
    runtime = start(packed, backend)
    reference = SentenceTransformer(str(src), device="cpu")
    asks: list[dict[str, Any]] = [{}]
    asks += [{"prompt_name": name} for name in options.get("prompts", {})]
    for ask in asks:
        body = runtime.handle({"inputs": TEXTS, **ask}, None)
        ours = np.asarray(body["embeddings"], np.float32)
        want = reference.encode(TEXTS, **ask)  # its default prompt applies when none is asked, as ours
        assert ours.shape == want.shape
        sims = cosine(ours, want)
        assert sims.min() >= 0.9999, (ask, sims)
        if not options.get("normalize", True):  # un-normalized: the vectors themselves, not only their direction
            np.testing.assert_allclose(ours, want, rtol=1e-3, atol=1e-4)
        assert body["usage"]["tokens"] > 0
    # truncation at the model's max_seq_length: past it, nothing changes
    a, b = runtime.handle({"inputs": [LONG, LONG + " completely different tail"]}, None)["embeddings"]
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_dimensions_and_base64_match_the_full_vector(built: Callable[..., tuple[Path, Path]]) -> None:
    _, packed = built("bert", "sentence-transformers", **EMBEDDERS["bert"])
    runtime = start(packed, "onnx")
    full = np.asarray(runtime.handle({"inputs": TEXTS}, None)["embeddings"], np.float32)
    k = full.shape[1] // 2
    short = np.asarray(runtime.handle({"inputs": TEXTS, "dimensions": k}, None)["embeddings"], np.float32)
    want = full[:, :k] / np.linalg.norm(full[:, :k], axis=1, keepdims=True)  # Matryoshka: truncate, renormalize
    np.testing.assert_allclose(short, want, atol=1e-6)
    import base64

    encoded = runtime.handle({"inputs": TEXTS, "encoding_format": "base64"}, None)["embeddings"]
    decoded = np.stack([np.frombuffer(base64.b64decode(e), "<f4") for e in encoded])
    np.testing.assert_array_equal(decoded, full)


# ---------------------------------------------------------------------------------------------- rerank


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_rerank_equals_cross_encoder(built: Callable[..., tuple[Path, Path]], family: str, backend: str) -> None:
    from sentence_transformers import CrossEncoder

    src, packed = built(family, "cross-encoder")
    runtime = start(packed, backend)
    want = CrossEncoder(str(src), device="cpu").predict([(QUERY, d) for d in DOCUMENTS])
    body = runtime.handle({"query": QUERY, "documents": DOCUMENTS, "return_documents": True}, None)
    results = body["results"]
    assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
    got = np.array([r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])])
    np.testing.assert_allclose(got, want, atol=1e-4)
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert all(r["document"]["text"] == DOCUMENTS[r["index"]] for r in results)
    top = runtime.handle({"query": QUERY, "documents": DOCUMENTS, "top_n": 2}, None)["results"]
    assert [r["index"] for r in top] == [r["index"] for r in results[:2]] and "document" not in top[0]
    assert body["usage"]["tokens"] > 0


# ---------------------------------------------------------------------------------------------- classify


def pipeline_scores(src: Path, texts: list[str], labels: list[str]) -> npt.NDArray[np.float64]:
    import transformers

    pipe = transformers.pipeline("text-classification", model=str(src), tokenizer=str(src), device="cpu", top_k=None)
    rows = pipe(texts, truncation=True, max_length=MAX_SEQ)
    return np.array([[next(p["score"] for p in row if p["label"] == label) for label in labels] for row in rows])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("family", "problem_type"),
    [(f, "single_label_classification") for f in FAMILIES] + [("roberta", "multi_label_classification")],
)
def test_classify_equals_transformers_pipeline(
    built: Callable[..., tuple[Path, Path]], family: str, problem_type: str, backend: str
) -> None:
    labels = ["negative", "neutral", "positive"]
    src, packed = built(family, "classifier", labels=labels, problem_type=problem_type)
    runtime = start(packed, backend)
    body = runtime.handle({"inputs": TEXTS}, None)
    got = np.array(
        [[next(p["score"] for p in row if p["label"] == label) for label in labels] for row in body["predictions"]]
    )
    np.testing.assert_allclose(got, pipeline_scores(src, TEXTS, labels), atol=1e-4)
    if problem_type == "single_label_classification":
        np.testing.assert_allclose(got.sum(1), 1.0, atol=1e-5)  # softmax
    else:
        assert not np.allclose(got.sum(1), 1.0, atol=1e-3)  # sigmoid per label
    for row in body["predictions"]:
        assert [p["score"] for p in row] == sorted((p["score"] for p in row), reverse=True)
    top = runtime.handle({"inputs": TEXTS[:2], "top_k": 1}, None)["predictions"]
    assert [len(row) for row in top] == [1, 1]
    assert [row[0]["label"] for row in top] == [row[0]["label"] for row in body["predictions"][:2]]


# ---------------------------------------------------------------------------------------------- errors


def test_bad_requests_are_typed_and_the_model_keeps_serving(built: Callable[..., tuple[Path, Path]]) -> None:
    _, packed = built("bert", "cross-encoder")
    runtime = start(packed, "onnx")
    good = {"query": QUERY, "documents": DOCUMENTS}
    first = runtime.handle(good, None)
    for bad, message in [
        ({"query": QUERY, "documents": []}, "empty"),
        ({"query": QUERY, "documents": ["ok", 3]}, r"documents\[1\]"),
        ({"documents": DOCUMENTS}, '"query"'),
        ({"query": QUERY, "documents": DOCUMENTS, "top_n": 0}, "top_n"),
    ]:
        with pytest.raises(InvalidInputError, match=message):
            runtime.handle(bad, None)
    assert runtime.handle(good, None) == first
    _, embedder = built("bert", "sentence-transformers", **EMBEDDERS["bert"])
    with pytest.raises(InvalidInputError, match="valid: passage, query"):
        start(embedder, "onnx").handle({"inputs": ["x"], "prompt_name": "nope"}, None)


def test_torch_on_an_onnx_only_pack_is_a_config_error(built: Callable[..., tuple[Path, Path]], tmp_path: Path) -> None:
    src, _ = built("distilbert", "cross-encoder")
    packed = pack_from(src, tmp_path / "onnx-only", backends=["onnx"])
    with pytest.raises(ConfigError, match="torch"):
        start(packed, "torch")
