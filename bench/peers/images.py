"""warmstart's image-text pack against fastembed's ImageEmbedding on the same vision graph (CLIP ViT-B/32 shape,
random weights: nothing is downloaded).

    PYTHONPATH=. .venv/bin/python bench/peers/images.py --fastembed-python /path/to/venv/bin/python --rounds 3

Builds a CLIPModel directory from transformers' default CLIPConfig (ViT-B/32: 224 px, patch 32, 12 layers),
packs it with `pack --from` (task image-text), and hands fastembed the same image/model.onnx (+ its data) and
preprocessor_config.json through `specific_model_path` (fastembed's Qdrant/clip-ViT-B-32-vision shape). Each
round starts one fresh process per side, pinned to one CPU with one intra-op thread, the sides interleaved:
cold start to the first image vector (process start included), then warm batch 1 and batch 32 (median of 5),
and the process's peak RSS. Images: 640x480 JPEGs, decoded by each side (ours from base64, fastembed from files).
fastembed runs in its own virtual environment: it requires `onnxruntime`, whose files would overwrite
onnxruntime-gpu's in ours.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OURS = r"""
import base64, json, sys, time
from pathlib import Path
from handler.core.config import Config
from handler.runtime.invocation import Runtime
pack, images = Path(sys.argv[1]), sorted(Path(sys.argv[2]).glob("*.jpg"))
rt = Runtime.start(Config(model_dir=pack, backend="onnx", threads=1, warmup=False), environ={}, emit=None)
data = [base64.b64encode(p.read_bytes()).decode() for p in images]
rt.task({"inputs": data[:1], "modality": "image"})
print("READY", flush=True)
def run(n):
    t = time.perf_counter(); rt.task({"inputs": data[:n], "modality": "image"}); return time.perf_counter() - t
b1 = sorted(run(1) for _ in range(5))[2]; b32 = sorted(run(32) for _ in range(5))[2]
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))  # ru_maxrss survives exec
print(json.dumps({"b1": b1, "b32": b32, "rss_mb": int(hwm.split()[1]) / 1024}))
"""
FASTEMBED = r"""
import json, sys, time
from pathlib import Path
from fastembed import ImageEmbedding
model_dir, images = sys.argv[1], [str(p) for p in sorted(Path(sys.argv[2]).glob("*.jpg"))]
m = ImageEmbedding("Qdrant/clip-ViT-B-32-vision", specific_model_path=model_dir, threads=1)
list(m.embed(images[:1]))
print("READY", flush=True)
def run(n):
    t = time.perf_counter(); list(m.embed(images[:n], batch_size=32)); return time.perf_counter() - t
b1 = sorted(run(1) for _ in range(5))[2]; b32 = sorted(run(32) for _ in range(5))[2]
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))  # ru_maxrss survives exec
print(json.dumps({"b1": b1, "b32": b32, "rss_mb": int(hwm.split()[1]) / 1024}))
"""


# A CLIP preprocessor_config.json as a real CLIP's file says it: fastembed reads a missing do_* as false (no resize,
# no normalization), so every key is written out.
CLIP_PREPROCESSOR = {
    "image_processor_type": "CLIPImageProcessor",
    "do_resize": True,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "do_convert_rgb": True,
    "size": {"shortest_edge": 224},
    "crop_size": {"height": 224, "width": 224},
    "do_center_crop": True,
    "resample": 3,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
}


def build(work: Path) -> tuple[Path, Path, Path]:
    """A CLIP ViT-B/32-shaped directory with random weights, packed; fastembed's folder; 32 JPEGs."""
    import transformers

    from infra.pack.image_pack import pack_image_text
    from tests.image_models import SPECIALS
    from tests.tiny_models import _bert_tokenizer

    source = work / "clip-b32"
    tok, vocab = _bert_tokenizer(SPECIALS, "[CLS]", "[SEP]", False)
    config = transformers.CLIPConfig(text_config={"eos_token_id": vocab["[SEP]"]})
    transformers.CLIPModel(config).save_pretrained(source)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]").save_pretrained(source)
    (source / "preprocessor_config.json").write_text(json.dumps(CLIP_PREPROCESSOR))
    pack = pack_image_text(source, work / "pack", force=True)
    theirs, images = fastembed_side(source, pack, work)
    return pack, theirs, images


def fastembed_side(source: Path, pack: Path, work: Path) -> tuple[Path, Path]:
    """fastembed's CLIP folder (our packed image graph, the source's preprocessor file) and 32 random 640x480
    JPEGs, under `work`."""
    import numpy as np
    from PIL import Image

    theirs = work / "fastembed"
    theirs.mkdir()
    for name in ("model.onnx", "model.onnx.data"):
        if (pack / "image" / name).exists():  # a small graph has no external data
            shutil.copyfile(pack / "image" / name, theirs / name)
    shutil.copyfile(source / "preprocessor_config.json", theirs / "preprocessor_config.json")
    (theirs / "config.json").write_text(json.dumps({"model_type": "clip"}))
    images = work / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i in range(32):
        Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)).save(images / f"{i:02}.jpg", quality=90)
    return theirs, images


def one(python: str, code: str, model: Path, images: Path, env: dict[str, str]) -> dict[str, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        ["taskset", "-c", "0", python, "-c", code, str(model), str(images)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    cold = time.perf_counter() - t0
    assert line.strip() == "READY", line
    result = json.loads(proc.stdout.readline())
    proc.wait()
    return {"cold": cold, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fastembed-python", required=True, help="a python whose environment has fastembed")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path.cwd())}
    with tempfile.TemporaryDirectory(prefix="bench-images-") as tmp:
        pack, theirs, images = build(Path(tmp))
        rows: dict[str, list[dict[str, float]]] = {"warmstart": [], "fastembed": []}
        for _ in range(args.rounds):  # interleaved: each round one fresh process per side
            rows["warmstart"].append(one(sys.executable, OURS, pack, images, env))
            rows["fastembed"].append(one(args.fastembed_python, FASTEMBED, theirs, images, env))
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    out = {"loadavg": load, "rounds": args.rounds}
    for side, results in rows.items():
        out[side] = {
            k: {
                "median": statistics.median(r[k] for r in results),
                "min": min(r[k] for r in results),
                "max": max(r[k] for r in results),
            }
            for k in ("cold", "b1", "b32", "rss_mb")
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
