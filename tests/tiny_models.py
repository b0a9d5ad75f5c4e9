"""Tiny random Hugging Face / sentence-transformers model directories, built inside the tests (no downloads).

`make_model_dir(tmp_path, family, kind, **options)` writes a directory laid out the way the hub (or
`SentenceTransformer.save()` / `CrossEncoder.save()`) lays it out, for every family warmstart packs:

- families: bert, roberta, xlm-roberta, distilbert, mpnet (random weights from the transformers config
  classes; hidden 32, 2 layers, 4 heads, a fixed seed);
- kinds: "sentence-transformers" (an embedder: modules.json, 1_Pooling, optional 2_Normalize, prompts),
  "cross-encoder" (a reranker: *ForSequenceClassification with one label), "classifier" (n labels);
- tokenizers built with `tokenizers` (WordPiece for bert/distilbert/mpnet, byte-level BPE for roberta,
  Unigram for xlm-roberta), wrapped in the family's transformers fast tokenizer class and saved with
  `save_pretrained`.

Options (all keyword):
- layout: "hub" (default; the files most hub repositories hold: legacy `pooling_mode_*_tokens` keys,
  `sentence_bert_config.json` with `max_seq_length`, cross-encoders as a plain transformers checkpoint with the
  activation in `config.json`) or "st" (what sentence-transformers 6.x's own `save()` writes).
- pooling ("mean" | "cls" | "max" | "lasttoken" | anything sentence-transformers knows, e.g. "weightedmean"),
  normalize (bool), prompts (dict), default_prompt_name, max_seq_length (int or None: the model's positions).
- num_labels (cross-encoder: 1; classifier: 3), labels (list of names, classifier), problem_type
  ("single_label_classification" | "multi_label_classification"), activation (cross-encoder: None = leave it
  to the default, or a dotted torch path such as "torch.nn.modules.linear.Identity").
- tokenizer_files: "json" (tokenizer.json, default) or "vocab" (vocab.txt, or vocab.json + merges.txt for
  roberta; no tokenizer.json: warmstart must build it). Not available for xlm-roberta (sentencepiece).
- weights: "safetensors" (default) or "bin" (pytorch_model.bin, a plain state dict saved by torch.save).
- dense: [(out_features, activation class path), ...]: sentence-transformers Dense modules after the pooling
  (LaBSE: [(32, "torch.nn.modules.activation.Tanh")]; EmbeddingGemma: two with torch.nn.modules.linear.Identity).
- seed, name (the directory name under tmp_path; default "<family>-<kind>").

Heavy imports (torch, transformers) happen inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

FAMILIES = ("bert", "roberta", "xlm-roberta", "distilbert", "mpnet")
# Served on onnx only (infra/pack/families.py): built the same way, tokenizers as their hub repositories hold them
# (tokenizer.json; WordPiece for electra / nomic_bert, byte-level BPE with [CLS]/[SEP] for modernbert and with an
# appended <|endoftext|> and left padding for qwen2 / qwen3, Unigram for deberta-v2 / gte / gemma3_text).
NEW_FAMILIES = ("electra", "deberta-v2", "modernbert", "gte", "nomic_bert", "qwen2", "qwen3", "gemma3_text")
ALL_FAMILIES = FAMILIES + NEW_FAMILIES
KINDS = ("sentence-transformers", "cross-encoder", "classifier")
HIDDEN, LAYERS, HEADS, INTERMEDIATE, POSITIONS = 32, 2, 4, 64, 64
INIT_RANGE = 0.2  # larger than the usual 0.02 so tiny random models give distinct outputs per input

# Words the tokenizers know (random models: any text works, this only keeps most words whole).
_WORDS = (
    "hello world the quick brown fox jumps over lazy dog a an of to in is it what where who how why "
    "query passage document search paris berlin capital city france germany machine learning model "
    "good bad great terrible movie film love hate this that was were be very not no yes "
    "0 1 2 3 4 5 6 7 8 9 . , ! ? ' - : ; ( )"
)
CORPUS = tuple(_WORDS.split())
LETTERS = "abcdefghijklmnopqrstuvwxyz"

_LEGACY_POOLING_KEYS = {
    "cls": "pooling_mode_cls_token",
    "mean": "pooling_mode_mean_tokens",
    "max": "pooling_mode_max_tokens",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}


def _wordpiece_vocab(specials: list[str]) -> dict[str, int]:
    words = specials + list(LETTERS) + [f"##{c}" for c in LETTERS] + [w for w in CORPUS if w not in LETTERS]
    words += ["##s", "##ing", "##ed", "##ly"]
    return {w: i for i, w in enumerate(dict.fromkeys(words))}


def _bert_tokenizer(specials: list[str], cls: str, sep: str, pair_doubles_sep: bool) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = _wordpiece_vocab(specials)
    tok = Tokenizer(models.WordPiece(vocab, unk_token=specials[_unk_index(specials)]))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    pair = f"{cls} $A {sep} {sep} $B:1 {sep}:1" if pair_doubles_sep else f"{cls} $A {sep} $B:1 {sep}:1"
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=pair, special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])]
    )
    tok.decoder = decoders.WordPiece()
    return tok, vocab


def _unk_index(specials: list[str]) -> int:
    return next(i for i, s in enumerate(specials) if "unk" in s.lower())


ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def _bpe_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=ROBERTA_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([" ".join(CORPUS)] * 4, trainer=trainer)
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), add_prefix_space=False)
    return tok


def _unigram_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    pieces: list[tuple[str, float]] = [(s, 0.0) for s in ROBERTA_SPECIALS[:4]]
    pieces += [(f"\u2581{w}", -2.0 - i * 0.01) for i, w in enumerate(CORPUS)]
    pieces += [(c, -8.0) for c in LETTERS] + [(f"\u2581{c}", -7.0) for c in LETTERS] + [("\u2581", -5.0)]
    pieces = list(dict(pieces).items())
    pieces.append(("<mask>", 0.0))
    tok = Tokenizer(models.Unigram(pieces, unk_id=3, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    return tok


def _bpe(specials: list[str], template: tuple[str, str], ids: dict[str, int]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([" ".join(CORPUS)] * 4, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=template[0], pair=template[1], special_tokens=[(t, ids[t]) for t in ids]
    )
    return tok


def _unigram(specials: list[str], template: tuple[str, str], ids: dict[str, int]) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    pieces: list[tuple[str, float]] = [(s, 0.0) for s in specials]
    pieces += [(f"\u2581{w}", -2.0 - i * 0.01) for i, w in enumerate(CORPUS)]
    pieces += [(c, -8.0) for c in LETTERS] + [(f"\u2581{c}", -7.0) for c in LETTERS] + [("\u2581", -5.0)]
    pieces = list(dict(pieces).items())
    unk = next(i for i, s in enumerate(specials) if "unk" in s.lower())
    tok = Tokenizer(models.Unigram(pieces, unk_id=unk, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(
        single=template[0], pair=template[1], special_tokens=[(t, ids[t]) for t in ids]
    )
    return tok


def _new_tokenizer(family: str, model_max_length: int) -> Any:
    """The newer families' tokenizers, wrapped in transformers' generic fast tokenizer (what their hub
    repositories' tokenizer.json + tokenizer_config.json load as)."""
    import transformers

    wrap = transformers.PreTrainedTokenizerFast
    if family in ("electra", "nomic_bert"):
        tok, _ = _bert_tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "[CLS]", "[SEP]", False)
        return transformers.BertTokenizerFast(tokenizer_object=tok, model_max_length=model_max_length)
    bert_specials = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]"}
    if family == "modernbert":  # ModernBERT: GPT-NeoX-style byte-level BPE, [CLS] a [SEP] b [SEP]
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        template = ("[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1")
        tok = _bpe(specials, template, {"[CLS]": 2, "[SEP]": 3})
        return wrap(tokenizer_object=tok, model_max_length=model_max_length, mask_token="[MASK]", **bert_specials)
    if family == "deberta-v2":  # DeBERTa-v3: sentencepiece Unigram, [CLS] a [SEP] b [SEP]
        specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
        template = ("[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1")
        tok = _unigram(specials, template, {"[CLS]": 1, "[SEP]": 2})
        return wrap(tokenizer_object=tok, model_max_length=model_max_length, mask_token="[MASK]", **bert_specials)
    if family == "gte":  # gte-multilingual: XLM-R's sentencepiece, <s> a </s></s> b </s>
        template = ("<s> $A </s>", "<s> $A </s> </s> $B </s>")
        tok = _unigram(ROBERTA_SPECIALS[:4], template, {"<s>": 0, "</s>": 2})
        names = {"bos_token": "<s>", "eos_token": "</s>", "cls_token": "<s>", "sep_token": "</s>"}
        return wrap(
            tokenizer_object=tok, model_max_length=model_max_length, pad_token="<pad>", unk_token="<unk>", **names
        )
    if family in ("qwen2", "qwen3"):  # Qwen3-Embedding: byte-level BPE, <|endoftext|> appended, padded on the left
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        template = ("$A <|endoftext|>", "$A <|endoftext|> $B:1 <|endoftext|>:1")
        tok = _bpe(specials, template, {"<|endoftext|>": 0})
        return wrap(
            tokenizer_object=tok,
            model_max_length=model_max_length,
            pad_token="<|endoftext|>",
            eos_token="<|endoftext|>",
            padding_side="left",
        )
    if family == "gemma3_text":  # EmbeddingGemma: sentencepiece, <bos> a <eos>
        specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
        template = ("<bos> $A <eos>", "<bos> $A <eos> $B:1 <eos>:1")
        tok = _unigram(specials, template, {"<bos>": 2, "<eos>": 1})
        names = {"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>"}
        return wrap(tokenizer_object=tok, model_max_length=model_max_length, **names)
    raise ValueError(f"family {family!r}; valid: {', '.join(ALL_FAMILIES)}")


