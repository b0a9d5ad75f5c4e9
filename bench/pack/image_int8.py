"""image-text int8 vs float32: a CLIP of ViT-S/32-like shape (random weights, no downloads), packed both ways;
the gate's figures, the sizes, and warm latency (texts and images, batch 1 and 32) interleaved in each round.

    PYTHONPATH=$PWD python bench/pack/image_int8.py WORKDIR [ROUNDS]
"""

from __future__ import annotations

import base64
import io
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def load() -> str:
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def make_clip(src: Path) -> None:
    import torch
    import transformers

    from tests.image_models import PREPROCESSORS, SPECIALS
    from tests.tiny_models import _bert_tokenizer

    tok, vocab = _bert_tokenizer(SPECIALS, "[CLS]", "[SEP]", False)
    towers = {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 6, "num_attention_heads": 6}
    text = {**towers, "vocab_size": len(vocab), "max_position_embeddings": 77, "pad_token_id": 0}
    text.update(eos_token_id=vocab["[SEP]"], bos_token_id=vocab["[CLS]"])
    vision = {**towers, "image_size": 224, "patch_size": 32}
    config = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=256)
    model = transformers.CLIPModel(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)
    model.save_pretrained(src)
    specials = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]"}
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **specials)
    fast.model_max_length = 77
    fast.save_pretrained(src)
    pre = dict(PREPROCESSORS["clip"], size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224})
    (src / "preprocessor_config.json").write_text(json.dumps(pre))


def main(root: Path, rounds: int) -> None:
    from PIL import Image

    from infra.pack.hf_pack import pack_from
    from infra.pack.precision import Precision
    from tests.conftest import start

    src = root / "clip-s32"
    if not src.exists():
        make_clip(src)
    packs: dict[str, Any] = {}
    for label, precision in (("float32", None), ("int8", Precision(quantize="int8"))):
        out = root / f"packed-{label}"
        if not out.exists():
            t = time.time()
            pack_from(src, out, precision=precision)
            print(f"pack {label}: {time.time() - t:.0f} s, load {load()}", flush=True)
        towers = {t: sum(f.stat().st_size for f in (out / t).iterdir()) for t in ("text", "image")}
        print(label, "bytes", sum(f.stat().st_size for f in out.rglob("*") if f.is_file()), towers)
        packs[label] = start(out, "onnx")
    q = json.loads((root / "packed-int8" / "manifest.json").read_text())["precision"]["quality"]
    text, image = q["text_tower"], q["image_tower"]
    print(f"gate {q['figure']} worst {q['worst_input']!r}")
    print(f"text min {text['min_cosine']} median {text['median_cosine']}")
    print(f"image min {image['min_cosine']} median {image['median_cosine']} worst {image['worst_image']!r}")
    rng = np.random.default_rng(0)

    def png() -> str:
        out = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)).save(out, "PNG")
        return base64.b64encode(out.getvalue()).decode()

    images = [png() for _ in range(32)]
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "the",
        "lazy",
        "dog",
        "while",
        "a",
        "cold",
        "start",
        "waits",
    ]
    texts = [" ".join(words[i % 5 : i % 5 + 8]) for i in range(32)]
    requests = {
        "text b1": {"inputs": texts[:1]},
        "text b32": {"inputs": texts},
        "image b1": {"inputs": images[:1], "modality": "image"},
        "image b32": {"inputs": images, "modality": "image"},
    }
    for runtime in packs.values():
        for request in requests.values():
            runtime.task(request)
    times: dict[tuple[str, str], list[float]] = {(k, p): [] for k in requests for p in packs}
    loads = []
    for _ in range(rounds):
        loads.append(load())
        for k, request in requests.items():
            for p, runtime in packs.items():
                t = time.perf_counter()
                runtime.task(request)
                times[(k, p)].append((time.perf_counter() - t) * 1000)
    for k in requests:
        f, i = times[(k, "float32")], times[(k, "int8")]
        ratios = [b / a for a, b in zip(f, i, strict=True)]
        print(
            f"{k}: float32 {statistics.median(f):.1f} ms [{min(f):.1f}-{max(f):.1f}], "
            f"int8 {statistics.median(i):.1f} ms [{min(i):.1f}-{max(i):.1f}], "
            f"int8/float32 {statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"
        )
    print("load1 at each round", " ".join(loads))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 7)
