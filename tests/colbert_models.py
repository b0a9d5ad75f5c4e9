"""A tiny random ColBERT model directory laid out as PyLate 1.6 saves one (`ColBERT.save`): a BERT encoder at
the root, `1_Dense` (PyLate's Dense: a Linear on every token, no bias, no activation) and PyLate's settings in
config_sentence_transformers.json. The marker tokens are added to the tokenizer and the embeddings, as PyLate
does before it saves."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

DIMENSION = 16


def make_colbert_dir(
    out: Path, seed: int = 0, shape: dict[str, int] | None = None, dimension: int = DIMENSION, **settings: Any
) -> Path:
    """Write the directory; `settings` override PyLate's keys (query_length, skiplist_words, ...), `shape` the
    BERT config's sizes (benchmarks: a real ColBERT's shapes, random weights), `dimension` the projection's."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub, even by accident
    import torch
    import transformers
    from safetensors.torch import save_file

    from tests.tiny_models import build_config, build_tokenizer

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    tokenizer, _ = build_tokenizer("bert", 64)
    tokenizer.add_tokens(["[Q] ", "[D] "])  # PyLate's markers, as ColBERT.__init__ adds them
    torch.manual_seed(seed)
    sizes = dict(shape or {})
    positions = sizes.pop("max_position_embeddings", None)
    config = build_config("bert", max(len(tokenizer), sizes.pop("vocab_size", 0)), **sizes)
    if positions is not None:
        config.max_position_embeddings = positions
    model = transformers.BertModel(config).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    (out / "modules.json").write_text(
        json.dumps(
            [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
            ]
        )
    )
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 63, "do_lower_case": False}))
    config = {
        "prompts": {},
        "default_prompt_name": None,
        "similarity_fn_name": "MaxSim",
        "query_prefix": "[Q] ",
        "document_prefix": "[D] ",
        "query_length": 12,
        "document_length": 24,
        "attend_to_expansion_tokens": False,
        "skiplist_words": list(string.punctuation),
        "do_query_expansion": True,
        **settings,
    }
    (out / "config_sentence_transformers.json").write_text(json.dumps(config, indent=2))
    dense = out / "1_Dense"
    dense.mkdir(exist_ok=True)
    hidden = model.config.hidden_size
    (dense / "config.json").write_text(
        json.dumps(
            {
                "in_features": hidden,
                "out_features": dimension,
                "bias": False,
                "activation_function": "torch.nn.modules.linear.Identity",
                "use_residual": False,
            }
        )
    )
    weight = torch.randn(dimension, hidden, generator=torch.Generator().manual_seed(seed + 1)) / hidden**0.5
    save_file({"linear.weight": weight.contiguous()}, str(dense / "model.safetensors"))
    return out
