"""handler.backends.encoder_torch against `transformers`' own models: tiny random BERT / RoBERTa / XLM-RoBERTa /
DistilBERT / MPNet built from their config classes, saved with safetensors, mapped into the plain-torch encoder;
hidden states, sentence-transformers pooling and classification heads agree within 1e-5. Nothing is
downloaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from handler.backends.encoder_torch import EncoderConfig, HFEncoder, weight_names
from handler.backends.weights import mmap_safetensors

transformers = pytest.importorskip("transformers")

TOL = 1e-5
SMALL = {"vocab_size": 99, "max_position_embeddings": 40}


def hf_config(family: str, **extra: Any) -> Any:
    if family == "distilbert":
        return transformers.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=48, **SMALL, **extra)
    common = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 48}
    if family == "bert":
        return transformers.BertConfig(**common, **SMALL, **extra)
    if family == "mpnet":  # positions from padding_idx + 1 as RoBERTa's; 32 relative-position buckets
        return transformers.MPNetConfig(**common, vocab_size=99, max_position_embeddings=42, **extra)
    cls = transformers.RobertaConfig if family == "roberta" else transformers.XLMRobertaConfig
    # RoBERTa's positions start at padding_idx + 1, so the table has 2 more rows than the longest input.
    return cls(**common, vocab_size=99, max_position_embeddings=42, pad_token_id=1, type_vocab_size=1, **extra)


BASE = {
    "bert": "BertModel",
    "roberta": "RobertaModel",
    "xlm-roberta": "XLMRobertaModel",
    "distilbert": "DistilBertModel",
    "mpnet": "MPNetModel",
}
FAMILIES = list(BASE)


def save(model: Any, path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    model.save_pretrained(path, safe_serialization=True)
    return json.loads((path / "config.json").read_text()), mmap_safetensors(path / "model.safetensors")


def ours(family: str, raw: dict[str, Any], weights: dict[str, torch.Tensor], **head: Any) -> HFEncoder:
    with torch.device("meta"):
        model = HFEncoder(EncoderConfig.from_hf(family, raw), **head)
    names, missing = weight_names(model, family, set(weights))
    assert missing == []
    model.load_state_dict({k: weights[n] for k, n in names.items()}, assign=True, strict=True)
    return model.eval()


def batch(family: str, pairs: bool = False) -> dict[str, torch.Tensor]:
    """Two rows, the second padded (RoBERTa pads with id 1, the others with 0)."""
    pad = 1 if family in ("roberta", "xlm-roberta", "mpnet") else 0
    ids = torch.tensor([[5, 17, 42, 8, 63, 21, 9], [5, 33, 12, 9, pad, pad, pad]])
    mask = (torch.arange(7)[None, :] < torch.tensor([[7], [4]])).to(torch.int64)
    out = {"input_ids": ids, "attention_mask": mask}
    if pairs and family == "bert":
        out["token_type_ids"] = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0, 0]])
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_hidden_states_equal_transformers(tmp_path: Path, family: str) -> None:
    torch.manual_seed(0)
    reference = getattr(transformers, BASE[family])(hf_config(family)).eval()
    raw, weights = save(reference, tmp_path)
    assert not any(k.startswith(("bert.", "roberta.", "distilbert.", "mpnet.")) for k in weights)  # a bare base model
    model = ours(family, raw, weights)
    feeds = batch(family)
    with torch.inference_mode():
        want = reference(**feeds).last_hidden_state
        got = model.base(feeds["input_ids"], feeds["attention_mask"], None)
    mask = feeds["attention_mask"].bool()
    assert (got[mask] - want[mask]).abs().max().item() <= TOL  # padded positions are never read


@pytest.mark.parametrize("family", FAMILIES)
def test_long_padded_inputs_equal_transformers(tmp_path: Path, family: str) -> None:
    """38 tokens: positions near the table's end, and MPNet's logarithmic relative-position buckets (beyond 8
    tokens apart), with a row padded from 20."""
    torch.manual_seed(6)
    reference = getattr(transformers, BASE[family])(hf_config(family)).eval()
    raw, weights = save(reference, tmp_path)
    model = ours(family, raw, weights, pooling="mean", normalize=False)
    pad = 1 if family in ("roberta", "xlm-roberta", "mpnet") else 0
    ids = torch.randint(5, 99, (2, 38))
    mask = torch.ones_like(ids)
    ids[1, 20:], mask[1, 20:] = pad, 0
    with torch.inference_mode():
        want = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        got = model.base(ids, mask, None)
    assert (got[mask.bool()] - want[mask.bool()]).abs().max().item() <= TOL


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", ["mean", "cls", "max", "lasttoken"])
@pytest.mark.parametrize("normalize", [True, False])
def test_pooling_equals_sentence_transformers(tmp_path: Path, family: str, mode: str, normalize: bool) -> None:
    from sentence_transformers.sentence_transformer.modules import Pooling

    torch.manual_seed(1)
    reference = getattr(transformers, BASE[family])(hf_config(family)).eval()
    raw, weights = save(reference, tmp_path)
    model = ours(family, raw, weights, pooling=mode, normalize=normalize)
    feeds = batch(family)
    with torch.inference_mode():
        states = reference(**feeds).last_hidden_state
        want = Pooling(32, pooling_mode=mode)({"token_embeddings": states, "attention_mask": feeds["attention_mask"]})
        want = want["sentence_embedding"]
        if normalize:
            want = torch.nn.functional.normalize(want, p=2.0, dim=1)
        got = model(feeds["input_ids"], feeds["attention_mask"])
    assert got.shape == (2, 32)
    assert (got - want).abs().max().item() <= TOL


CLASSIFIERS = {
    "bert": "BertForSequenceClassification",
    "roberta": "RobertaForSequenceClassification",
    "xlm-roberta": "XLMRobertaForSequenceClassification",
    "distilbert": "DistilBertForSequenceClassification",
    "mpnet": "MPNetForSequenceClassification",
}


@pytest.mark.parametrize("family", FAMILIES)
def test_classification_head_equals_transformers(tmp_path: Path, family: str) -> None:
    torch.manual_seed(2)
    labels = {0: "neg", 1: "neutral", 2: "pos"}
    config = hf_config(family, id2label=labels, label2id={v: k for k, v in labels.items()})
    reference = getattr(transformers, CLASSIFIERS[family])(config).eval()
    raw, weights = save(reference, tmp_path)
    assert any(k.startswith(("bert.", "roberta.", "distilbert.", "mpnet.")) for k in weights)  # prefixed base model
    model = ours(family, raw, weights, head="sequence-classification")
    feeds = batch(family, pairs=True)
    with torch.inference_mode():
        want = reference(**feeds).logits
        got = model(**feeds)
    assert got.shape == (2, 3)
    assert (got - want).abs().max().item() <= TOL


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("activation", ["sigmoid", "identity"])
def test_rerank_scores_equal_transformers(tmp_path: Path, family: str, activation: str) -> None:
    torch.manual_seed(3)
    reference = getattr(transformers, CLASSIFIERS[family])(hf_config(family, num_labels=1)).eval()
    raw, weights = save(reference, tmp_path)
    model = ours(family, raw, weights, head="sequence-classification", activation=activation)
    feeds = batch(family, pairs=True)
    with torch.inference_mode():
        logits = reference(**feeds).logits[:, 0]
        want = torch.sigmoid(logits) if activation == "sigmoid" else logits
        got = model(**feeds)
    assert got.shape == (2,)
    assert (got - want).abs().max().item() <= TOL


def test_token_type_ids_change_a_bert_pair_score(tmp_path: Path) -> None:
    """The pair's second segment reaches the model: without type ids the score differs."""
    torch.manual_seed(4)
    reference = transformers.BertForSequenceClassification(hf_config("bert", num_labels=1)).eval()
    raw, weights = save(reference, tmp_path)
    model = ours("bert", raw, weights, head="sequence-classification", activation="identity")
    feeds = batch("bert", pairs=True)
    with torch.inference_mode():
        with_types = model(**feeds)
        without = model(feeds["input_ids"], feeds["attention_mask"])
    assert not torch.allclose(with_types, without)


