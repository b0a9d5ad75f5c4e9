"""Big random model directories for the pack-memory and big-model benches (issue 26), built from transformers'
config classes (never downloaded) and cached under build/bench-models/ so reruns do not rebuild them.

- `qwen3_embedder(out, **overrides)`: Qwen3-Embedding-0.6B's real config (Qwen3Config: hidden 1024, 28 layers,
  16 attention heads / 8 key-value heads, head_dim 128, intermediate 3072, vocab 151,669, 32,768 positions, rope
  theta 1e6, tied word embeddings; 596M parameters, 2.4 GB of float32) with random weights, laid out as the hub's
  sentence-transformers directory (Transformer -> last-token Pooling -> Normalize, its query prompt, the tokenizer
  padding on the left and appending <|endoftext|>). Its tokenizer is a byte-level BPE of the full vocabulary
  built here (256 bytes, 65,536 two-byte and 85,851 three-byte merges, then 26 special tokens: 151,669 ids, as
  the embedding table): random weights make the token ids' meaning moot, only the count and shape matter.
- `qwen3_chat(out, **overrides)`: Qwen3-0.6B's config (the chat model: Qwen3ForCausalLM, vocab 151,936 with the
  tokenizer's 151,669 ids, 40,960 positions, tied embeddings; QWEN3_06B otherwise) with random weights, as the
  hub's directory: config.json, model.safetensors, generation_config.json (its eos ids and sampling defaults),
  tokenizer.json + tokenizer_config.json with a ChatML chat template: what `pack --from` packs as task generate.
- `qwen3-1.7b` (`cached` only): `qwen3_chat` with Qwen3-1.7B's sizes (QWEN3_CHAT_17B: hidden 2048, intermediate
  6144), for the loading bench (bench/generate/load.py).
- `bert_base(out)`: bench_pack_memory's BERT-base (hidden 768, 12 layers; 438 MB of float32).

`cached(name)` builds a model once into build/bench-models/NAME (a `.done` marker written last, so a build that
was interrupted is redone).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "build" / "bench-models"
BASE = {  # BERT-base
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "vocab_size": 30522,
    "max_position_embeddings": 512,
}
MAX_SEQ = 256
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


# Qwen3-Embedding-0.6B's config.json (the hub's, as of 2025-06), every size as released.
QWEN3_06B: dict[str, Any] = {
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 3072,
    "vocab_size": 151_669,
    "max_position_embeddings": 32_768,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "attention_bias": False,
    "use_sliding_window": False,
    "bos_token_id": 151_643,
    "eos_token_id": 151_643,
    "pad_token_id": 151_643,
}
# Qwen3-Embedding's sentence-transformers files: its query prompt, 8,192 tokens at most (the model card's).
QWEN3_PROMPTS = {
    "query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:",
    "document": "",
}
QWEN3_MAX_SEQ = 8192
_QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_QWEN_SPECIAL_COUNT = 26  # ids 151,643..151,668 in Qwen3's tokenizer


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n")


def byte_level_bpe(vocab_size: int, specials: list[str]) -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` with exactly `vocab_size` ids: the 256 byte symbols, merges of
    two then three symbols (common characters first, so English pieces come out 2-3 bytes long), `specials` last."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    common = "ĠabcdefghijklmnopqrstuvwxyzetaoinshrdluABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,'-!?:;()"
    order = list(dict.fromkeys([c for c in common if c in alphabet] + sorted(alphabet)))
    vocab: dict[str, int] = {c: i for i, c in enumerate(order)}
    merges: list[tuple[str, str]] = []
    target = vocab_size - len(specials)
    pairs = [(a, b) for a in order for b in order]
    for a, b in pairs:
        if len(vocab) >= target:
            break
        vocab[a + b] = len(vocab)
        merges.append((a, b))
    for a, b in pairs:
        for c in order:
            if len(vocab) >= target:
                break
            if a + b + c not in vocab:
                vocab[a + b + c] = len(vocab)
                merges.append((a + b, c))
        if len(vocab) >= target:
            break
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    if tok.get_vocab_size() != vocab_size:
        raise AssertionError(f"tokenizer of {tok.get_vocab_size()} ids, wanted {vocab_size}")
    return tok


def qwen3_tokenizer(vocab_size: int, model_max_length: int) -> Any:
    """Qwen3-Embedding's tokenizer shape: byte-level BPE, <|endoftext|> appended, padded on the left."""
    import transformers
    from tokenizers import processors

    n_special = min(_QWEN_SPECIAL_COUNT, vocab_size // 2)
    specials = _QWEN_SPECIALS + [f"<|extra_{i}|>" for i in range(n_special - len(_QWEN_SPECIALS))]
    tok = byte_level_bpe(vocab_size, specials)
    eos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", pair="$A <|endoftext|> $B:1 <|endoftext|>:1", special_tokens=[("<|endoftext|>", eos)]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        model_max_length=model_max_length,
        pad_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        padding_side="left",
    ), eos


