"""The families past BERT's five (infra/pack/families.py) and sentence-transformers Dense modules, end to end on
both backends: tiny random models built from each family's transformers config class, packed (the CLI for the
decoders, `pack_from` for the rest), served through the handler with JSON events by ONNX Runtime and by the torch
backend (torch.export's program, infra/pack/torch_program.py), each against `SentenceTransformer.encode` (cosine
>= 0.9999, norms within 1e-3, with prompts, batches of varied lengths so that padding matters:
sentence-transformers pads the Qwen tokenizers on the left, the run time on the right), `CrossEncoder.predict` and
transformers' text-classification pipeline (max abs diff <= 1e-4). The figures are recorded as the `parity`
property (`--junitxml`). A model whose program cannot be exported or does not match is packed onnx-only with the
reason in the manifest, and `--backends torch` is refused (the last test).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.core.errors import ConfigError
from infra.pack.hf_pack import pack_from
from infra.pack.hf_source import UnsupportedModelError
from tests.conftest import start
from tests.functional.test_own_model import DOCUMENTS, LONG, MAX_SEQ, QUERY, TEXTS, packer, pipeline_scores
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
BACKENDS = ("onnx", "torch")
CLI = ("qwen3", "gemma3_text")  # packed through `python -m infra.cli pack --from`
RERANKERS = ("electra", "deberta-v2", "modernbert")  # ms-marco-electra, mxbai-rerank-v1, modernbert rerankers
CLASSIFIERS = ("modernbert", "deberta-v2", "qwen3")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., tuple[Path, Path]]]:
    yield packer(tmp_path_factory, CLI)


VARIED = [*TEXTS, "the film was very good", "no", "where is the city of berlin in germany ?"]
# Attention the torch backend's program is captured with (infra/pack/torch_program.py): sdpa where transformers
# has it for the class; DeBERTa's disentangled attention has none.
ATTENTION = {"deberta-v2": "eager"}


def served_on_both(packed: Path, family: str) -> dict[str, Any]:
    """The manifest, after checking that both backends were packed, torch as the exported program."""
    manifest: dict[str, Any] = json.loads((packed / "manifest.json").read_text())
    assert list(manifest["backends"]) == list(BACKENDS) and "unsupported_backends" not in manifest
    torch_spec = manifest["backends"]["torch"]
    assert torch_spec["architecture"] == "exported-program" and torch_spec["max_abs_diff"] <= 1e-4
    assert torch_spec["attention"] == ATTENTION.get(family, "sdpa")
    return manifest


@pytest.mark.parametrize("family", sorted(EMBEDDERS))
def test_embeddings_equal_sentence_transformers(
    built: Callable[..., tuple[Path, Path]], family: str, record_property: Callable[[str, Any], None]
) -> None:
    from sentence_transformers import SentenceTransformer

    options = EMBEDDERS[family]
    src, packed = built(family, "sentence-transformers", **options)
    manifest = served_on_both(packed, family)
    reference = SentenceTransformer(str(src), device="cpu")
    asks: list[dict[str, Any]] = [{}, *({"prompt_name": name} for name in options.get("prompts", {}))]
    wants = [reference.encode(VARIED, **ask) for ask in asks]  # its default prompt applies when none is asked
    # one text at a time (no padding at all) is the same answer as inside the padded batch
    alone = [np.stack([reference.encode([text], **ask)[0] for text in VARIED[:3]]) for ask in asks]
    figures = {}
    for backend in BACKENDS:
        runtime = start(packed, backend)
        worst_cosine, worst_norm = 1.0, 0.0
        for ask, want, want_alone in zip(asks, wants, alone, strict=True):
            body = runtime.handle({"inputs": VARIED, **ask}, None)
            ours = np.asarray(body["embeddings"], np.float32)
            assert ours.shape == want.shape == (len(VARIED), manifest["dimension"]), backend
            sims = cosine(ours, want)
            assert sims.min() >= 0.9999, (backend, ask, sims)
            norms = np.abs(np.linalg.norm(ours, axis=1) - np.linalg.norm(want, axis=1))
            assert norms.max() <= 1e-3, (backend, ask, norms)
            assert cosine(ours[:3], want_alone).min() >= 0.9999, (backend, ask)
            worst_cosine, worst_norm = min(worst_cosine, float(sims.min())), max(worst_norm, float(norms.max()))
        a, b = runtime.handle({"inputs": [LONG, LONG + " completely different tail"]}, None)["embeddings"]
        np.testing.assert_allclose(a, b, atol=1e-6)  # truncated at max_seq_length, as sentence-transformers
        figures[backend] = {"min_cosine": worst_cosine, "max_norm_diff": worst_norm}
    record_property("parity", json.dumps(figures))


@pytest.mark.parametrize("family", RERANKERS)
def test_rerank_equals_cross_encoder(
    built: Callable[..., tuple[Path, Path]], family: str, record_property: Callable[[str, Any], None]
) -> None:
    from sentence_transformers import CrossEncoder

    src, packed = built(family, "cross-encoder")
    served_on_both(packed, family)
    want = CrossEncoder(str(src), device="cpu").predict([(QUERY, d) for d in DOCUMENTS])
    figures = {}
    for backend in BACKENDS:
        results = start(packed, backend).handle({"query": QUERY, "documents": DOCUMENTS}, None)["results"]
        got = np.array([r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])])
        np.testing.assert_allclose(got, want, atol=1e-4, err_msg=backend)
        figures[backend] = {"max_abs_diff": float(np.abs(got - want).max())}
    record_property("parity", json.dumps(figures))


@pytest.mark.parametrize("family", CLASSIFIERS)
def test_classify_equals_transformers_pipeline(
    built: Callable[..., tuple[Path, Path]], family: str, record_property: Callable[[str, Any], None]
) -> None:
    labels = ["negative", "neutral", "positive"]
    src, packed = built(family, "classifier", labels=labels)
    served_on_both(packed, family)
    want = pipeline_scores(src, VARIED, labels)
    figures = {}
    for backend in BACKENDS:
        body = start(packed, backend).handle({"inputs": VARIED}, None)
        rows = body["predictions"]
        got = np.array([[next(p["score"] for p in row if p["label"] == label) for label in labels] for row in rows])
        np.testing.assert_allclose(got, want, atol=1e-4, err_msg=backend)
        figures[backend] = {"max_abs_diff": float(np.abs(got - want).max())}
    record_property("parity", json.dumps(figures))


def test_a_program_that_does_not_match_is_onnx_only_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never served wrong: a family with no hand-written encoder whose program is refused (here: made to differ
    from the model) is packed onnx-only, the manifest saying why, and the torch backend is refused at run time
    and at pack time when asked for."""
    from infra.pack import torch_program

    real = torch_program._export

    def skewed(source: Any, head: Any, names: Any, feeds: Any, want: list[Any], attention: str, *rest: Any) -> Any:
        # The captured program is right; the check sees the model's outputs moved by 1e-3 (as a wrong program).
        return real(source, head, names, feeds, [w + 1e-3 for w in want], attention, *rest)

    monkeypatch.setattr(torch_program, "_export", skewed)
    src = make_model_dir(tmp_path, "gte", max_seq_length=MAX_SEQ, **EMBEDDERS["gte"])
    packed = pack_from(src, tmp_path / "packed")
    manifest = json.loads((packed / "manifest.json").read_text())
    assert list(manifest["backends"]) == ["onnx"]
    reason = manifest["unsupported_backends"]["torch"]
    assert "sdpa attention: the exported program differs from the model by 0.001" in reason, reason
    assert "eager attention: the exported program differs from the model by 0.001" in reason, reason
    with pytest.raises(ConfigError, match="the exported program differs from the model"):
        start(packed, "torch")
    with pytest.raises(UnsupportedModelError, match=r"backend torch is not supported for gte: .*differs"):
        pack_from(src, tmp_path / "torch", backends=["torch"])
    assert not (tmp_path / "torch").exists()


