"""Decoder rerankers (Qwen3-Reranker, mxbai-rerank-v2, bge-reranker-v2-gemma, Gemma 2 and 3): a sentence-transformers
`CrossEncoder` over a `*ForCausalLM` whose `LogitScore` module scores a (query, document) pair by the "yes" logit
minus the "no" logit (or the true token's logit alone, soft-capped where the model caps its logits) at the last
real position of the chat template's rendering of the pair.

The graph keeps only what that score needs: the decoder body, the hidden state at each row's last real token
(right padding: `attention_mask.sum - 1`; rotary positions are relative, so the left padding
sentence-transformers uses gives the same scores) and the two rows of the LM head (2 x hidden instead of
vocab x hidden: Qwen3's 151,936-row head is most of a short pair's work), then the cross-encoder's activation.

The chat template is rendered here, at pack time, with marker strings, and proved literal: the rendering of any
pair is `prefix + query + middle + document + suffix` (checked on several pairs, token for token against
transformers' `apply_chat_template`). Those three strings go in the manifest, so the function formats a pair
with string concatenation (no Jinja on its import chain). `suffix_ids`: the tokens sentence-transformers writes
back over the end of a truncated row (its `_restore_chat_template_suffix`), so the last position is still the
template's, not the document's. A BOS both the template renders and the tokenizer adds (Gemma) is left out of
`prefix`, so a row holds it once, as `apply_chat_template` (no special tokens of its own) gives it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infra.pack.hf_checks import SourceError, is_int

LOGIT_SCORE_TYPE = "sentence_transformers.cross_encoder.modules.logit_score.LogitScore"
FAMILIES = ("qwen2", "qwen3", "gemma3_text", "gemma", "gemma2")
# Families whose *ForCausalLM soft-caps its logits (`tanh(logits / cap) * cap`, elementwise: the two kept rows'
# logits capped are the full head's, capped); the others ignore the field, so it is refused there as a surprise.
SOFTCAP_FAMILIES = ("gemma3_text", "gemma2")
# Families whose export builds no bidirectional mask (their config does not halve the window as Gemma 3's does):
# a reranker scoring the last position of a causal LM never sets it, so it is refused rather than assumed.
CAUSAL_ONLY_FAMILIES = ("gemma", "gemma2")
_MARKS = ("\x00QUERY\x00", "\x00DOCUMENT\x00")
_INSTRUCTION = "\x00INSTRUCTION\x00"
# Instructions the literal proof of the per-request slot renders (a request's replaces the default prompt).
_INSTRUCTIONS = ("Find the code", " <b>a</b> {{ x }}\n")
# Pairs the literal-template proof renders (an empty text, markup the template might escape, spaces at the ends).
_PROBES = (("what is a cold start?", "the first request of a new instance"), ("", "x"), (" <b>a</b> ", "{{ x }}\n"))


class LMRerankError(SourceError):
    """A decoder reranker warmstart cannot serve as packed (one line: what, and what is supported)."""


def logit_score_ids(root: Path, path: str, vocab_size: int) -> tuple[int, int | None]:
    """LogitScore's (true_token_id, false_token_id) from its folder's config.json, checked against the vocab."""
    where = root / path / "config.json"
    try:
        config = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise LMRerankError(f"{where}: unreadable LogitScore config ({e})") from None
    if not isinstance(config, dict):
        raise LMRerankError(f"{where}: expected a JSON object")
    true_id, false_id = config.get("true_token_id"), config.get("false_token_id")
    name = config.get("module_input_name", "causal_logits")
    if name != "causal_logits":
        raise LMRerankError(f"{where}: module_input_name {name!r}; supported: causal_logits (the LM's logits)")
    for key, value in (("true_token_id", true_id), ("false_token_id", false_id)):
        if value is None and key == "false_token_id":
            continue
        if not is_int(value) or not 0 <= value < vocab_size:
            raise LMRerankError(f"{where}: {key} {value!r}; expected a token id in 0..{vocab_size - 1}")
    assert true_id is not None  # checked above
    return int(true_id), None if false_id is None else int(false_id)


def check_reranker(
    root: Path, kinds: list[tuple[str, str]], family: str, architecture: str, config: dict[str, Any]
) -> tuple[int, int | None]:
    """Refusals for what is not served (one line each); the LogitScore token ids."""
    order = [k for k, _ in kinds]
    if order != ["Transformer", "LogitScore"]:
        raise LMRerankError(
            f"{root / 'modules.json'}: modules {' -> '.join(order)}; supported decoder reranker: Transformer -> "
            "LogitScore"
        )
    if family not in FAMILIES:
        raise LMRerankError(
            f"{root}: a {family} decoder reranker is not supported; supported families: {', '.join(FAMILIES)}"
        )
    if not architecture.endswith("ForCausalLM"):
        raise LMRerankError(f"{root}: LogitScore needs a *ForCausalLM, this one is {architecture}")
    if config.get("final_logit_softcapping") and family not in SOFTCAP_FAMILIES:
        raise LMRerankError(
            f"{root}: final_logit_softcapping is not supported for a {family} decoder reranker; supported for: "
            f"{', '.join(SOFTCAP_FAMILIES)}"
        )
    if config.get("use_bidirectional_attention") and family in CAUSAL_ONLY_FAMILIES:
        raise LMRerankError(
            f"{root}: use_bidirectional_attention is not supported for a {family} decoder reranker (its causal LM "
            "scores the last position); supported: causal attention"
        )
    return logit_score_ids(root, kinds[1][1], int(config["vocab_size"]))


def _prompt(st_meta: dict[str, Any]) -> str | None:
    """The prompt `CrossEncoder.predict` applies by default (a system message), None for none."""
    name = st_meta.get("default_prompt_name")
    if name is None:
        return None
    prompts = st_meta.get("prompts") or {}
    if not isinstance(prompts, dict) or not isinstance(prompts.get(name), str):
        raise LMRerankError(f"config_sentence_transformers.json: default_prompt_name {name!r} is not in prompts")
    return str(prompts[name]) or None


def _messages(prompt: str | None, query: str, document: str) -> list[dict[str, str]]:
    pair = [{"role": "query", "content": query}, {"role": "document", "content": document}]
    return ([{"role": "system", "content": prompt}] if prompt else []) + pair


def _object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise LMRerankError(f"{path}: unreadable ({e})") from None
    return value if isinstance(value, dict) else {}


def pair_template(root: Path, model_root: Path, tokenizer: Any) -> dict[str, Any]:
    """The manifest's `pair_template`: prefix, middle, suffix, suffix_ids (see the module docstring)."""
    st_meta = _object(root / "config_sentence_transformers.json")
    st_config = _object(model_root / "sentence_bert_config.json")
    kwargs = st_config.get("processing_kwargs") or {}
    if set(kwargs) - {"chat_template"}:
        raise LMRerankError(
            f"{root}: processing_kwargs {sorted(set(kwargs) - {'chat_template'})} are not supported for a decoder "
            "reranker; supported: chat_template"
        )
    template_kwargs = dict(kwargs.get("chat_template") or {})
    template_kwargs.pop("restore_suffix", None)
    if not getattr(tokenizer, "chat_template", None):
        raise LMRerankError(f"{root}: no chat template (the pair's prompt); add chat_template.jinja")
    prompt = _prompt(st_meta)

    def render(query: str, document: str, tokenize: bool = False) -> Any:
        try:
            return tokenizer.apply_chat_template(
                _messages(prompt, query, document), tokenize=tokenize, **template_kwargs
            )
        except Exception as e:  # a template that raises on these roles
            raise LMRerankError(f"{root}: the chat template does not render a query/document pair ({e})") from None

    text = render(*_MARKS)
    if text.count(_MARKS[0]) != 1 or text.count(_MARKS[1]) != 1 or text.index(_MARKS[0]) > text.index(_MARKS[1]):
        raise LMRerankError(f"{root}: the chat template does not render the query, then the document, once each")
    prefix, rest = text.split(_MARKS[0])
    middle, suffix = rest.split(_MARKS[1])
    lead = _added_bos(tokenizer, prefix)
    for query, document in _PROBES:
        want = render(query, document)
        if want != prefix + query + middle + document + suffix:
            raise LMRerankError(f"{root}: the chat template changes the pair's text (not a literal template)")
        ids = tokenizer(want[len(lead) :], add_special_tokens=True)["input_ids"]
        if list(ids) != list(_ids(render(query, document, tokenize=True))):
            raise LMRerankError(f"{root}: the tokenizer adds tokens the chat template does not (e.g. a BOS)")
    first = list(_ids(render(*_PROBES[0], tokenize=True)))
    other = list(_ids(render("a different query", "another document entirely", tokenize=True)))
    common = 0
    while common < min(len(first), len(other)) and first[-1 - common] == other[-1 - common]:
        common += 1
    suffix_ids = first[len(first) - common :]
    out = {"prefix": prefix[len(lead) :], "middle": middle, "suffix": suffix, "suffix_ids": suffix_ids}
    slot = _instruction_slot(lambda p: _render_text(tokenizer, template_kwargs, p), middle, suffix)
    if slot is not None:  # a template without one (no system message rendered): requests can't send one
        out["instruction"] = {"head": slot[0][len(lead) :], "tail": slot[1]}
    return out


