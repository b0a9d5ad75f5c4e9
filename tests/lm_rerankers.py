"""Tiny random decoder rerankers (Qwen3-Reranker style), saved by sentence-transformers' own
`CrossEncoder.save_pretrained`: a Qwen3ForCausalLM whose tokenizer has "yes" and "no" tokens (LogitScore's
defaults), Qwen3-Reranker's prompt as a chat template over the query/document roles, and prompts with a default.

`make_gemma_family_reranker_dir(root, family)`: bge-reranker-v2-gemma's layout (FlagEmbedding's prompt, a
"Yes"-only LogitScore) on a tiny GemmaForCausalLM or Gemma2ForCausalLM.

`make_reranker_dir(root, **sizes)`: the test shape by default (hidden 64, 2 layers); the benchmark passes a
realistic one (bench/coldstart/lm_rerank.py). Heavy imports happen inside the function.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TEMPLATE = (
    "{%- set system = messages | selectattr('role', 'eq', 'system') | map(attribute='content') | first -%}"
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    "<Instruct>: {{ system or 'Given a web search query, retrieve relevant passages that answer the query' }}\n"
    "<Query>: {{ messages | selectattr('role', 'eq', 'query') | map(attribute='content') | first }}\n"
    "<Document>: {{ messages | selectattr('role', 'eq', 'document') | map(attribute='content') | first }}"
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
PROMPTS = {"web": "Given a web search query, retrieve relevant passages", "code": "Find the code"}
# bge-reranker-v2-gemma's prompt over Gemma's BOS (rendered by the template; the tokenizer adds one too).
GEMMA_TEMPLATE = (
    "{{ bos_token }}A: {{ messages | selectattr('role', 'eq', 'query') | map(attribute='content') | first }}\n"
    "B: {{ messages | selectattr('role', 'eq', 'document') | map(attribute='content') | first }}\n"
    "Predict whether passage B contains an answer to query A. Answer 'Yes' or 'No'."
)


# bge-reranker-v2-gemma's own prompt (FlagEmbedding's LayerWiseFlagLLMReranker / FlagLLMReranker default), after
# "A: {query}\nB: {passage}\n"; its score is the "Yes" logit at the last position.
BGE_GEMMA_PROMPT = (
    "Given a query A and a passage B, determine whether the passage contains an answer to the query by providing a "
    "prediction of either 'Yes' or 'No'."
)
BGE_GEMMA_TEMPLATE = (
    "{{ bos_token }}A: {{ messages | selectattr('role', 'eq', 'query') | map(attribute='content') | first }}\n"
    "B: {{ messages | selectattr('role', 'eq', 'document') | map(attribute='content') | first }}\n" + BGE_GEMMA_PROMPT
)
# The tiny Gemma / Gemma 2 rerankers' sizes: a head_dim other than hidden / heads (Gemma 7B's 256 over 3072 / 16),
# one key/value head (bge-reranker-v2-gemma's multi-query attention), a sliding window shorter than the probes.
GEMMA_SIZES: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 24,
    "max_position_embeddings": 512,
}
GEMMA2_CAPS = {"attn_logit_softcapping": 1.0, "final_logit_softcapping": 0.5}  # small: both bend the tiny logits


def make_reranker_dir(root: Path, scale: float = 8.0, vocab_rows: int | None = None, **sizes: Any) -> Path:
    """`root`/reranker: the CrossEncoder directory (`root`/base: the plain causal LM it was made from).
    `sizes`: Qwen3Config fields over tests/lm_models.py's (hidden_size, num_hidden_layers, ...); `vocab_rows`: an
    embedding table larger than the tokenizer (a real model's size; the rows past the tokenizer are never read)."""
    import torch
    import transformers
    from sentence_transformers import CrossEncoder

    from tests import lm_models

    base, out = Path(root) / "base", Path(root) / "reranker"
    raw = lm_models.build_lm_tokenizer("qwen3")
    raw.add_tokens(["yes", "no"])  # LogitScore's default true/false tokens
    eos = raw.token_to_id("<|endoftext|>")
    torch.manual_seed(0)
    ids = {"bos_token_id": None, "eos_token_id": eos, "pad_token_id": eos}
    config = lm_models._config("qwen3", vocab_rows or raw.get_vocab_size(), ids)
    if sizes:  # rebuilt, not set after the fact: layer_types follows num_hidden_layers at construction
        fields = {k: v for k, v in config.to_dict().items() if k not in ("layer_types", "model_type")}
        config = transformers.Qwen3Config(**{**fields, **sizes})
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(scale)  # scores that differ between pairs
    model.save_pretrained(base)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=512,
        additional_special_tokens=["<|im_start|>", "<|im_end|>", "<think>", "</think>"],
    )
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(base)
    CrossEncoder(str(base), prompts=PROMPTS, default_prompt_name="web").save_pretrained(str(out))
    return out


