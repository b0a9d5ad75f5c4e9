"""Tiny random causal language models (chat models) as Hugging Face directories, built inside the tests.

`make_lm_dir(tmp_path, family, **options)` writes what a hub repository of a chat model holds: `config.json`,
`model.safetensors`, `generation_config.json`, `tokenizer.json` + `tokenizer_config.json` (with the family's chat
template, written the way the family's real template is: ChatML with Qwen3's `enable_thinking` for qwen2/qwen3,
Llama 3's header tokens, Gemma's turns, Phi-3's role tags, Mistral's `[INST]`) and `special_tokens_map.json`.

- families: qwen3, qwen2, llama, gemma3_text, phi3, mistral (SmolLM is llama-shaped: `family="llama"`);
- random weights from the transformers config classes (hidden 64, 2 layers, 4 heads / 2 KV heads, a fixed seed),
  scaled (`scale`, default 8) so greedy decoding does not settle on one token;
- a byte-level BPE tokenizer trained on a small corpus, so any text tokenizes and decodes back;
- options: seed, scale, name, sliding_window (mistral / qwen2 / gemma3_text: a window shorter than the test
  prompts), chat_template_file (True: the template in `chat_template.jinja` as transformers 4.43+ saves it),
  max_position_embeddings, vocab (corpus size cap), tie (tie_word_embeddings).

Heavy imports (torch, transformers, tokenizers) happen inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LM_FAMILIES = ("qwen3", "qwen2", "llama", "gemma3_text", "phi3", "mistral")
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, POSITIONS = 64, 2, 4, 2, 16, 128, 512

_TEXT = (
    "hello world the quick brown fox jumps over the lazy dog . what is the capital of france ? paris is the "
    "capital of france . write a short poem about the sea . the sea is blue and deep and wide . json { } [ ] "
    ': , " name age city true false null 0 1 2 3 4 5 6 7 8 9 yes no please thank you assistant user system '
    "think answer question reason step by step machine learning model token stream function lambda cloud "
    "ünïcödé 日本語 テキスト emoji 🙂 tabs\tand\nnewlines"
)

# Each family's special tokens (the first is its eos unless `_EOS` says otherwise) and its chat template.
_SPECIALS = {
    "qwen3": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"],
    "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "llama": [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
    ],
    "gemma3_text": ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
    "phi3": ["<unk>", "<s>", "</s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
    "mistral": ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"],
}
# (bos, eos tokens the generation config stops at, pad)
_IDS = {
    "qwen3": (None, ["<|im_end|>", "<|endoftext|>"], "<|endoftext|>"),
    "qwen2": (None, ["<|im_end|>", "<|endoftext|>"], "<|endoftext|>"),
    "llama": ("<|begin_of_text|>", ["<|eot_id|>", "<|end_of_text|>"], "<|end_of_text|>"),
    "gemma3_text": ("<bos>", ["<eos>", "<end_of_turn>"], "<pad>"),
    "phi3": ("<s>", ["<|end|>", "<|endoftext|>"], "<|endoftext|>"),
    "mistral": ("<s>", ["</s>"], "</s>"),
}

QWEN3_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}{{- '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'user' %}{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set content = message.content %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
QWEN2_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if not date_string is defined %}{%- set date_string = strftime_now('%d %b %Y') %}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
    "'<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set first_user_prefix = '' %}"
    "{%- set loop_messages = messages %}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') + message['content'] | trim "
    "+ '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{%- endif %}"
)
PHI3_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + '\\n' + message['content'] + '<|end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
)
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)
TEMPLATES = {
    "qwen3": QWEN3_TEMPLATE,
    "qwen2": QWEN2_TEMPLATE,
    "llama": LLAMA_TEMPLATE,
    "gemma3_text": GEMMA_TEMPLATE,
    "phi3": PHI3_TEMPLATE,
    "mistral": MISTRAL_TEMPLATE,
}


def build_lm_tokenizer(family: str, vocab: int = 400) -> Any:
    """A byte-level BPE tokenizer with the family's special tokens first (ids 0..), trained on `_TEXT`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = _SPECIALS[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_TEXT] * 4, trainer=trainer)
    bos = _IDS[family][0]
    if bos is not None:
        from tokenizers import processors

        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    return tok