def _render_text(tokenizer: Any, template_kwargs: dict[str, Any], prompt: str) -> str | None:
    try:
        return str(tokenizer.apply_chat_template(_messages(prompt, *_MARKS), tokenize=False, **template_kwargs))
    except Exception:  # a template that refuses a system message: no per-request instruction
        return None


def _instruction_slot(render: Any, middle: str, suffix: str) -> tuple[str, str] | None:
    """The prefix around the instruction (the system message a request's `instruction` fills, as
    `CrossEncoder.predict(prompt=...)` renders it): (head, tail), proved literal on `_INSTRUCTIONS`; None when
    the template has no such slot."""
    text = render(_INSTRUCTION)
    if text is None or text.count(_INSTRUCTION) != 1 or text.count(_MARKS[0]) != 1:
        return None
    if text.index(_INSTRUCTION) > text.index(_MARKS[0]) or not text.endswith(_MARKS[1] + suffix):
        return None
    head, rest = text.split(_INSTRUCTION)
    tail = rest.split(_MARKS[0])[0]
    if rest != tail + _MARKS[0] + middle + _MARKS[1] + suffix:
        return None
    for instruction in _INSTRUCTIONS:
        if render(instruction) != head + instruction + tail + _MARKS[0] + middle + _MARKS[1] + suffix:
            return None
    return head, tail


