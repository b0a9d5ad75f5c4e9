"""Reading and checking a local Hugging Face causal-LM directory (`warmstart pack --from DIR`, task "generate").

Plain JSON and file checks, as infra.pack.hf_source does for encoders: nothing is written, nothing is fetched.
What the model builder cannot serve faithfully is refused here with one line naming what was found and what is
supported; the tensors against the architecture are checked by `check_tensors` (torch's meta device: no
weights are allocated).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.pack.families import NEW_FAMILIES
from infra.pack.hf_checks import SourceError, check_tokenizer_json, read_source_file, safetensors_shapes
from infra.pack.hf_source import MissingFileError, UnsupportedModelError, content_hash

# The causal-LM classes `pack --from` packs for task "generate" -> the manifest's family (config.json's
# model_type, which must agree). SmolLM is LlamaForCausalLM.
LM_ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2ForCausalLM": "qwen2",
    "LlamaForCausalLM": "llama",
    "Gemma3ForCausalLM": "gemma3_text",
    "Phi3ForCausalLM": "phi3",
    "MistralForCausalLM": "mistral",
}
# Causal LMs packed only as decoder rerankers (infra.pack.families: reranker_only): their refusal says how.
RERANKER_ONLY = tuple(f"{f.prefix}ForCausalLM" for f in NEW_FAMILIES.values() if f.reranker_only)
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
# Besides the weights, what the builder's transformers reads (config, tokenizer) and what the manifest records.
SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
)


@dataclass(frozen=True)
class LMSource:
    """A checked causal-LM directory."""

    root: Path
    config: dict[str, Any]
    family: str
    architecture: str
    weights: tuple[Path, ...]  # model.safetensors, or the shards an index names
    tokenizer_json: Path
    tokenizer_config: dict[str, Any]
    generation_config: dict[str, Any]
    chat_template: str | None
    content_sha256: str
    task: str = "generate"

    @property
    def context_length(self) -> int:
        return int(self.config["max_position_embeddings"])


def _json_object(path: Path, required: bool = True) -> dict[str, Any]:
    if not os.path.lexists(path):
        if required:
            raise MissingFileError(f"{path}: missing")
        return {}
    try:
        value = json.loads(read_source_file(path).decode("utf-8"))
    except SourceError:
        raise
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
        raise SourceError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise SourceError(f"{path}: expected a JSON object, found {type(value).__name__}")
    return value


def architecture_of(root: Path) -> str | None:
    """config.json's first architecture, None when there is no readable one (the encoder path then reports)."""
    try:
        config = _json_object(Path(root) / "config.json")
    except SourceError:
        return None
    names = config.get("architectures") or []
    return str(names[0]) if isinstance(names, list) and names else None


def is_causal_lm(root: Path) -> bool:
    """Whether `root` names a causal LM (`--task auto` packs it as "generate"): any *ForCausalLM class, so an
    unsupported one is refused by read_lm_source with the list, not by the encoder path's task guess. A
    sentence-transformers directory (modules.json: a decoder reranker's LogitScore, a decoder embedder) is the
    encoder path's to judge."""
    if os.path.lexists(Path(root) / "modules.json"):
        return False
    arch = architecture_of(root)
    return arch is not None and arch.endswith(("ForCausalLM", "LMHeadModel"))


def _check_no_custom_code(path: Path, config: dict[str, Any]) -> None:
    if config.get("auto_map"):
        raise UnsupportedModelError(
            f"{path}: auto_map names the model's own code, which warmstart never runs; pack a checkpoint with "
            f"native transformers support ({', '.join(LM_ARCHITECTURES)})"
        )
    if config.get("trust_remote_code"):
        raise UnsupportedModelError(f"{path}: trust_remote_code is set; warmstart never runs a model's own code")


def read_chat_template(root: Path, tokenizer_config: dict[str, Any]) -> str | None:
    """The chat template transformers applies: tokenizer_config.json's `chat_template` (a string, or a list of
    named templates: "default"), else chat_template.jinja, else chat_template.json's; None when there is none."""
    where = root / "tokenizer_config.json"
    raw = tokenizer_config.get("chat_template")
    if raw is None and os.path.lexists(root / "chat_template.jinja"):
        return read_source_file(root / "chat_template.jinja").decode("utf-8")
    if raw is None and os.path.lexists(root / "chat_template.json"):
        where = root / "chat_template.json"
        raw = _json_object(where).get("chat_template")
    if raw is None or isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return str(named["default"])
        raise SourceError(f"{where}: chat_template is a list without a 'default' template ({sorted(map(str, named))})")
    raise SourceError(f"{where}: chat_template is {type(raw).__name__}, not a string or a list of named templates")