def _config(family: str, vocab_size: int, ids: dict[str, Any], **extra: Any) -> Any:
    import transformers

    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": extra.pop("max_position_embeddings", POSITIONS),
        "tie_word_embeddings": extra.pop("tie", family in ("qwen3", "gemma3_text")),
        **ids,
    }
    window = extra.pop("sliding_window", None)
    if family == "qwen3":
        return transformers.Qwen3Config(head_dim=HEAD_DIM, **common, **extra)
    if family == "qwen2":
        if window is not None:
            extra.update(use_sliding_window=True, sliding_window=window, max_window_layers=0)
        return transformers.Qwen2Config(**common, **extra)
    if family == "llama":
        return transformers.LlamaConfig(head_dim=HEAD_DIM, **common, **extra)
    if family == "gemma3_text":
        if window is not None:
            extra.update(sliding_window=window)
        return transformers.Gemma3TextConfig(
            head_dim=HEAD_DIM, query_pre_attn_scalar=HEAD_DIM, layer_types=None, **common, **extra
        )
    if family == "phi3":
        common.pop("num_key_value_heads")
        return transformers.Phi3Config(num_key_value_heads=KV_HEADS, **common, **extra)
    if family == "mistral":
        return transformers.MistralConfig(head_dim=HEAD_DIM, sliding_window=window, **common, **extra)
    raise ValueError(f"family {family!r}; valid: {', '.join(LM_FAMILIES)}")


def make_lm_dir(tmp_path: Path, family: str, **options: Any) -> Path:
    """A hub-style directory of a tiny random chat model of `family` (see the module docstring)."""
    import torch
    import transformers

    seed = options.pop("seed", 0)
    scale = options.pop("scale", 8.0)
    name = options.pop("name", f"{family}-lm")
    template_file = options.pop("chat_template_file", False)
    vocab = options.pop("vocab", 400)
    out = Path(tmp_path) / name
    out.mkdir(parents=True)

    raw_tok = build_lm_tokenizer(family, vocab)
    bos, eos_list, pad = _IDS[family]
    tid = raw_tok.token_to_id
    ids: dict[str, Any] = {
        "bos_token_id": tid(bos) if bos else None,
        "eos_token_id": tid(eos_list[-1]) if family != "mistral" else tid("</s>"),
        "pad_token_id": tid(pad),
    }
    torch.manual_seed(seed)
    config = _config(family, raw_tok.get_vocab_size(), ids, **options)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(scale)
    model.eval()
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=ids["bos_token_id"],
        eos_token_id=[tid(t) for t in eos_list] if len(eos_list) > 1 else tid(eos_list[0]),
        pad_token_id=ids["pad_token_id"],
        do_sample=True,
        temperature=0.7,
        top_p=0.8,
        top_k=20,
    )
    model.save_pretrained(out)

    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw_tok,
        bos_token=bos,
        eos_token=eos_list[0],
        pad_token=pad,
        unk_token="<unk>" if "<unk>" in _SPECIALS[family] else None,
        model_max_length=config.max_position_embeddings,
        additional_special_tokens=[t for t in _SPECIALS[family] if t not in (bos, eos_list[0], pad, "<unk>")],
    )
    fast.chat_template = TEMPLATES[family]
    fast.save_pretrained(out)
    cfg_path = out / "tokenizer_config.json"
    tok_config = json.loads(cfg_path.read_text())
    template = tok_config.pop("chat_template", None) or TEMPLATES[family]
    if template_file:
        (out / "chat_template.jinja").write_text(template)
        tok_config.pop("chat_template", None)
    else:
        tok_config["chat_template"] = template
        (out / "chat_template.jinja").unlink(missing_ok=True)
    cfg_path.write_text(json.dumps(tok_config, indent=2))
    return out