def build_tokenizer(family: str, model_max_length: int) -> tuple[Any, int]:
    """The family's transformers fast tokenizer over a `tokenizers` model built here, and its vocab size."""
    import transformers

    if family in NEW_FAMILIES:
        fast = _new_tokenizer(family, model_max_length)
    elif family in ("bert", "distilbert"):
        tok, _ = _bert_tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "[CLS]", "[SEP]", False)
        cls = transformers.BertTokenizerFast if family == "bert" else transformers.DistilBertTokenizerFast
        fast = cls(tokenizer_object=tok, model_max_length=model_max_length)
    elif family == "mpnet":
        tok, _ = _bert_tokenizer(["<s>", "<pad>", "</s>", "<unk>", "<mask>"], "<s>", "</s>", True)
        fast = transformers.MPNetTokenizerFast(
            tokenizer_object=tok,
            model_max_length=model_max_length,
            bos_token="<s>",
            eos_token="</s>",
            sep_token="</s>",
            cls_token="<s>",
            unk_token="<unk>",
            pad_token="<pad>",
            mask_token="<mask>",
        )
    elif family == "roberta":
        fast = transformers.RobertaTokenizerFast(tokenizer_object=_bpe_tokenizer(), model_max_length=model_max_length)
    elif family == "xlm-roberta":
        fast = transformers.XLMRobertaTokenizerFast(
            tokenizer_object=_unigram_tokenizer(), model_max_length=model_max_length
        )
    else:
        raise ValueError(f"family {family!r}; valid: {', '.join(FAMILIES)}")
    return fast, len(fast.backend_tokenizer.get_vocab())