def make_gemma_reranker_dir(root: Path, scale: float = 4.0, softcap: float | None = 0.5) -> Path:
    """`root`/gemma-reranker: bge-reranker-v2-gemma's shape on a tiny random Gemma3ForCausalLM: a tokenizer that
    adds BOS, a LogitScore with only a true token ("Yes": the score is its logit), final logit soft-capping."""
    import torch
    import transformers
    from sentence_transformers import CrossEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.cross_encoder.modules.logit_score import LogitScore

    from tests import lm_models

    base, out = Path(root) / "gemma-base", Path(root) / "gemma-reranker"
    raw = lm_models.build_lm_tokenizer("gemma3_text")  # its post-processor adds <bos>
    raw.add_tokens(["Yes"])
    tid = raw.token_to_id
    torch.manual_seed(0)
    ids = {"bos_token_id": tid("<bos>"), "eos_token_id": tid("<eos>"), "pad_token_id": tid("<pad>")}
    config = lm_models._config("gemma3_text", raw.get_vocab_size(), ids, final_logit_softcapping=softcap)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(scale)  # scores that differ between pairs
    model.save_pretrained(base)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", model_max_length=512
    )
    tokenizer.chat_template = GEMMA_TEMPLATE
    tokenizer.save_pretrained(base)
    transformer = Transformer(str(base), transformer_task="text-generation")
    CrossEncoder(modules=[transformer, LogitScore(true_token_id=tid("Yes"))]).save_pretrained(str(out))
    return out


def make_gemma_family_reranker_dir(root: Path, family: str = "gemma", scale: float = 4.0, **extra: Any) -> Path:
    """`root`/`family`-reranker: bge-reranker-v2-gemma's layout on a tiny random `GemmaForCausalLM` (family "gemma",
    its real class, with its config's legacy `hidden_act: "gelu"`) or `Gemma2ForCausalLM` ("gemma2": attention
    and final logit soft-capping, sliding-window layers between full ones, `query_pre_attn_scalar` other than
    head_dim), saved by `CrossEncoder.save_pretrained`: the template renders `<bos>A: {query}\nB: {passage}\n` and
    FlagEmbedding's prompt, the tokenizer adds a BOS too, the LogitScore has only the true token "Yes".
    `extra`: config fields over GEMMA_SIZES (and GEMMA2_CAPS)."""
    import torch
    import transformers
    from sentence_transformers import CrossEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.cross_encoder.modules.logit_score import LogitScore

    from tests import lm_models

    base, out = Path(root) / f"{family}-base", Path(root) / f"{family}-reranker"
    raw = lm_models.build_lm_tokenizer("gemma3_text")  # Gemma's special tokens; its post-processor adds <bos>
    raw.add_tokens(["Yes", "No"])
    tid = raw.token_to_id
    ids = {"bos_token_id": tid("<bos>"), "eos_token_id": tid("<eos>"), "pad_token_id": tid("<pad>")}
    fields: dict[str, Any] = {"vocab_size": raw.get_vocab_size(), **ids, **GEMMA_SIZES}
    if family == "gemma":
        config: Any = transformers.GemmaConfig(**{**fields, **extra})
    elif family == "gemma2":
        config = transformers.Gemma2Config(
            **{**fields, **GEMMA2_CAPS, "query_pre_attn_scalar": 16, "sliding_window": 8, **extra}
        )
    else:
        raise ValueError(f"family {family!r}; valid: gemma, gemma2")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(scale)  # scores that differ between pairs
            else:
                p.normal_(0.0, 0.5)  # the norms' (1 + weight) away from 1 (transformers starts them at 0)
    model.save_pretrained(base)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", model_max_length=512
    )
    tokenizer.chat_template = BGE_GEMMA_TEMPLATE
    tokenizer.save_pretrained(base)
    transformer = Transformer(str(base), transformer_task="text-generation")
    CrossEncoder(modules=[transformer, LogitScore(true_token_id=tid("Yes"))]).save_pretrained(str(out))
    if family == "gemma":  # bge-reranker-v2-gemma's config.json says the legacy "gelu" (transformers reads tanh GELU)
        path = out / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "hidden_act": "gelu"}, indent=2))
    return out
