"""What `pack --from` knows of each family beyond BERT's five (electra, deberta-v2, modernbert, gte, nomic_bert,
qwen2, qwen3, gemma3_text; gemma and gemma2 as decoder rerankers only): the config.json `model_type`, the class
names, the tokenizer files, the checkpoint's tensor names and how the export builds the attention mask.

All export through one path (infra.pack.hf_export): transformers' stock class, the task head in the graph,
checked against the eager model at several shapes; the torch backend serves torch.export's program of the same
module (infra.pack.torch_program). Only `model_type`s transformers 5 implements natively are here; a model
whose code ships with it (auto_map) is refused by hf_source as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Family:
    name: str  # warmstart family (the manifest's `family`)
    prefix: str  # transformers class prefix: {prefix}Model, {prefix}ForSequenceClassification
    # The checkpoint's word embedding table, by name suffix (hf_checks.check_checkpoint).
    embedding_table: str = "embeddings.word_embeddings.weight"
    # Transformer layer index in tensor names (the layer count is the largest + 1).
    layer: re.Pattern[str] = re.compile(r"(?:^|.*\.)layers?\.(\d+)\..+")
    tokenizer_sources: tuple[str, ...] = ("tokenizer.json",)  # what a fast tokenizer is built from
    token_types: bool = False  # a sentence pair's segments are embedded (token_type_ids)
    # How the export passes the attention mask: "bert" (the additive 4D mask ORT's attention fusion knows, through
    # hf_export's attention function), "2d" (the 0/1 mask: the model builds its own, causal or local windows),
    # "gemma3" (a mask per layer type, built in the graph: transformers' bidirectional sliding window does not
    # trace; Gemma 2's causal sliding window takes the same masks).
    mask: str = "2d"
    fuse: bool = False  # try ORT's BERT fusions (they match only BERT-shaped graphs)
    decoder: bool = False  # causal attention: only last-token pooling sees the whole text
    # Packed only as a decoder reranker (a CrossEncoder with a LogitScore over its *ForCausalLM): the other tasks
    # have no test against their reference library for the family yet, so they are refused (hf_source).
    reranker_only: bool = False


_GPT_LAYER = re.compile(r"(?:^|.*\.)layers\.(\d+)\..+")

NEW_FAMILIES: dict[str, Family] = {
    "electra": Family("electra", "Electra", tokenizer_sources=("vocab.txt",), token_types=True, mask="bert", fuse=True),
    "deberta-v2": Family("deberta-v2", "DebertaV2", layer=re.compile(r"(?:^|.*\.)encoder\.layer\.(\d+)\..+")),
    "modernbert": Family("modernbert", "ModernBert", embedding_table="embeddings.tok_embeddings.weight"),
    "gte": Family("gte", "Gte"),
    "nomic_bert": Family("nomic_bert", "NomicBert"),
    "qwen2": Family("qwen2", "Qwen2", embedding_table="embed_tokens.weight", layer=_GPT_LAYER, decoder=True),
    "qwen3": Family("qwen3", "Qwen3", embedding_table="embed_tokens.weight", layer=_GPT_LAYER, decoder=True),
    "gemma3_text": Family(
        "gemma3_text", "Gemma3Text", embedding_table="embed_tokens.weight", layer=_GPT_LAYER, mask="gemma3"
    ),
    # bge-reranker-v2-gemma (GemmaForCausalLM): causal attention, the model builds its own mask.
    "gemma": Family(
        "gemma", "Gemma", embedding_table="embed_tokens.weight", layer=_GPT_LAYER, decoder=True, reranker_only=True
    ),
    # Gemma 2: sliding-window layers between full ones, a mask per layer type built in the graph as for Gemma 3
    # (transformers' own masks trace to a matching ONNX graph, but their torch program calls aten.gt, which the
    # run-time interpreter does not run: torch was dropped).
    "gemma2": Family(
        "gemma2", "Gemma2", embedding_table="embed_tokens.weight", layer=_GPT_LAYER, mask="gemma3", reranker_only=True
    ),
}

# model_types transformers has no class for: the model's own code, never run (what to use instead).
CUSTOM_ONLY = {
    "new": "Alibaba-NLP's gte 'new' architecture is custom code (auto_map) in transformers 5; transformers' own "
    "class is model_type 'gte' (the alibaba-nlp-community/gte-* conversions)",
}


def layer_type_masks(config: Any, attention_mask: Any) -> dict[str, Any]:
    """Gemma 3's (and Gemma 2's) additive 4D masks per layer type, the same as transformers'
    (`create_causal_mask` / `create_sliding_window_causal_mask`), written with traceable broadcasting. Bidirectional
    (`use_bidirectional_attention`, EmbeddingGemma): full layers see every real token, sliding layers the real
    tokens closer than `sliding_window` (which the config already halved); else causal, sliding layers the
    last `sliding_window` tokens."""
    import torch

    keep = attention_mask.to(torch.bool)[:, None, None, :]  # [batch, 1, 1, kv]
    length = attention_mask.shape[1]
    positions = torch.arange(length, device=attention_mask.device)
    offset = positions[:, None] - positions[None, :]  # q - kv
    window = int(config.sliding_window)
    if getattr(config, "use_bidirectional_attention", False):
        seen = torch.ones_like(offset, dtype=torch.bool)
        near = offset.abs() < window
    else:
        seen = offset >= 0
        near = seen & (offset < window)
    keep_full = keep & seen[None, None]
    low = torch.finfo(torch.float32).min
    zero = torch.zeros((), dtype=torch.float32)
    full = torch.where(keep_full, zero, low)
    sliding = torch.where(keep & near[None, None], zero, low)
    return {"full_attention": full, "sliding_attention": sliding}