def read_lm_source(root: Path) -> LMSource:
    """Read and check the causal-LM directory `root` (refusals before anything is written)."""
    root = Path(root)
    if not root.is_dir():
        raise MissingFileError(f"{root}: not a directory (pass a local model directory; nothing is downloaded)")
    config_path = root / "config.json"
    config = _json_object(config_path)
    _check_no_custom_code(config_path, config)
    names = config.get("architectures") or []
    architecture = str(names[0]) if isinstance(names, list) and names else "(none)"
    family = LM_ARCHITECTURES.get(architecture)
    if family is None and architecture in RERANKER_ONLY:  # bge-reranker-v2-gemma as the hub has it
        raise UnsupportedModelError(
            f"{config_path}: {architecture} packs as a decoder reranker only, from a sentence-transformers "
            "CrossEncoder directory (Transformer -> LogitScore, a chat template per pair: docs/own-model.md); "
            f"task generate supports: {', '.join(LM_ARCHITECTURES)}"
        )
    if family is None:
        raise UnsupportedModelError(
            f"{config_path}: architecture {architecture} is not a supported causal LM for task generate; "
            f"supported: {', '.join(LM_ARCHITECTURES)}"
        )
    if config.get("model_type") != family:
        raise UnsupportedModelError(
            f"{config_path}: model_type {config.get('model_type')!r} with architecture {architecture}; "
            f"{architecture} is model_type {family!r}"
        )
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings"):
        value = config.get(key)
        if type(value) is not int or value < 1:
            raise SourceError(f"{config_path}: {key} {value!r} is not a positive integer")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if family == "phi3" and isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) in ("longrope", "su"):
        raise UnsupportedModelError(
            f"{config_path}: phi3 with longrope scaling (Phi-3-*-128k, Phi-3.5) is not packed: the builder's switch "
            "between its short and long rope caches is not proved equal to transformers here; a 4k Phi-3 packs"
        )
    tokenizer_json = root / "tokenizer.json"
    if not os.path.lexists(tokenizer_json):
        raise MissingFileError(
            f"{tokenizer_json}: missing; task generate serves the model's fast tokenizer (tokenizer.json): save it "
            "with transformers' AutoTokenizer(...).save_pretrained"
        )
    vocab = config.get("vocab_size")
    check_tokenizer_json(tokenizer_json, vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None)
    tokenizer_config = _json_object(root / "tokenizer_config.json", required=False)
    _check_no_custom_code(root / "tokenizer_config.json", tokenizer_config)
    generation_config = _json_object(root / "generation_config.json", required=False)
    weights = _weights(root)
    hashed = [p for p in (root / n for n in SIDE_FILES) if p.is_file()] + list(weights)
    return LMSource(
        root=root,
        config=config,
        family=family,
        architecture=architecture,
        weights=weights,
        tokenizer_json=tokenizer_json,
        tokenizer_config=tokenizer_config,
        generation_config=generation_config,
        chat_template=read_chat_template(root, tokenizer_config),
        content_sha256=content_hash(root, hashed),
    )


def _weights(root: Path) -> tuple[Path, ...]:
    if os.path.lexists(root / WEIGHTS_FILE):
        return (root / WEIGHTS_FILE,)
    if os.path.lexists(root / WEIGHTS_INDEX):
        index = _json_object(root / WEIGHTS_INDEX)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise SourceError(f"{root / WEIGHTS_INDEX}: no weight_map")
        shards = sorted({str(v) for v in weight_map.values()})
        for shard in shards:
            if "/" in shard or shard.startswith(".") or not os.path.lexists(root / shard):
                raise MissingFileError(f"{root / WEIGHTS_INDEX}: shard {shard!r} is not a file in {root}")
        return tuple(root / s for s in shards)
    found = "pytorch_model.bin" if os.path.lexists(root / "pytorch_model.bin") else "no weights"
    raise MissingFileError(
        f"{root}: {WEIGHTS_FILE} (or {WEIGHTS_INDEX}) missing ({found}); task generate packs safetensors only "
        "(nothing of the user's is unpickled)"
    )


def checkpoint_shapes(source: LMSource) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for path in source.weights:
        shapes.update(safetensors_shapes(path))
    return shapes


def check_tensors(source: LMSource) -> None:
    """The checkpoint's tensors against the architecture transformers builds from config.json (on torch's meta
    device: no memory): a missing, extra or misshapen tensor is refused (from_pretrained would fill a missing one
    with random values, and the builder reads the weights through it)."""
    import torch  # pack time only
    import transformers

    from infra.pack.hf_checks import one_line

    config_path = source.root / "config.json"
    try:
        config = transformers.AutoConfig.from_pretrained(str(source.root), local_files_only=True)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    except Exception as e:  # transformers raises many types for a config it refuses
        raise SourceError(f"{config_path}: transformers refuses it ({one_line(e)})") from None
    want = {k: list(v.shape) for k, v in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        want.pop("lm_head.weight", None)
    have = checkpoint_shapes(source)
    if "lm_head.weight" not in want:  # tied: some checkpoints store the shared table twice; the embedding's is used
        have.pop("lm_head.weight", None)
    where = ", ".join(p.name for p in source.weights)
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    if missing:
        raise SourceError(f"{where}: missing tensors for {source.architecture}: {', '.join(missing[:5])}")
    if extra:
        raise SourceError(
            f"{where}: tensors {source.architecture} does not have: {', '.join(extra[:5])} (another architecture?)"
        )
    for name in sorted(want):
        if want[name] != have[name]:
            raise SourceError(
                f"{config_path}: {name} is {want[name]} for this config, but {where} holds {have[name]} "
                "(the config does not match the checkpoint)"
            )
