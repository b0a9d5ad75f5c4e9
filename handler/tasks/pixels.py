"""Images in a request → the vision tower's `pixel_values`, with Pillow and numpy only (no torch at run time).

The steps and their order are transformers' PIL image processor's (CLIPImageProcessor, SiglipImageProcessor):
RGB (transparency composited onto white), resize with the configured resample filter (a shortest-edge rule or a
fixed height x width), center crop (zero-padded when the image is smaller), rescale in float64 then float32,
normalize in float32. tests/unit/test_image_pixels.py measures the difference against transformers' own
processor: 0.0 on the images it tries.

`ImageRecipe` is what the manifest's `image` block holds (written at pack time by infra.pack.image_source from
`preprocessor_config.json`). `decode` bounds what a request can make us hold: the encoded bytes, the pixel count
(read from the header before any pixel is decoded) and the formats.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from handler.core.errors import InvalidInputError, PayloadTooLargeError
from handler.core.records import record, replace

if TYPE_CHECKING:  # types only: numpy.typing's import dedents docstrings with regexes, at init
    import numpy.typing as npt
    from PIL.Image import Image

# PIL's resample numbers, as preprocessor_config.json writes them (PILImageResampling).
RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")  # what a request's image may be; others are refused
MAX_IMAGE_BYTES = 16 << 20  # encoded, per image (a base64 string is 4/3 of it)
MAX_PIXELS = 40_000_000  # per image, width x height from the header: ~120 MB decoded as RGB
_DATA_URL = "data:"
RESIZES = ("shortest_edge", "fixed", "none", "naflex")
NAFLEX_INPUTS = ("pixel_values", "pixel_attention_mask", "spatial_shapes")


class InvalidImageError(InvalidInputError):
    """An image in the request that cannot be used: not base64, not an image, a format or size refused."""


@record
class ImageRecipe:
    """How a model's images are prepared: transformers' image processor settings, checked."""

    resize: str  # "shortest_edge" | "fixed" | "none" | "naflex"
    size: tuple[int, int]  # (height, width) for "fixed"; (edge, 0) for "shortest_edge"; (patch, max patches) for naflex
    resample: int  # a key of RESAMPLE
    crop: tuple[int, int] | None  # (height, width), or None: no center crop
    scale: float | None  # rescale factor, or None: not rescaled
    mean: tuple[float, float, float] | None  # normalize, or None: not normalized
    std: tuple[float, float, float] | None

    @property
    def out_size(self) -> tuple[int, int] | None:
        """(height, width) of every prepared image, where it is fixed."""
        if self.crop is not None:
            return self.crop
        return self.size if self.resize == "fixed" else None

    @property
    def inputs(self) -> tuple[str, ...]:
        """The vision tower's inputs: NaFlex (SigLIP2) adds each image's patch mask and patch grid."""
        return NAFLEX_INPUTS if self.resize == "naflex" else ("pixel_values",)

    def to_json(self) -> dict[str, Any]:
        return {
            "resize": self.resize,
            "size": list(self.size),
            "resample": self.resample,
            "crop": list(self.crop) if self.crop else None,
            "scale": self.scale,
            "mean": list(self.mean) if self.mean else None,
            "std": list(self.std) if self.std else None,
        }

    @classmethod
    def parse(cls, raw: Any) -> ImageRecipe:
        """The manifest's `image` block → a recipe; ValueError naming what is wrong (the manifest's fault)."""
        if not isinstance(raw, dict):
            raise ValueError("image: expected an object (the image preprocessing)")
        resize = raw.get("resize")
        if resize not in RESIZES:
            raise ValueError(f"image.resize {resize!r}; valid: {', '.join(RESIZES)}")
        if raw.get("resample") not in RESAMPLE:
            raise ValueError(f"image.resample {raw.get('resample')!r}; valid: {sorted(RESAMPLE)}")

        def pair(value: Any, key: str) -> tuple[int, int]:
            if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and v >= 0 for v in value)):
                raise ValueError(f"image.{key} {value!r}; expected [height, width] of non-negative integers")
            return int(value[0]), int(value[1])

        def triple(value: Any, key: str) -> tuple[float, float, float] | None:
            if value is None:
                return None
            if not (isinstance(value, list) and len(value) == 3 and all(isinstance(v, (int, float)) for v in value)):
                raise ValueError(f"image.{key} {value!r}; expected three numbers (R, G, B)")
            return float(value[0]), float(value[1]), float(value[2])

        crop = raw.get("crop")
        scale = raw.get("scale")
        if scale is not None and not isinstance(scale, (int, float)):
            raise ValueError(f"image.scale {scale!r}; expected a number or null")
        if resize == "naflex" and min(pair(raw.get("size"), "size")) < 1:
            raise ValueError(f"image.size {raw.get('size')!r}; naflex needs [patch size, max patches], both >= 1")
        return cls(
            resize,
            pair(raw.get("size"), "size"),
            int(raw["resample"]),
            pair(crop, "crop") if crop is not None else None,
            float(scale) if scale is not None else None,
            triple(raw.get("mean"), "mean"),
            triple(raw.get("std"), "std"),
        )


def image_bytes(value: Any, where: str, max_bytes: int = MAX_IMAGE_BYTES) -> bytes:
    """A request's image string (base64, or a `data:image/...;base64,` URL) → its bytes. A URL is refused:
    the function never fetches from the internet."""
    if not isinstance(value, str):
        raise InvalidImageError(f"{where} must be a string (base64 or a data URL), got {type(value).__name__}")
    text = value
    if text.startswith(_DATA_URL):
        head, sep, text = text.partition(",")
        if not sep or not head.endswith(";base64"):
            raise InvalidImageError(f"{where}: a data URL must be data:image/<type>;base64,<data>")
    elif "://" in text[:16]:
        raise InvalidImageError(
            f"{where} is a URL: images are never fetched from the internet by the function; send the image's "
            "bytes as base64 or a data URL"
        )
    if len(text) > (max_bytes + 2) // 3 * 4 + 4:
        raise PayloadTooLargeError(f"{where} is over {max_bytes} bytes encoded; send a smaller image")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidImageError(f"{where} is not valid base64") from None


def decode(data: bytes, where: str, max_pixels: int = MAX_PIXELS) -> Image:
    """Bytes → a loaded RGB PIL image; the header's size is checked before any pixel is decoded."""
    from PIL import Image, UnidentifiedImageError  # deferred: a text-only instance never imports Pillow

    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except UnidentifiedImageError:
        raise InvalidImageError(f"{where} is not an image of a format we read ({', '.join(FORMATS)})") from None
    width, height = image.size
    if width * height > max_pixels or width < 1 or height < 1:
        raise PayloadTooLargeError(f"{where} is {width}x{height} pixels; at most {max_pixels} pixels per image")
    try:
        image.load()
        return to_rgb(image)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise InvalidImageError(f"{where}: the image data is damaged ({e})") from None


