"""`pack --from DIR --quantize int8 | int8-block` for image-text: both towers quantized behind one quality gate.

Each tower's float32 graph goes through infra.pack.quantize.quantize_checked (SmoothQuant maxima from its own
calibration inputs, the fail-fast sample, then all of them): the text tower on the built-in calibration texts,
the image tower on calibration images generated here (CALIBRATION_IMAGES: gradients, noise, shapes, stripes,
checkerboards, smooth "photo-like" textures, flat colours, at several sizes and aspect ratios, from a fixed seed:
deterministic, nothing downloaded) and prepared by the run time's own recipe (handler.tasks.pixels). The metric
is the embedding gate's: the minimum cosine against float32 over texts AND images (the smaller of the towers'
figures), with each tower's figures and its worst input recorded in the manifest's `precision.quality`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from infra.pack.image_source import ImageTextSource
from infra.pack.onnx_io import ONNX_DATA, ONNX_FILE
from infra.pack.precision import Precision

CALIBRATION_IMAGES = 64
IMAGE_BATCH = 16
KINDS = ("gradient", "noise", "shapes", "stripes", "checker", "texture", "flat", "photo")
SIZES = ((224, 224), (320, 240), (180, 400), (64, 64), (500, 375), (31, 47))


class _Gauge:
    """What quantize_checked reads of a source: the task whose gate it applies (embeddings: cosine)."""

    task = "embedding"
    problem_type = None


def calibration_images(n: int = CALIBRATION_IMAGES, seed: int = 0) -> list[tuple[str, Any]]:
    """`n` (name, PIL image) pairs, the same every time: each kind in turn, at varied sizes."""
    from PIL import Image, ImageDraw, ImageFilter  # pack time only

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        w, h = SIZES[(i // len(KINDS)) % len(SIZES)]
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        if kind == "gradient":
            a, b = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
            t = ((x * rng.uniform(-1, 1) + y * rng.uniform(-1, 1)) / max(w, h) + 1) / 2
            pixels = a + (b - a) * t[..., None]
        elif kind == "noise":
            pixels = rng.uniform(0, 255, (h, w, 3))
        elif kind == "stripes":
            period = rng.uniform(3, 30)
            wave = np.sin((x * np.cos(i) + y * np.sin(i)) / period * 2 * np.pi)
            pixels = 127.5 + 127.5 * wave[..., None] * rng.uniform(0.3, 1, 3)
        elif kind == "checker":
            cell = int(rng.integers(2, 24))
            board = ((x // cell + y // cell) % 2)[..., None]
            pixels = board * rng.uniform(0, 255, 3) + (1 - board) * rng.uniform(0, 255, 3)
        elif kind == "flat":
            pixels = np.broadcast_to(rng.uniform(0, 255, 3), (h, w, 3))
        else:  # shapes, texture, photo: drawn below
            pixels = np.broadcast_to(rng.uniform(0, 255, 3), (h, w, 3))
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
        if kind == "shapes":
            draw = ImageDraw.Draw(image)
            for _ in range(int(rng.integers(3, 12))):
                box = sorted(rng.integers(0, w, 2).tolist()), sorted(rng.integers(0, h, 2).tolist())
                fill = tuple(int(c) for c in rng.integers(0, 256, 3))
                shape = (box[0][0], box[1][0], box[0][1], box[1][1])
                (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(shape, fill=fill)
        elif kind in ("texture", "photo"):
            # low-frequency noise blurred into blobs (texture), plus a sky-to-ground gradient and grain (photo)
            coarse = rng.uniform(0, 255, (max(2, h // 16), max(2, w // 16), 3)).astype(np.uint8)
            image = Image.fromarray(coarse, "RGB").resize((w, h), Image.Resampling.BICUBIC)
            image = image.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.5, 3))))
            if kind == "photo":
                arr = np.asarray(image, np.float32) * 0.6 + (y / h * 120)[..., None] * np.array([0.4, 0.7, 1.0])
                arr += rng.normal(0, 6, arr.shape)
                image = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")
        out.append((f"{kind}-{i} {w}x{h}", image))
    return out


def image_feeds(source: ImageTextSource) -> tuple[list[dict[str, Any]], list[str]]:
    """The calibration images as the image tower's `pixel_values` batches, and their names in row order."""
    from handler.tasks.pixels import pixel_feeds

    named = calibration_images()
    pixels = pixel_feeds([image for _, image in named], source.recipe)
    feeds = [{k: v[i : i + IMAGE_BATCH] for k, v in pixels.items()} for i in range(0, len(named), IMAGE_BATCH)]
    return feeds, [name for name, _ in named]


