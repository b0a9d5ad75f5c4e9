"""Reading and checking a CLIP / SigLIP / SigLIP2 model directory for `warmstart pack --from DIR` (task `image-text`).

Plain JSON and file checks, nothing imported from torch or transformers: a directory that is not a whole
two-tower model, or whose image preprocessing we do not reproduce exactly, is refused here with one line before
anything is written. SigLIP2 (`Siglip2Model`): its NaFlex processor resizes each image to its own patch grid (the
recipe's resize "naflex"); the vision tower interpolates its position embeddings to that grid in the graph.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from handler.tasks.pixels import RESAMPLE, ImageRecipe
from infra.pack.hf_checks import SourceError, check_tokenizer_json, read_source_file

# config.json model_type → the architecture packed and how its text tower is fed.
KINDS = {"clip": "CLIPModel", "siglip": "SiglipModel", "siglip2": "Siglip2Model"}
REFUSED: dict[str, str] = {}
PROCESSORS = {
    "clip": ("CLIPImageProcessor", "CLIPImageProcessorFast", "CLIPImageProcessorPil"),
    "siglip": ("SiglipImageProcessor", "SiglipImageProcessorFast", "SiglipImageProcessorPil"),
    "siglip2": ("Siglip2ImageProcessor", "Siglip2ImageProcessorFast", "Siglip2ImageProcessorPil"),
}
# Keys of preprocessor_config.json that change nothing when they hold these values (anything else is refused).
_IGNORED = {
    "image_processor_type",
    "processor_class",
    "feature_extractor_type",
    "do_convert_rgb",
    "default_to_square",
    "use_square_size",
    "data_format",
    "input_data_format",
    "return_tensors",
    "device",
    "disable_grouping",
    "image_seq_length",
}
_KNOWN = {
    "do_resize",
    "size",
    "resample",
    "do_center_crop",
    "crop_size",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "image_mean",
    "image_std",
}
_MUST_BE_FALSE = ("do_pad", "do_reduce_labels")


def is_image_text(root: Path) -> bool:
    """A directory whose config.json names a two-tower image-text model (refused or not)."""
    try:
        # read_source_file refuses a FIFO or a device (SourceError, a ValueError): a plain read would block.
        config = json.loads(read_source_file(root / "config.json"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") in (*KINDS, *REFUSED)


@dataclass(frozen=True)
class ImageTextSource:
    root: Path
    kind: str  # "clip" | "siglip" | "siglip2"
    config: dict[str, Any]
    recipe: ImageRecipe
    weights: Path
    dimension: int  # projection_dim (CLIP) / the text hidden size (SigLIP)
    max_seq_length: int
    padding: str  # "longest" (CLIP: input_ids + attention_mask) | "max_length" (SigLIP, SigLIP2: input_ids only)
    image_size: int  # SigLIP2: 0 (each image its own patch grid)

    @property
    def text_inputs(self) -> tuple[str, ...]:
        return ("input_ids", "attention_mask") if self.kind == "clip" else ("input_ids",)


def _read(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(read_source_file(path))
    except FileNotFoundError:
        raise SourceError(f"{path}: missing") from None
    except SourceError:
        raise
    except (OSError, ValueError) as e:
        raise SourceError(f"{path}: unreadable or not JSON ({e})") from None
    if not isinstance(value, dict):
        raise SourceError(f"{path}: expected a JSON object")
    return value


def _positive(config: dict[str, Any], key: str, where: Path) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SourceError(f"{where}: {key} {value!r}; expected a positive integer")
    return value


def read_image_text(root: Path) -> ImageTextSource:
    """The directory `root` as an image-text source, or a one-line SourceError."""
    where = root / "config.json"
    config = _read(where)
    kind = config.get("model_type")
    if kind in REFUSED:
        raise SourceError(f"{where}: {REFUSED[kind]}")
    if kind not in KINDS:
        raise SourceError(f"{where}: model_type {kind!r}; image-text supports: {', '.join(KINDS)}")
    archs = config.get("architectures") or [KINDS[kind]]
    if archs != [KINDS[kind]]:
        raise SourceError(
            f"{where}: architectures {archs}; image-text packs the two-tower {KINDS[kind]} (one tower alone is not "
            "served: text and image vectors must share one space)"
        )
    text, vision = config.get("text_config") or {}, config.get("vision_config") or {}
    if not isinstance(text, dict) or not isinstance(vision, dict):
        raise SourceError(f"{where}: text_config and vision_config must be objects")
    if (root / "modules.json").exists():
        raise SourceError(f"{root / 'modules.json'}: a sentence-transformers CLIP wrapper; pass its model folder")
    weights = root / "model.safetensors"
    if not weights.is_file():
        raise SourceError(f"{root}: no model.safetensors (the only weights format image-text packs)")
    if not (root / "tokenizer.json").is_file() and not (root / "tokenizer_config.json").is_file():
        raise SourceError(f"{root}: no tokenizer (tokenizer.json or tokenizer_config.json with its vocabulary)")
    if (root / "tokenizer.json").is_file() and "vocab_size" in text:  # absent: the class's default, as built
        check_tokenizer_json(root / "tokenizer.json", _positive(text, "vocab_size", where))
    text_positions = _positive(text, "max_position_embeddings", where) if "max_position_embeddings" in text else 64
    image_size = _positive(vision, "image_size", where) if "image_size" in vision else 224
    if kind == "siglip2":
        image_size = 0
    if kind == "clip":
        dimension = _positive(config, "projection_dim", where) if "projection_dim" in config else 512
    else:
        dimension = _positive(text, "hidden_size", where) if "hidden_size" in text else 768
    recipe = read_recipe(root / "preprocessor_config.json", kind, image_size)
    padding = "longest" if kind == "clip" else "max_length"
    return ImageTextSource(root, kind, config, recipe, weights, dimension, text_positions, padding, image_size)


def _size(value: Any, where: str) -> tuple[str, tuple[int, int]]:
    if isinstance(value, int) and not isinstance(value, bool):
        return "fixed", (value, value)
    if isinstance(value, dict):
        keys = set(value)
        if keys == {"shortest_edge"} and isinstance(value["shortest_edge"], int):
            return "shortest_edge", (value["shortest_edge"], 0)
        if keys == {"height", "width"} and all(isinstance(v, int) for v in value.values()):
            return "fixed", (value["height"], value["width"])
    raise SourceError(f"{where}: size {value!r}; supported: {{shortest_edge}} or {{height, width}}")


def read_recipe(path: Path, kind: str, image_size: int) -> ImageRecipe:
    """preprocessor_config.json → the run time's recipe, with the processor class's defaults where a key is
    absent; any setting whose effect we do not reproduce is refused, naming it."""
    raw = _read(path)
    if kind == "siglip2":
        return _naflex_recipe(raw, path)
    ptype = raw.get("image_processor_type") or raw.get("feature_extractor_type")
    if ptype not in PROCESSORS[kind]:
        raise SourceError(
            f"{path}: image_processor_type {ptype!r}; supported for {kind}: {', '.join(PROCESSORS[kind])}"
        )
    for key in _MUST_BE_FALSE:
        if raw.get(key):
            raise SourceError(f"{path}: {key}=true is not supported")
    unknown = sorted(set(raw) - _IGNORED - _KNOWN - set(_MUST_BE_FALSE))
    if unknown:
        raise SourceError(
            f"{path}: settings {', '.join(unknown)} are not supported; supported: {', '.join(sorted(_KNOWN))}"
        )
    if raw.get("do_convert_rgb") is False:
        raise SourceError(f"{path}: do_convert_rgb=false is not supported (images are always converted to RGB)")
    clip = kind == "clip"
    resize, size = ("none", (0, 0))
    if raw.get("do_resize", True):
        default: Any = {"shortest_edge": 224} if clip else {"height": 224, "width": 224}
        resize, size = _size(raw.get("size", default), str(path))
    resample = raw.get("resample", 3)
    if resample not in RESAMPLE:
        raise SourceError(f"{path}: resample {resample!r}; valid: {sorted(RESAMPLE)} (PIL's filters)")
    crop = None
    if raw.get("do_center_crop", clip):
        mode, crop = _size(raw.get("crop_size", {"height": 224, "width": 224}), str(path))
        if mode != "fixed":
            raise SourceError(f"{path}: crop_size {raw.get('crop_size')!r}; expected {{height, width}}")
    scale = float(raw.get("rescale_factor", 1 / 255)) if raw.get("do_rescale", True) else None
    mean = std = None
    if raw.get("do_normalize", True):
        clip_mean, clip_std = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
        mean = raw.get("image_mean", clip_mean if clip else [0.5, 0.5, 0.5])
        std = raw.get("image_std", clip_std if clip else [0.5, 0.5, 0.5])
    try:
        recipe = ImageRecipe.parse(
            {
                "resize": resize,
                "size": list(size),
                "resample": resample,
                "crop": list(crop) if crop else None,
                "scale": scale,
                "mean": mean,
                "std": std,
            }
        )
    except ValueError as e:
        raise SourceError(f"{path}: {e}") from None
    if recipe.out_size != (image_size, image_size):
        raise SourceError(
            f"{path}: images come out {recipe.out_size or 'of varying size'}; the vision tower takes "
            f"{image_size}x{image_size} (vision_config.image_size)"
        )
    return recipe


_NAFLEX_KNOWN = {"patch_size", "max_num_patches", "resample", "do_rescale", "rescale_factor", "do_normalize"}
_NAFLEX_KNOWN |= {"image_mean", "image_std", "do_resize"}


def _naflex_recipe(raw: dict[str, Any], path: Path) -> ImageRecipe:
    """Siglip2ImageProcessor's settings (its defaults where absent) → a "naflex" recipe; others refused."""
    ptype = raw.get("image_processor_type") or raw.get("feature_extractor_type")
    if ptype not in PROCESSORS["siglip2"]:
        raise SourceError(
            f"{path}: image_processor_type {ptype!r}; supported for siglip2: {', '.join(PROCESSORS['siglip2'])}"
        )
    unknown = sorted(set(raw) - _IGNORED - _NAFLEX_KNOWN - {"size"})
    if unknown:
        raise SourceError(
            f"{path}: settings {', '.join(unknown)} are not supported; supported: {', '.join(sorted(_NAFLEX_KNOWN))}"
        )
    if raw.get("do_convert_rgb") is False:
        raise SourceError(f"{path}: do_convert_rgb=false is not supported (images are always converted to RGB)")
    if raw.get("do_resize") is False:  # patches must be whole: NaFlex resizes every image
        raise SourceError(f"{path}: do_resize=false is not supported (NaFlex resizes every image)")
    resample = raw.get("resample", 2)
    if resample not in RESAMPLE:
        raise SourceError(f"{path}: resample {resample!r}; valid: {sorted(RESAMPLE)} (PIL's filters)")
    try:
        return ImageRecipe.parse(
            {
                "resize": "naflex",
                "size": [raw.get("patch_size", 16), raw.get("max_num_patches", 256)],
                "resample": resample,
                "crop": None,
                "scale": float(raw.get("rescale_factor", 1 / 255)) if raw.get("do_rescale", True) else None,
                "mean": raw.get("image_mean", [0.5, 0.5, 0.5]) if raw.get("do_normalize", True) else None,
                "std": raw.get("image_std", [0.5, 0.5, 0.5]) if raw.get("do_normalize", True) else None,
            }
        )
    except ValueError as e:
        raise SourceError(f"{path}: {e}") from None
