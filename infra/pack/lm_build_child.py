"""Run onnxruntime-genai's model builder on a staged Hugging Face causal-LM directory, in a child process of
`warmstart pack` (infra.pack.lm_pack): `python lm_build_child.py '{"input": ..., "output": ..., "precision": ...,
"cache": ..., "extra": {...}}'`.

The builder reads the model's config through transformers' AutoConfig, and transformers 5 rewrites some keys the
builder (0.18) still reads the transformers-4 way. Each fix below sets only what the builder reads to the values
transformers itself computes with (the model's arithmetic is never changed; infra.pack.lm_quality proves the
graph token-exact against transformers afterwards):

- gemma3_text: `rope_parameters` is one dict per layer type; the builder wants the full-attention layers' flat
  dict, `rope_theta` and the sliding layers' `rope_local_base_freq`.
- phi3: a config with default rope but `original_max_position_embeddings` != `max_position_embeddings` is sent
  to the LongRoPE builder (KeyError 'multi_cache'); for default rope transformers ignores the original length.
- mistral: every layer slides (transformers applies `sliding_window` to all layers) but the config has no
  `layer_types`, so the builder sized full caches while telling the attention its cache is window-sized
  (GroupQueryAttention's present-shape error once the prompt passed the window).

A script, not a module of the package: the child imports nothing of warmstart's (its path is not on sys.path).
"""

from __future__ import annotations

import json
import sys
from typing import Any


def adjust(config: Any) -> None:
    """Rewrite, in place, what the builder reads of `config` (a transformers config object)."""
    model_type = getattr(config, "model_type", "")
    rope = getattr(config, "rope_parameters", None)
    if model_type == "gemma3_text" and isinstance(rope, dict) and "full_attention" in rope:
        full, local = dict(rope["full_attention"]), dict(rope.get("sliding_attention") or rope["full_attention"])
        config.rope_parameters = full
        config.rope_theta = full["rope_theta"]
        config.rope_local_base_freq = local["rope_theta"]
    if model_type == "phi3" and isinstance(rope, dict) and rope.get("rope_type", "default") == "default":
        config.original_max_position_embeddings = config.max_position_embeddings
    if model_type == "mistral" and getattr(config, "sliding_window", None) and not getattr(config, "layer_types", None):
        config.layer_types = ["sliding_attention"] * config.num_hidden_layers


def main(raw: str) -> None:
    from onnxruntime_genai.models import builder  # type: ignore[import-untyped]  # the child's whole job

    args = json.loads(raw)
    extra = [f"{k}={v}" for k, v in (args.get("extra") or {}).items()]
    options = builder.parse_extra_options(
        "", args["input"], args["output"], args["precision"], "cpu", args["cache"], extra
    )
    adjust(options["hf_details"]["hf_config"])
    builder.create_model("", args["input"], args["output"], args["precision"], "cpu", args["cache"], **options)


if __name__ == "__main__":
    main(sys.argv[1])