def text_feeds(source: ImageTextSource, tokenizer: Any, texts: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The calibration texts as the text tower's batches, padded as the run time pads them (SigLIP: to the
    full window; SigLIP2: on the left), and the texts in row order."""
    from infra.pack.quality import BATCH

    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    side = str(getattr(tokenizer, "padding_side", "right"))  # the run time's (the manifest's): SigLIP2 pads left
    feeds = []
    padding: dict[str, Any] = {"padding": True}
    if source.padding == "max_length":
        padding = {"padding": "max_length"}
    for start in range(0, len(order), BATCH):
        chunk = [texts[i] for i in order[start : start + BATCH]]
        encoded = tokenizer(
            chunk,
            truncation=True,
            max_length=source.max_seq_length,
            return_tensors="np",
            padding_side=side,
            **padding,
        )
        feeds.append({n: np.asarray(encoded[n]).astype(np.int64) for n in source.text_inputs})
    return feeds, [texts[i] for i in order]


def quantize_towers(
    source: ImageTextSource, tokenizer: Any, precision: Precision, tmp: Path, staging: Path
) -> dict[str, Any]:
    """Quantize tmp/text and tmp/image (the checked float32 graphs) in place, each gated; QualityError (nothing
    is published) when either tower's worst cosine is below the threshold. The manifest's `precision.quality`."""
    import shutil

    from infra.pack.onnx_io import save_onnx_file
    from infra.pack.progress import phase
    from infra.pack.quality import check
    from infra.pack.quantize import Int8Options, quantize_checked

    options = Int8Options(method=str(precision.quantize))
    what = f"--quantize {precision.quantize}"
    inputs = {
        "text": text_feeds(source, tokenizer, precision.texts(tokenizer, source.max_seq_length)),
        "image": image_feeds(source),
    }
    figures: dict[str, Any] = {}
    for tower, (feeds, labels) in inputs.items():
        phase(f"quantizing the {tower} tower ({precision.quantize})")
        noun = "texts" if tower == "text" else "images"

        def gate(measured: dict[str, Any], early: str = "", tower: str = tower, noun: str = noun) -> dict[str, Any]:
            return check(
                "embedding", measured, precision.min_quality, f"{what} ({tower} tower)", early.replace("texts", noun)
            )

        where = tmp / tower
        graph, quality = quantize_checked(_Gauge(), where / ONNX_FILE, feeds, options, staging / tower, gate, labels)
        for name in (ONNX_FILE, ONNX_DATA):
            (where / name).unlink()
        save_onnx_file(graph, where)
        shutil.rmtree(staging / tower, ignore_errors=True)
        if tower == "image":  # a name, not a text: the retrieval check is the texts'
            quality = {k: v for k, v in quality.items() if not k.startswith("retrieval")}
            quality["worst_image"] = quality.pop("worst_text")
        figures[tower] = quality
    worst = min(figures, key=lambda t: figures[t]["figure"])
    return {
        "metric": "min cosine vs float32 (texts and images)",
        "figure": figures[worst]["figure"],
        "min_quality": figures[worst]["min_quality"],
        "passed": True,
        "items": sum(f["items"] for f in figures.values()),
        "worst_tower": worst,
        "worst_input": f"{worst}: {figures[worst]['worst_text' if worst == 'text' else 'worst_image']}",
        "quantization": options.to_json(),
        **{f"{tower}_tower": f for tower, f in figures.items()},
    }