def build_config(family: str, vocab_size: int, **extra: Any) -> Any:
    import transformers

    if family == "distilbert":
        return transformers.DistilBertConfig(
            vocab_size=vocab_size,
            dim=HIDDEN,
            n_layers=LAYERS,
            n_heads=HEADS,
            hidden_dim=INTERMEDIATE,
            max_position_embeddings=POSITIONS,
            initializer_range=INIT_RANGE,
            **extra,
        )
    common = {
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": INTERMEDIATE,
        "initializer_range": INIT_RANGE,
        **extra,
    }
    if family == "bert":
        return transformers.BertConfig(max_position_embeddings=POSITIONS, **common)
    offset = POSITIONS + 2  # these families count positions from padding_idx + 1 (pad id 1)
    if family == "roberta":
        return transformers.RobertaConfig(max_position_embeddings=offset, type_vocab_size=1, pad_token_id=1, **common)
    if family == "xlm-roberta":
        return transformers.XLMRobertaConfig(
            max_position_embeddings=offset, type_vocab_size=1, pad_token_id=1, **common
        )
    if family == "mpnet":
        return transformers.MPNetConfig(max_position_embeddings=offset, pad_token_id=1, **common)
    common["max_position_embeddings"] = POSITIONS
    if family == "electra":  # narrower embeddings, projected up (as ELECTRA-small)
        return transformers.ElectraConfig(embedding_size=16, **common)
    if family == "deberta-v2":  # DeBERTa-v3: relative attention in log buckets (8 here, so 16 tokens pass them)
        return transformers.DebertaV2Config(
            relative_attention=True,
            position_buckets=8,
            max_relative_positions=-1,
            pos_att_type=["p2c", "c2p"],
            position_biased_input=False,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            type_vocab_size=0,
            pad_token_id=0,
            **common,
        )
    if family == "modernbert":  # a local attention window of 8 tokens every other layer
        return transformers.ModernBertConfig(
            global_attn_every_n_layers=2, local_attention=8, pad_token_id=0, cls_token_id=2, sep_token_id=3,
            bos_token_id=2, eos_token_id=3, **common,
        )  # fmt: skip
    if family == "gte":
        return transformers.GteConfig(pad_token_id=1, type_vocab_size=1, **common)
    if family == "nomic_bert":
        return transformers.NomicBertConfig(pad_token_id=0, **common)
    decoder = {"num_key_value_heads": 2, "head_dim": 8, "pad_token_id": 0, "eos_token_id": 0, "bos_token_id": 0}
    if family == "qwen2":
        decoder.pop("head_dim")
        return transformers.Qwen2Config(**decoder, **common)
    if family == "qwen3":
        return transformers.Qwen3Config(**decoder, **common)
    if family == "gemma3_text":  # EmbeddingGemma: bidirectional, sliding (window 8) and full layers
        decoder.update(pad_token_id=0, eos_token_id=1, bos_token_id=2)
        return transformers.Gemma3TextConfig(
            use_bidirectional_attention=True,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            query_pre_attn_scalar=8,
            **decoder,
            **common,
        )
    raise ValueError(f"family {family!r}; valid: {', '.join(FAMILIES)}")