def test_missing_and_renamed_weights(tmp_path: Path) -> None:
    torch.manual_seed(5)
    reference = transformers.BertModel(hf_config("bert")).eval()
    raw, weights = save(reference, tmp_path)
    with torch.device("meta"):
        model = HFEncoder(EncoderConfig.from_hf("bert", raw))
    old = {
        (k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")): v
        for k, v in weights.items()
    }
    names, missing = weight_names(model, "bert", set(old))
    assert missing == [] and names["base.embeddings.LayerNorm.weight"] == "embeddings.LayerNorm.gamma"
    del old["encoder.layer.1.output.dense.weight"]
    _, missing = weight_names(model, "bert", set(old))
    assert missing == ["bert.encoder.layer.1.output.dense.weight"]


@pytest.mark.parametrize(
    ("family", "raw", "match"),
    [
        ("gpt2", {}, "family 'gpt2'; the torch encoder runs: bert, roberta, xlm-roberta, distilbert, mpnet"),
        ("bert", {"position_embedding_type": "relative_key"}, "position_embedding_type 'relative_key'"),
        ("bert", {"hidden_act": "quick_gelu"}, "activation 'quick_gelu'; the torch encoder runs: gelu"),
    ],
)
def test_unsupported_configs_are_named(family: str, raw: dict[str, Any], match: str) -> None:
    config = hf_config("bert").to_dict() | raw
    with pytest.raises(ValueError, match=match):
        EncoderConfig.from_hf(family, config)


def test_head_options_are_validated() -> None:
    config = EncoderConfig.from_hf("bert", hf_config("bert").to_dict())
    with torch.device("meta"):
        for kwargs, match in [
            ({"head": "token-classification"}, "valid: none, sequence-classification"),
            ({"pooling": "weightedmean"}, "valid: mean, cls, max, lasttoken"),
            ({"head": "sequence-classification", "activation": "softmax"}, "valid: sigmoid, identity"),
        ]:
            with pytest.raises(ValueError, match=match):
                HFEncoder(config, **kwargs)