# Qwen3-Embedding-0.6B's layout at tiny sizes, from the same builder as bench/pack/big_model.py's 0.6B model:
# grouped-query attention 2:1, head_dim apart from hidden / heads, tied embeddings, its query prompt (with a newline),
# a byte-level BPE over the whole vocabulary appending <|endoftext|> and padding on the left.
QWEN3_TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 128,
    "vocab_size": 2000,
    "max_position_embeddings": 512,
    "initializer_range": 0.2,
}


def test_qwen3_embedding_layout_packs_and_equals_sentence_transformers(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    from bench.pack.models import QWEN3_PROMPTS, qwen3_embedder

    src = qwen3_embedder(tmp_path / "qwen3-embedding-tiny", max_seq_length=MAX_SEQ, **QWEN3_TINY)
    config = json.loads((src / "config.json").read_text())
    assert config["tie_word_embeddings"] is True and config["num_key_value_heads"] * 2 == config["num_attention_heads"]
    packed = pack_from(src, tmp_path / "packed")
    manifest = served_on_both(packed, "qwen3")
    assert manifest["pooling"] == {"mode": "lasttoken", "normalize": True, "in_graph": True}
    reference = SentenceTransformer(str(src), device="cpu")
    for ask in ({}, {"prompt_name": "query"}):
        want = reference.encode(VARIED, **ask)
        for backend in BACKENDS:
            body = start(packed, backend).handle({"inputs": VARIED, **ask}, None)
            ours = np.asarray(body["embeddings"], np.float32)
            assert ours.shape == want.shape == (len(VARIED), QWEN3_TINY["hidden_size"]), backend
            assert cosine(ours, want).min() >= 0.9999, (backend, ask)
    assert set(QWEN3_PROMPTS) == set(manifest["prompts"])
