"""The floor of the ONNX stack: ONNX Runtime + tokenizers, defaults, nothing else (same packed graph)."""

import os
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

_root = os.environ["WARMSTART_MODEL"]
tok = Tokenizer.from_file(f"{_root}/tokenizer.json")
tok.enable_truncation(256)
tok.enable_padding()
session = ort.InferenceSession(f"{_root}/model.onnx", providers=["CPUExecutionProvider"])


def lambda_handler(event: Any, context: Any) -> Any:
    enc = tok.encode_batch(event["inputs"])
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
    return {"embeddings": session.run(None, {"input_ids": ids, "attention_mask": mask})[0].tolist()}
