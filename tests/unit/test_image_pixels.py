"""Image preprocessing (handler.tasks.pixels) against transformers' own image processors, and its bounds."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from handler.core.errors import PayloadTooLargeError
from handler.tasks.pixels import InvalidImageError, decode, image_bytes, pixel_feeds, pixel_values, to_rgb
from infra.pack.hf_checks import SourceError
from infra.pack.image_source import read_recipe


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    palette = Image.fromarray(rng.integers(0, 256, (30, 18), dtype=np.uint8), "L").convert("P")
    palette.info["transparency"] = 0
    return [
        Image.fromarray(rng.integers(0, 256, (50, 37, 3), dtype=np.uint8)),  # taller than wide
        Image.fromarray(rng.integers(0, 256, (21, 64, 4), dtype=np.uint8), "RGBA"),  # alpha onto white
        Image.fromarray(rng.integers(0, 256, (40, 40), dtype=np.uint8), "L"),  # grayscale
        Image.fromarray(rng.integers(0, 256, (10, 12, 3), dtype=np.uint8)),  # smaller than the crop: padded
        palette,  # a palette with a transparent index
    ]


CONFIGS = {
    "clip": {
        "image_processor_type": "CLIPImageProcessor",
        "size": {"shortest_edge": 30},
        "crop_size": {"height": 28, "width": 28},
    },
    "clip-bilinear-odd": {
        "image_processor_type": "CLIPImageProcessor",
        "size": {"shortest_edge": 27},
        "crop_size": {"height": 28, "width": 28},  # larger than the short edge: zero padding
        "resample": 2,
    },
    "siglip": {"image_processor_type": "SiglipImageProcessor", "size": {"height": 28, "width": 28}},
    "siglip-lanczos": {
        "image_processor_type": "SiglipImageProcessor",
        "size": {"height": 28, "width": 28},
        "resample": 1,
    },
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_pixels_match_transformers_processor(tmp_path: Path, name: str) -> None:
    """The pixel tensor's max abs difference against transformers' processor (its PIL backend: the one it
    uses without torchvision, and the same arithmetic) is 0.0 on every image kind tried."""
    from transformers import CLIPImageProcessor, SiglipImageProcessor

    kind = name.split("-")[0]
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(CONFIGS[name]))
    recipe = read_recipe(tmp_path / "preprocessor_config.json", kind, 28)
    processor = (CLIPImageProcessor if kind == "clip" else SiglipImageProcessor).from_pretrained(str(tmp_path))
    images = _images()
    want = processor(images=images, return_tensors="np")["pixel_values"]
    got = pixel_values([to_rgb(i) for i in images], recipe)
    assert got.shape == want.shape == (len(images), 3, 28, 28) and got.dtype == np.float32
    diff = float(np.abs(got - want).max())
    print(f"{name}: pixel max abs diff {diff}")
    assert diff == 0.0


NAFLEX = {
    "siglip2": {"image_processor_type": "Siglip2ImageProcessor", "patch_size": 7, "max_num_patches": 16},
    "siglip2-bicubic": {
        "image_processor_type": "Siglip2ImageProcessor",
        "patch_size": 4,
        "max_num_patches": 64,
        "resample": 3,
        "image_mean": [0.4, 0.5, 0.6],
        "image_std": [0.2, 0.3, 0.4],
    },
}


@pytest.mark.parametrize("name", sorted(NAFLEX))
def test_naflex_feeds_match_transformers_processor(tmp_path: Path, name: str) -> None:
    """SigLIP2's NaFlex feeds (pixel_values as patches, pixel_attention_mask, spatial_shapes) against
    Siglip2ImageProcessor (its PIL backend): max abs difference 0.0, each image keeping its own aspect ratio."""
    from transformers import Siglip2ImageProcessor

    (tmp_path / "preprocessor_config.json").write_text(json.dumps(NAFLEX[name]))
    recipe = read_recipe(tmp_path / "preprocessor_config.json", "siglip2", 0)
    images = [to_rgb(i) for i in _images()] + [Image.new("RGB", (300, 7), "blue")]  # wider than the patch budget
    want = Siglip2ImageProcessor.from_pretrained(str(tmp_path))(images=images, return_tensors="np")
    got = pixel_feeds(images, recipe)
    assert list(got) == ["pixel_values", "pixel_attention_mask", "spatial_shapes"]
    for key, value in got.items():
        assert value.shape == want[key].shape and value.dtype == want[key].dtype, key
        diff = float(np.abs(value.astype(np.float64) - want[key]).max())
        print(f"{name}: {key} max abs diff {diff}")
        assert diff == 0.0, key
    assert len({tuple(s) for s in got["spatial_shapes"].tolist()}) > 3  # grids differ with the aspect ratio


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"image_processor_type": "Siglip2ImageProcessor"}, "image_processor_type"),  # for a CLIP model
        ({"image_processor_type": "CLIPImageProcessor", "do_pad": True}, "do_pad"),
        ({"image_processor_type": "CLIPImageProcessor", "max_num_patches": 256}, "max_num_patches"),
        ({"image_processor_type": "CLIPImageProcessor", "resample": 9}, "resample"),
        ({"image_processor_type": "CLIPImageProcessor", "size": {"longest_edge": 28}}, "size"),
        ({"image_processor_type": "CLIPImageProcessor", "do_center_crop": False}, "varying size"),
    ],
)
def test_unsupported_preprocessing_is_refused_in_one_line(
    tmp_path: Path, config: dict[str, object], words: str
) -> None:
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    with pytest.raises(SourceError, match=words) as e:
        read_recipe(tmp_path / "preprocessor_config.json", "clip", 224)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"image_processor_type": "SiglipImageProcessor"}, "supported for siglip2"),
        ({"image_processor_type": "Siglip2ImageProcessor", "do_resize": False}, "do_resize"),
        ({"image_processor_type": "Siglip2ImageProcessor", "do_center_crop": True}, "do_center_crop"),
        ({"image_processor_type": "Siglip2ImageProcessor", "max_num_patches": 0}, "max patches"),
    ],
)
def test_unsupported_naflex_preprocessing_is_refused_in_one_line(
    tmp_path: Path, config: dict[str, object], words: str
) -> None:
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    with pytest.raises(SourceError, match=words) as e:
        read_recipe(tmp_path / "preprocessor_config.json", "siglip2", 0)
    assert "\n" not in str(e.value)


def _png(size: tuple[int, int] = (5, 4)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (1, 2, 3)).save(out, "PNG")
    return out.getvalue()


def test_base64_and_data_urls_decode_and_urls_are_refused() -> None:
    raw = _png()
    encoded = base64.b64encode(raw).decode()
    assert image_bytes(encoded, "inputs[0]") == raw
    assert image_bytes(f"data:image/png;base64,{encoded}", "inputs[0]") == raw
    assert decode(raw, "inputs[0]").size == (5, 4)
    with pytest.raises(InvalidImageError, match="never fetched from the internet"):
        image_bytes("https://example.com/cat.png", "inputs[0]")
    with pytest.raises(InvalidImageError, match="data URL"):
        image_bytes("data:image/png,rawbytes", "inputs[0]")
    with pytest.raises(InvalidImageError, match="not valid base64"):
        image_bytes("not base64!", "inputs[0]")
    with pytest.raises(InvalidImageError, match="must be a string"):
        image_bytes(3, "inputs[0]")
    with pytest.raises(PayloadTooLargeError):
        image_bytes("A" * 100, "inputs[0]", max_bytes=30)


def test_decoding_is_bounded_and_bad_images_are_typed_errors() -> None:
    with pytest.raises(InvalidImageError, match="not an image"):
        decode(b"hello, not an image", "inputs[1]")
    with pytest.raises(PayloadTooLargeError, match="5x4 pixels"):  # from the header, before any pixel decodes
        decode(_png(), "inputs[1]", max_pixels=10)
    with pytest.raises(InvalidImageError, match="damaged"):
        decode(_png((64, 64))[:-30], "inputs[1]")