def to_rgb(image: Image) -> Image:
    """transformers' convert_to_rgb: transparency composited onto white, anything else converted."""
    from PIL import Image

    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def resized_size(recipe: ImageRecipe, height: int, width: int) -> tuple[int, int]:
    """(height, width) after the resize: transformers' get_resize_output_image_size (default_to_square=False)."""
    if recipe.resize == "fixed":
        return recipe.size
    if recipe.resize == "none":
        return height, width
    edge = recipe.size[0]
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(edge * long / short)
    return (new_long, edge) if width <= height else (edge, new_long)


def center_crop(array: npt.NDArray[Any], height: int, width: int) -> npt.NDArray[Any]:
    """(H, W, C) → (height, width, C) around the center, zero-padded where the image is smaller."""
    h, w = array.shape[:2]
    top, left = (h - height) // 2, (w - width) // 2
    if top >= 0 and left >= 0:
        return array[top : top + height, left : left + width]
    out = np.zeros((max(height, h), max(width, w), array.shape[2]), array.dtype)
    pad_top, pad_left = -(-(out.shape[0] - h) // 2), -(-(out.shape[1] - w) // 2)
    out[pad_top : pad_top + h, pad_left : pad_left + w] = array
    top, left = (out.shape[0] - height) // 2, (out.shape[1] - width) // 2
    return out[top : top + height, left : left + width]


def prepare(image: Image, recipe: ImageRecipe) -> npt.NDArray[np.float32]:
    """One RGB image → (3, H, W) float32, as transformers' processor makes it."""
    if recipe.resize != "none":
        height, width = resized_size(recipe, image.height, image.width)
        image = image.resize((width, height), resample=recipe.resample)
    array: npt.NDArray[Any] = np.asarray(image)
    if recipe.crop is not None:
        array = center_crop(array, *recipe.crop)
    if recipe.scale is not None:
        array = (array.astype(np.float64) * recipe.scale).astype(np.float32)  # transformers upcasts, then back
    elif recipe.mean is not None or array.dtype != np.float32:
        array = array.astype(np.float32)
    if recipe.mean is not None and recipe.std is not None:
        array = (array - np.array(recipe.mean, np.float32)) / np.array(recipe.std, np.float32)
    return np.ascontiguousarray(array.transpose(2, 0, 1), dtype=np.float32)


def pixel_values(images: list[Image], recipe: ImageRecipe) -> npt.NDArray[np.float32]:
    """The batch's `pixel_values` (N, 3, H, W)."""
    return np.stack([prepare(image, recipe) for image in images])


def pixel_feeds(images: list[Image], recipe: ImageRecipe) -> dict[str, npt.NDArray[Any]]:
    """The vision tower's feeds for the batch (`recipe.inputs`, each with the batch first)."""
    if recipe.resize != "naflex":
        return {"pixel_values": pixel_values(images, recipe)}
    patched = [naflex(image, recipe) for image in images]
    return {name: np.stack([p[i] for p in patched]) for i, name in enumerate(NAFLEX_INPUTS)}


def naflex_size(height: int, width: int, patch: int, max_patches: int, eps: float = 1e-5) -> tuple[int, int]:
    """transformers' get_image_size_for_max_num_patches: the largest scale (by its bisection, to the same
    floats) whose sides, rounded up to whole patches (at least one), give at most `max_patches` patches."""

    def scaled(scale: float, size: int) -> int:
        return int(max(patch, math.ceil(size * scale / patch) * patch))

    low, high = eps / 10, 100.0
    while (high - low) >= eps:
        scale = (low + high) / 2
        if (scaled(scale, height) / patch) * (scaled(scale, width) / patch) <= max_patches:
            low = scale
        else:
            high = scale
    return scaled(low, height), scaled(low, width)


def naflex(image: Image, recipe: ImageRecipe) -> tuple[npt.NDArray[Any], ...]:
    """One RGB image → SigLIP2's (pixel_values (max patches, p*p*3), pixel_attention_mask (max patches,) int32,
    spatial_shapes (2,) int64): resized keeping its aspect ratio to fit, patchified row-major, zero-padded."""
    patch, max_patches = recipe.size
    height, width = naflex_size(image.height, image.width, patch, max_patches)
    array = prepare(image.resize((width, height), resample=recipe.resample), replace(recipe, resize="none"))
    rows, cols = height // patch, width // patch
    # (C, rows, p, cols, p) → (rows, cols, p, p, C): each patch's pixels row by row, channels last
    patches = array.reshape(3, rows, patch, cols, patch).transpose(1, 3, 2, 4, 0).reshape(rows * cols, -1)
    values = np.zeros((max_patches, patches.shape[1]), np.float32)
    values[: rows * cols] = patches
    mask = np.zeros(max_patches, np.int32)
    mask[: rows * cols] = 1
    return values, mask, np.array([rows, cols], np.int64)
