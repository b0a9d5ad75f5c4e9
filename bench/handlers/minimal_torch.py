"""The floor of the torch stack: `import torch` and one forward pass of the same exported program (the torch
backend's interpreter over the mapped weights, with none of warmstart's init around it)."""

import os
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from handler.backends.program import load
from handler.backends.weights import mmap_safetensors

_root = Path(os.environ["WARMSTART_MODEL"])
tok = Tokenizer.from_file(str(_root / "tokenizer.json"))
tok.enable_truncation(256)
tok.enable_padding()
program = load(_root / "program.json", mmap_safetensors(_root / "model.safetensors"))


def lambda_handler(event: Any, context: Any) -> Any:
    enc = tok.encode_batch(event["inputs"])
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    with torch.inference_mode():
        return {"embeddings": program(ids, mask)[0].tolist()}