def qwen3_embedder(out: Path, seed: int = 0, max_seq_length: int = QWEN3_MAX_SEQ, **overrides: Any) -> Path:
    """A Qwen3-Embedding-shaped sentence-transformers directory in `out`: QWEN3_06B with `overrides` (a tiny one
    for tests: hidden_size, num_hidden_layers, heads...), random weights (seeded), float32."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    config_values = {**QWEN3_06B, **overrides}
    tokenizer, eos = qwen3_tokenizer(int(config_values["vocab_size"]), max_seq_length)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        config_values[key] = eos
    config = transformers.Qwen3Config(**config_values)
    out.mkdir(parents=True)
    torch.manual_seed(seed)
    model = transformers.Qwen3Model(config).eval()
    model.save_pretrained(str(out), safe_serialization=True)
    del model
    tokenizer.save_pretrained(str(out))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    _write_json(out / "modules.json", modules)
    pooling = {
        "word_embedding_dimension": int(config_values["hidden_size"]),
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": True,
        "include_prompt": True,
    }
    _write_json(out / "1_Pooling" / "config.json", pooling)
    _write_json(out / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})
    _write_json(
        out / "config_sentence_transformers.json",
        {"prompts": QWEN3_PROMPTS, "default_prompt_name": None, "similarity_fn_name": "cosine"},
    )
    return out


# Qwen3-0.6B (the chat model)'s config.json where it differs from the embedder's, and its generation_config.json.
QWEN3_CHAT_06B: dict[str, Any] = {
    **QWEN3_06B,
    "vocab_size": 151_936,
    "max_position_embeddings": 40_960,
    "bos_token_id": 151_643,
    "eos_token_id": 151_645,
    "pad_token_id": None,
}
# Qwen3-1.7B's config.json where it differs from the 0.6B chat model (hidden 2048, intermediate 6144; 28 layers,
# 16/8 heads of 128 as the 0.6B): 1.72B parameters, 6.9 GB of float32.
QWEN3_CHAT_17B: dict[str, Any] = {**QWEN3_CHAT_06B, "hidden_size": 2048, "intermediate_size": 6144}
QWEN3_CHAT_GENERATION = {
    "bos_token_id": 151_643,
    "eos_token_id": [151_645, 151_643],
    "pad_token_id": 151_643,
    "do_sample": True,
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 20,
}
QWEN3_CHAT_TOKENS = 151_669  # the tokenizer's ids (the embedding table is padded to vocab_size)
CHATML_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}"
)


def qwen3_chat(out: Path, seed: int = 0, **overrides: Any) -> Path:
    """A Qwen3-0.6B-shaped chat-model directory in `out`: QWEN3_CHAT_06B with `overrides` (a tiny one for tests),
    random weights (seeded), float32; its tokenizer a byte-level BPE of the real id count, the special tokens at
    Qwen3's ids (<|endoftext|> 151,643, <|im_start|>, <|im_end|> after it)."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    values = {**QWEN3_CHAT_06B, **overrides}
    vocab = int(values["vocab_size"])
    tokens = min(QWEN3_CHAT_TOKENS, vocab)
    n_special = min(_QWEN_SPECIAL_COUNT, tokens // 2)
    specials = _QWEN_SPECIALS + [f"<|extra_{i}|>" for i in range(n_special - len(_QWEN_SPECIALS))]
    raw = byte_level_bpe(tokens, specials)
    ids = {name: raw.token_to_id(name) for name in _QWEN_SPECIALS}
    values.update(bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"])
    config = transformers.Qwen3Config(**values)
    out.mkdir(parents=True)
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(config).eval()
    model.generation_config = transformers.GenerationConfig(
        **{
            **QWEN3_CHAT_GENERATION,
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
            "pad_token_id": ids["<|endoftext|>"],
        }
    )
    model.save_pretrained(str(out), safe_serialization=True)
    del model
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw,
        model_max_length=int(values["max_position_embeddings"]),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(str(out))
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = CHATML_TEMPLATE  # in the file, as the hub's Qwen3 ships it
    _write_json(out / "tokenizer_config.json", tok_config)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    return out


def bert_base(out: Path) -> Path:
    """A sentence-transformers directory around a random BERT-base (config.json, model.safetensors,
    tokenizer.json, modules.json, 1_Pooling, sentence_bert_config.json)."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    out.mkdir(parents=True)
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(**BASE)).eval()
    model.save_pretrained(str(out), safe_serialization=True)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = [*letters, *(f"##{c}" for c in letters)]
    vocab = [*SPECIALS, *words]
    vocab += [f"w{i}" for i in range(BASE["vocab_size"] - len(vocab))]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "vocab.txt").write_text("\n".join(vocab) + "\n")
        tokenizer = transformers.BertTokenizerFast(vocab_file=str(Path(tmp) / "vocab.txt"), do_lower_case=True)
        tokenizer.model_max_length = BASE["max_position_embeddings"]
        tokenizer.save_pretrained(str(out))
    for name in ("vocab.txt", "special_tokens_map.json"):
        (out / name).unlink(missing_ok=True)  # tokenizer.json is what is read
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": BASE["hidden_size"], "pooling_mode_mean_tokens": True}
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_SEQ, "do_lower_case": False}))
    return out


build_model_dir = bert_base  # the name pack/quantize.py and older notes use


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "qwen3-embedding-0.6b": qwen3_embedder,
    "qwen3-0.6b": qwen3_chat,
    "qwen3-1.7b": lambda out: qwen3_chat(out, **QWEN3_CHAT_17B),
    "bert-base": bert_base,
}


def cached(name: str, cache: Path = CACHE) -> Path:
    """build/bench-models/NAME, built on first use (BUILDERS[name]); a half-built one is rebuilt."""
    if name not in BUILDERS:
        raise SystemExit(f"model {name!r}; valid: {', '.join(BUILDERS)}")
    out = cache / name
    if (out / ".done").is_file():
        return out
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    BUILDERS[name](out)
    (out / ".done").write_text("built\n")
    return out


if __name__ == "__main__":
    import sys
    import time

    for name in sys.argv[1:] or list(BUILDERS):
        started = time.perf_counter()
        print(cached(name), f"{time.perf_counter() - started:.1f} s")