def _added_bos(tokenizer: Any, prefix: str) -> str:
    """The BOS text the template renders at the start of `prefix` when the tokenizer adds that BOS itself (Gemma):
    the served text leaves it out, so the row holds it once, as `apply_chat_template` (no special tokens) does."""
    bos, bos_id = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "bos_token_id", None)
    if not bos or bos_id is None or not prefix.startswith(bos):
        return ""
    added = tokenizer("", add_special_tokens=True)["input_ids"]
    return bos if list(added[:1]) == [bos_id] else ""


def _ids(rendered: Any) -> list[int]:
    ids = rendered["input_ids"] if isinstance(rendered, dict) or hasattr(rendered, "keys") else rendered
    return [int(i) for i in ids]


def score_head(model: Any, ids: tuple[int, int | None], activation: str | None, family: str) -> Any:
    """A torch module over the *ForCausalLM `model`: (input_ids, attention_mask) -> scores [batch]."""
    import torch

    from infra.pack.families import NEW_FAMILIES, layer_type_masks

    true_id, false_id = ids
    config = model.config
    per_layer_type = NEW_FAMILIES[family].mask == "gemma3"  # Gemma 2/3 sliding windows: masks built traceably
    cap = getattr(config, "final_logit_softcapping", None) if family in SOFTCAP_FAMILIES else None
    weight = model.get_output_embeddings().weight.detach()
    rows = weight[[true_id] if false_id is None else [true_id, false_id]].t().contiguous()  # [hidden, 1 or 2]
    bias = getattr(model.get_output_embeddings(), "bias", None)

    class Score(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model.model  # torch_program reads `head.model` (its config, attention)
            self.rows = torch.nn.Parameter(rows, requires_grad=False)
            picked = None if bias is None else bias.detach()[[true_id] if false_id is None else [true_id, false_id]]
            self.bias = None if picked is None else torch.nn.Parameter(picked.clone(), requires_grad=False)

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            mask = layer_type_masks(config, attention_mask) if per_layer_type else attention_mask
            hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
            last = torch.clamp(attention_mask.to(torch.int64).sum(dim=1) - 1, min=0)  # right padding
            index = last.view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])
            state = torch.gather(hidden, 1, index).squeeze(1).float()
            logits = state @ self.rows.float()
            if self.bias is not None:
                logits = logits + self.bias.float()
            if cap:
                logits = torch.tanh(logits / cap) * cap
            scores = logits[:, 0] if false_id is None else logits[:, 0] - logits[:, 1]
            return torch.sigmoid(scores) if activation == "sigmoid" else scores

    return Score().eval()