_MODEL_CLASSES = {
    "bert": ("BertModel", "BertForSequenceClassification"),
    "roberta": ("RobertaModel", "RobertaForSequenceClassification"),
    "xlm-roberta": ("XLMRobertaModel", "XLMRobertaForSequenceClassification"),
    "distilbert": ("DistilBertModel", "DistilBertForSequenceClassification"),
    "mpnet": ("MPNetModel", "MPNetForSequenceClassification"),
    "electra": ("ElectraModel", "ElectraForSequenceClassification"),
    "deberta-v2": ("DebertaV2Model", "DebertaV2ForSequenceClassification"),
    "modernbert": ("ModernBertModel", "ModernBertForSequenceClassification"),
    "gte": ("GteModel", "GteForSequenceClassification"),
    "nomic_bert": ("NomicBertModel", "NomicBertForSequenceClassification"),
    "qwen2": ("Qwen2Model", "Qwen2ForSequenceClassification"),
    "qwen3": ("Qwen3Model", "Qwen3ForSequenceClassification"),
    "gemma3_text": ("Gemma3TextModel", "Gemma3TextForSequenceClassification"),
}


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n")


def _save_hf(model: Any, tokenizer: Any, out: Path, family: str, tokenizer_files: str, weights: str) -> None:
    """A transformers checkpoint in `out` (config, weights, tokenizer) as the hub lays it out."""
    import torch

    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    if weights == "bin":
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        torch.save(state, out / "pytorch_model.bin")
        (out / "model.safetensors").unlink()
    elif weights != "safetensors":
        raise ValueError(f"weights {weights!r}; valid: safetensors, bin")
    if tokenizer_files == "vocab":
        _write_vocab_files(tokenizer, out, family)
    elif tokenizer_files != "json":
        raise ValueError(f"tokenizer_files {tokenizer_files!r}; valid: json, vocab")


