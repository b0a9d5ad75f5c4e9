"""The families past BERT's five (infra/pack/families.py), end to end on ONNX Runtime: tiny random models built
from each family's transformers config class, packed (the CLI for the decoders, `pack_from` for the rest),
served through the handler with JSON events, against `SentenceTransformer.encode` (cosine >= 0.9999, norms within
1e-3, with prompts, batches of varied lengths so that padding matters: sentence-transformers pads the Qwen
tokenizers on the left, the run time on the right), `CrossEncoder.predict` and transformers' text-classification
pipeline (max abs diff <= 1e-4). The torch backend does not run these families: packed onnx-only, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.core.errors import ConfigError
from infra.pack.hf_pack import pack_from
from tests.conftest import ROOT, start
from tests.functional.test_own_model import DOCUMENTS, LONG, MAX_SEQ, QUERY, TEXTS, pipeline_scores
from tests.test_parity import cosine
from tests.tiny_models import make_model_dir

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning")

IDENTITY, TANH = "torch.nn.modules.linear.Identity", "torch.nn.modules.activation.Tanh"
PROMPTS = {"query": "query: ", "document": "title: none | text: "}
# Each family as its real embedders are laid out: decoders pool the last token (Qwen3-Embedding, gte-Qwen2),
# EmbeddingGemma means then projects through two Dense modules; LaBSE-style BERT: Dense with tanh.
EMBEDDERS: dict[str, dict[str, Any]] = {
    "qwen3": {"pooling": "lasttoken", "prompts": PROMPTS, "default_prompt_name": "query"},
    "qwen2": {"pooling": "lasttoken", "prompts": PROMPTS, "layout": "st"},
    "gemma3_text": {"pooling": "mean", "prompts": PROMPTS, "dense": [(96, IDENTITY), (24, IDENTITY)]},
    "modernbert": {"pooling": "mean", "prompts": PROMPTS},
    "deberta-v2": {"pooling": "mean"},
    "electra": {"pooling": "cls", "normalize": False},
    "gte": {"pooling": "cls", "prompts": PROMPTS},
    "nomic_bert": {"pooling": "mean", "prompts": {"query": "search_query: ", "document": "search_document: "}},
    "bert": {"pooling": "cls", "dense": [(24, TANH)]},  # LaBSE / distiluse
}
CLI = ("qwen3", "gemma3_text")  # packed through `python -m infra.cli pack --from`
RERANKERS = ("electra", "deberta-v2", "modernbert")  # ms-marco-electra, mxbai-rerank-v1, modernbert rerankers
CLASSIFIERS = ("modernbert", "deberta-v2", "qwen3")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., tuple[Path, Path]]]:
    cache: dict[str, tuple[Path, Path]] = {}
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    def make(family: str, kind: str, **options: Any) -> tuple[Path, Path]:
        key = f"{family}|{kind}|{sorted(options.items())}"
        if key not in cache:
            root = tmp_path_factory.mktemp(f"{family}-{kind}")
            src = make_model_dir(root, family, kind, max_seq_length=MAX_SEQ, **options)
            out = root / "packed"
            if family in CLI:
                cmd = [sys.executable, "-m", "infra.cli", "pack", "--from", str(src), "--out", str(out)]
                done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
                assert done.returncode == 0, done.stderr
            else:
                pack_from(src, out)
            cache[key] = (src, out)
        return cache[key]

    yield make


VARIED = [*TEXTS, "the film was very good", "no", "where is the city of berlin in germany ?"]


@pytest.mark.parametrize("family", sorted(EMBEDDERS))
def test_embeddings_equal_sentence_transformers(built: Callable[..., tuple[Path, Path]], family: str) -> None:
    from sentence_transformers import SentenceTransformer

    options = EMBEDDERS[family]
    src, packed = built(family, "sentence-transformers", **options)
    manifest = json.loads((packed / "manifest.json").read_text())
    assert list(manifest["backends"]) == ["onnx"] and "torch" in manifest["unsupported_backends"]
    runtime = start(packed, "onnx")
    reference = SentenceTransformer(str(src), device="cpu")
    asks: list[dict[str, Any]] = [{}, *({"prompt_name": name} for name in options.get("prompts", {}))]
    for ask in asks:
        body = runtime.handle({"inputs": VARIED, **ask}, None)
        ours = np.asarray(body["embeddings"], np.float32)
        want = reference.encode(VARIED, **ask)  # its default prompt applies when none is asked, as ours
        assert ours.shape == want.shape == (len(VARIED), manifest["dimension"])
        sims = cosine(ours, want)
        assert sims.min() >= 0.9999, (ask, sims)
        np.testing.assert_allclose(np.linalg.norm(ours, axis=1), np.linalg.norm(want, axis=1), atol=1e-3)
        # one text at a time (no padding at all) is the same answer as inside the padded batch
        alone = np.stack([reference.encode([text], **ask)[0] for text in VARIED[:3]])
        assert cosine(ours[:3], alone).min() >= 0.9999
    a, b = runtime.handle({"inputs": [LONG, LONG + " completely different tail"]}, None)["embeddings"]
    np.testing.assert_allclose(a, b, atol=1e-6)  # truncated at max_seq_length, as sentence-transformers


@pytest.mark.parametrize("family", RERANKERS)
def test_rerank_equals_cross_encoder(built: Callable[..., tuple[Path, Path]], family: str) -> None:
    from sentence_transformers import CrossEncoder

    src, packed = built(family, "cross-encoder")
    runtime = start(packed, "onnx")
    want = CrossEncoder(str(src), device="cpu").predict([(QUERY, d) for d in DOCUMENTS])
    results = runtime.handle({"query": QUERY, "documents": DOCUMENTS}, None)["results"]
    got = np.array([r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])])
    np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("family", CLASSIFIERS)
def test_classify_equals_transformers_pipeline(built: Callable[..., tuple[Path, Path]], family: str) -> None:
    labels = ["negative", "neutral", "positive"]
    src, packed = built(family, "classifier", labels=labels)
    runtime = start(packed, "onnx")
    body = runtime.handle({"inputs": VARIED}, None)
    got = np.array(
        [[next(p["score"] for p in row if p["label"] == label) for label in labels] for row in body["predictions"]]
    )
    np.testing.assert_allclose(got, pipeline_scores(src, VARIED, labels), atol=1e-4)


def test_torch_is_refused_with_the_reason(built: Callable[..., tuple[Path, Path]], tmp_path: Path) -> None:
    src, packed = built("qwen3", "sentence-transformers", **EMBEDDERS["qwen3"])
    with pytest.raises(ConfigError, match="no torch encoder for qwen3"):
        start(packed, "torch")
    with pytest.raises(Exception, match="backend torch is not supported for qwen3"):
        pack_from(src, tmp_path / "torch", backends=["torch"])
