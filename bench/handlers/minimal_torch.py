"""The floor of the torch stack: `import torch` and one forward pass of the same encoder."""

import os
from typing import Any

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from handler.backends.encoder_torch import EncoderConfig, HFEncoder, weight_names

_root = os.environ["WARMSTART_MODEL"]
tok = Tokenizer.from_file(f"{_root}/tokenizer.json")
tok.enable_truncation(256)
tok.enable_padding()
_config = {
    "vocab_size": 30522,
    "hidden_size": 384,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "intermediate_size": 1536,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
}
with torch.device("meta"):
    model = HFEncoder(EncoderConfig.from_hf("bert", _config))
_weights = load_file(f"{_root}/model.safetensors")
_names, _ = weight_names(model, "bert", set(_weights))
model.load_state_dict({k: _weights[n] for k, n in _names.items()}, assign=True)
model.eval()


def lambda_handler(event: Any, context: Any) -> Any:
    enc = tok.encode_batch(event["inputs"])
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    with torch.inference_mode():
        return {"embeddings": model(ids, mask).tolist()}