def _write_vocab_files(tokenizer: Any, out: Path, family: str) -> None:
    """Replace tokenizer.json with the files a slow-style hub repository has (vocab.txt, vocab.json + merges)."""
    state = json.loads((out / "tokenizer.json").read_text())
    model = state["model"]
    if family in ("bert", "distilbert", "mpnet"):
        vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
        (out / "vocab.txt").write_text("".join(f"{w}\n" for w, _ in vocab))
    elif family == "roberta":
        _write_json(out / "vocab.json", model["vocab"])
        merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
        (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{m}\n" for m in merges))
    else:
        raise ValueError(f"tokenizer_files='vocab' is not available for {family} (it needs sentencepiece)")
    (out / "tokenizer.json").unlink()
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = type(tokenizer).__name__.removesuffix("Fast")
    config.pop("backend", None)
    if family in ("bert", "distilbert", "mpnet"):
        config["do_lower_case"] = True
    _write_json(config_path, config)


def make_model_dir(tmp_path: Path, family: str, kind: str = "sentence-transformers", **options: Any) -> Path:
    """Write a tiny random model directory (see the module docstring for `options`) and return its path."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub, even by accident
    import torch
    import transformers

    if family not in ALL_FAMILIES:
        raise ValueError(f"family {family!r}; valid: {', '.join(ALL_FAMILIES)}")
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}; valid: {', '.join(KINDS)}")
    layout = options.pop("layout", "hub")
    if layout not in ("hub", "st"):
        raise ValueError(f"layout {layout!r}; valid: hub, st")
    seed = int(options.pop("seed", 0))
    tokenizer_files = options.pop("tokenizer_files", "json")
    weights = options.pop("weights", "safetensors")
    out = Path(tmp_path) / str(options.pop("name", f"{family}-{kind}"))
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    max_seq_length = options.pop("max_seq_length", None)
    tokenizer, vocab_size = build_tokenizer(family, int(max_seq_length or POSITIONS))
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # the "Writing model shards" bars
    torch.manual_seed(seed)
    base_cls, seq_cls = _MODEL_CLASSES[family]
    if kind == "sentence-transformers":
        model = getattr(transformers, base_cls)(build_config(family, vocab_size)).eval()
        _save_st_embedder(model, tokenizer, out, family, layout, max_seq_length, tokenizer_files, weights, options)
    else:
        num_labels = int(options.pop("num_labels", 1 if kind == "cross-encoder" else 3))
        labels = options.pop("labels", None) or [f"LABEL_{i}" for i in range(num_labels)]
        if len(labels) != num_labels:
            raise ValueError(f"{len(labels)} labels for num_labels={num_labels}")
        extra: dict[str, Any] = {
            "num_labels": num_labels,
            "id2label": dict(enumerate(labels)),
            "label2id": {label: i for i, label in enumerate(labels)},
        }
        problem_type = options.pop("problem_type", None)
        if problem_type is not None:
            extra["problem_type"] = problem_type
        activation = options.pop("activation", None)
        model = getattr(transformers, seq_cls)(build_config(family, vocab_size, **extra)).eval()
        _save_hf(model, tokenizer, out, family, tokenizer_files, weights)
        if kind == "cross-encoder" and layout == "st":
            _write_st_cross_encoder_files(out, activation)
        elif activation is not None:  # hub cross-encoders carry it in config.json (sentence-transformers >= 4)
            config = json.loads((out / "config.json").read_text())
            config["sentence_transformers"] = {"activation_fn": activation, "version": "4.0.0"}
            _write_json(out / "config.json", config)
    if options:
        raise TypeError(f"unknown options for {kind}: {', '.join(sorted(options))}")
    return out


def _save_st_embedder(
    model: Any,
    tokenizer: Any,
    out: Path,
    family: str,
    layout: str,
    max_seq_length: int | None,
    tokenizer_files: str,
    weights: str,
    options: dict[str, Any],
) -> None:
    pooling = options.pop("pooling", "mean")
    normalize = bool(options.pop("normalize", True))
    prompts = dict(options.pop("prompts", None) or {})
    default_prompt_name = options.pop("default_prompt_name", None)
    include_prompt = bool(options.pop("include_prompt", True))
    dense = _dense_modules(list(options.pop("dense", None) or []))
    if layout == "st":
        _save_with_sentence_transformers(
            model, tokenizer, out, pooling, normalize, prompts, default_prompt_name, include_prompt, dense
        )
        if tokenizer_files != "json" or weights != "safetensors":
            _reshape_saved(out, tokenizer, family, tokenizer_files, weights, model)
        return
    _save_hf(model, tokenizer, out, family, tokenizer_files, weights)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    modules.append({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})
    pool_config: dict[str, Any] = {"word_embedding_dimension": HIDDEN}
    if pooling not in _LEGACY_POOLING_KEYS:
        raise ValueError(f"pooling {pooling!r}; sentence-transformers knows {', '.join(_LEGACY_POOLING_KEYS)}")
    pool_config.update({key: mode == pooling for mode, key in _LEGACY_POOLING_KEYS.items()})
    pool_config["include_prompt"] = include_prompt
    _write_json(out / "1_Pooling" / "config.json", pool_config)
    for module in dense:  # LaBSE / distiluse / EmbeddingGemma: 2_Dense (config.json, weights), 3_Dense...
        n = len(modules)
        (out / f"{n}_Dense").mkdir()
        module.save(str(out / f"{n}_Dense"))
        modules.append({"idx": n, "name": str(n), "path": f"{n}_Dense", "type": "sentence_transformers.models.Dense"})
    if normalize:
        # The hub never holds the empty 2_Normalize folder (git keeps no empty directories): only modules.json
        # names it.
        n = len(modules)
        modules.append(
            {"idx": n, "name": str(n), "path": f"{n}_Normalize", "type": "sentence_transformers.models.Normalize"}
        )
    _write_json(out / "modules.json", modules)
    st_config: dict[str, Any] = {"do_lower_case": False}
    if max_seq_length is not None:
        st_config["max_seq_length"] = int(max_seq_length)
    _write_json(out / "sentence_bert_config.json", st_config)
    _write_json(
        out / "config_sentence_transformers.json",
        {
            "__version__": {"sentence_transformers": "3.0.1", "transformers": "4.41.2", "pytorch": "2.3.0"},
            "prompts": prompts,
            "default_prompt_name": default_prompt_name,
            "similarity_fn_name": "cosine",
        },
    )


def _save_with_sentence_transformers(
    model: Any,
    tokenizer: Any,
    out: Path,
    pooling: str,
    normalize: bool,
    prompts: dict[str, str],
    default_prompt_name: str | None,
    include_prompt: bool,
    dense: list[Any],
) -> None:
    import tempfile

    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    with tempfile.TemporaryDirectory() as hf:
        model.save_pretrained(hf)
        tokenizer.save_pretrained(hf)
        transformer = Transformer(hf, model_kwargs={"local_files_only": True})
        modules: list[Any] = [transformer, Pooling(HIDDEN, pooling, include_prompt=include_prompt), *dense]
        if normalize:
            modules.append(Normalize())
        st = SentenceTransformer(modules=modules, prompts=prompts, default_prompt_name=default_prompt_name)
        st.save(str(out))


def _dense_modules(spec: list[tuple[int, str]]) -> list[Any]:
    """sentence-transformers Dense modules after pooling: `dense=[(out_features, activation class path), ...]`
    (random weights from the seeded generator), e.g. EmbeddingGemma's [(128, Identity), (32, Identity)]."""
    if not spec:
        return []
    import torch
    from sentence_transformers.sentence_transformer.modules import Dense

    modules, width = [], HIDDEN
    for out_features, activation in spec:
        module_name, _, class_name = activation.rpartition(".")
        import importlib

        act = getattr(importlib.import_module(module_name), class_name)()
        layer = Dense(width, out_features, bias=class_name != "Identity", activation_function=act)
        torch.nn.init.normal_(layer.linear.weight, std=0.3)
        modules.append(layer)
        width = out_features
    return modules


def _reshape_saved(out: Path, tokenizer: Any, family: str, tokenizer_files: str, weights: str, model: Any) -> None:
    import torch

    if weights == "bin":
        torch.save({k: v.contiguous() for k, v in model.state_dict().items()}, out / "pytorch_model.bin")
        (out / "model.safetensors").unlink()
    if tokenizer_files == "vocab":
        _write_vocab_files(tokenizer, out, family)


def _write_st_cross_encoder_files(out: Path, activation: str | None) -> None:
    """What `CrossEncoder.save()` (sentence-transformers 6.x) adds to a transformers checkpoint."""
    _write_json(out / "modules.json", [{"idx": 0, "name": "0", "path": "", "type": _ST_TRANSFORMER}])
    _write_json(
        out / "sentence_bert_config.json",
        {
            "transformer_task": "sequence-classification",
            "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
            "module_output_name": "scores",
        },
    )
    _write_json(
        out / "config_sentence_transformers.json",
        {
            "__version__": {"sentence_transformers": "6.3.0", "transformers": "5.25.0", "pytorch": "2.13.0"},
            "activation_fn": activation or "torch.nn.modules.activation.Sigmoid",
            "default_prompt_name": None,
            "model_type": "CrossEncoder",
            "prompts": {},
        },
    )


_ST_TRANSFORMER = "sentence_transformers.base.modules.transformer.Transformer"
