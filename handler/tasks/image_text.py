"""`image-text`: CLIP / SigLIP / SigLIP2, text and images embedded into one space.

`{"inputs": [...], "modality"?: "text" | "image", "encoding_format"?}` → `{"embeddings", "model", "usage"}`,
as Infinity's `modality` on `/embeddings`: a request is all texts (the default) or all images, each image a base64
string or a `data:image/...;base64,` URL (a URL is refused: the function fetches nothing from the internet).
Vectors are L2-normalized (transformers' get_text_features / get_image_features, then divided by their norm:
what CLIP and SigLIP score with), so a text's and an image's dot product is their cosine.

The pack holds two graphs (handler.backends.towers): the text tower is the manifest's main graph, the image
tower its `towers.image`. The images are prepared by handler.tasks.pixels (Pillow + numpy).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from handler.backends.contract import Backend
from handler.backends.pool import BufferPool
from handler.core.config import Config
from handler.core.errors import InvalidInputError, TooManyInputsError
from handler.core.manifest import Manifest
from handler.core.types import JSON
from handler.tasks.batch import Prepared, run_prepared
from handler.tasks.pixels import ImageRecipe, decode, image_bytes, pixel_feeds
from handler.tasks.spec import MODEL, USAGE, VECTOR_OR_BASE64, TaskSpec, nullable
from handler.tasks.text import TEXT_ROUTES, TextModel, base64_rows, check_texts, choice, encoding_format

if TYPE_CHECKING:  # types only: numpy.typing's import dedents docstrings with regexes, at init
    import numpy.typing as npt

MODALITIES = ("text", "image")
IMAGES_PER_RUN = 16  # images in one model run: bounds the vision tower's activation memory
IMAGE_OUTPUT = "image_embeds"


class PreparedImages:
    """One image request, checked and decoded into the vision tower's feeds, and how its rows become its answer."""

    __slots__ = ("finish", "pixels")

    def __init__(self, pixels: dict[str, npt.NDArray[Any]], finish: Callable[[Any, int], dict[str, Any]]) -> None:
        self.pixels = pixels
        self.finish = finish


def normalized(vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.where(norms > 0, norms, 1)).astype(np.float32)


class ImageTextTask(TextModel):
    name = "image-text"

    def __init__(self, manifest: Manifest, backend: Backend, config: Config, pool: BufferPool | None = None) -> None:
        super().__init__(manifest, backend, config, pool)
        self.recipe: ImageRecipe = manifest.options["image"]
        self.dimension = manifest.dimension
        if manifest.options["padding"] == "max_length":
            # SigLIP reads its text vector at the last position: every text is padded to the full window, as
            # its processor does (padding="max_length"). This encoder is this tokenizer file's alone.
            tok = self.encoder._tok
            pad_token = tok.id_to_token(self.encoder.pad_id) or "<pad>"
            tok.enable_padding(
                pad_id=self.encoder.pad_id,
                pad_token=pad_token,
                length=self.encoder.max_length,
                direction=manifest.options["padding_side"],  # SigLIP2's tokenizer pads on the left
            )

    # -- requests --------------------------------------------------------------------------------------------

    def _options(self, payload: JSON) -> tuple[str, list[Any], str]:
        if not isinstance(payload, dict) or "inputs" not in payload:
            raise InvalidInputError('request must be a JSON object with "inputs"')
        modality = choice(payload, "modality", MODALITIES, "text")
        fmt = encoding_format(payload)
        if modality == "text":
            return modality, check_texts(payload["inputs"], "inputs", self.max_inputs, self.max_chars), fmt
        inputs = payload["inputs"]
        inputs = [inputs] if isinstance(inputs, str) else inputs
        if not isinstance(inputs, list) or not inputs:
            raise InvalidInputError('"inputs" must be a non-empty list of images (base64 strings or data URLs)')
        if len(inputs) > self.max_inputs:
            raise TooManyInputsError(
                f"{len(inputs)} images; at most {self.max_inputs} per request (WARMSTART_MAX_INPUTS)"
            )
        return modality, inputs, fmt

    def pixels(self, inputs: Sequence[Any]) -> dict[str, npt.NDArray[Any]]:
        """Each image checked, decoded within bounds and prepared as the model's processor would: the vision
        tower's feeds (`pixel_values`; SigLIP2 adds `pixel_attention_mask` and `spatial_shapes`)."""
        images = [decode(image_bytes(value, f"inputs[{i}]"), f"inputs[{i}]") for i, value in enumerate(inputs)]
        return pixel_feeds(images, self.recipe)

    def _answer(self, vectors: npt.NDArray[np.float32], tokens: int, fmt: str) -> dict[str, Any]:
        vectors = normalized(vectors)
        embeddings = base64_rows(vectors) if fmt == "base64" else vectors
        return {"embeddings": embeddings, "model": self.model, "usage": {"tokens": tokens}}

    def embed_images(self, pixels: dict[str, npt.NDArray[Any]]) -> npt.NDArray[np.float32]:
        rows = len(pixels["pixel_values"])
        outs = [
            np.array(
                self.backend.run({k: v[i : i + IMAGES_PER_RUN] for k, v in pixels.items()})[IMAGE_OUTPUT], np.float32
            )
            for i in range(0, rows, IMAGES_PER_RUN)
        ]
        return np.concatenate(outs)

    def __call__(self, payload: JSON) -> dict[str, Any]:
        modality, inputs, fmt = self._options(payload)
        if modality == "image":
            return self._answer(self.embed_images(self.pixels(inputs)), 0, fmt)
        with self.pool.request():
            vectors, tokens = self._run(inputs)
            return self._answer(vectors, tokens, fmt)

    # -- dynamic batching (the HTTP host): texts with texts, images with images -----------------------------

    def prepare(self, payload: JSON) -> Prepared | PreparedImages:
        modality, inputs, fmt = self._options(payload)
        finish = lambda rows, tokens: self._answer(rows, tokens, fmt)  # noqa: E731
        if modality == "image":
            return PreparedImages(self.pixels(inputs), finish)
        return Prepared(self.encoder.tokenize(inputs), finish)

    def run_batch(
        self,
        prepared: Sequence[Prepared | PreparedImages],
        max_tokens: int,
        report: Callable[[int, Any], None] | None = None,
        wanted: Callable[[int], bool] | None = None,
    ) -> list[Any]:
        """`handler.tasks.batch.run_prepared` for the texts; the images' pixels run together, IMAGES_PER_RUN at
        a time, and a failed run is tried again one request at a time (each gets its own answer or error)."""
        texts = [i for i, p in enumerate(prepared) if isinstance(p, Prepared)]
        images = [i for i, p in enumerate(prepared) if isinstance(p, PreparedImages) and (wanted is None or wanted(i))]
        results: list[Any] = [None] * len(prepared)
        if texts:
            done = run_prepared(
                self,
                [prepared[i] for i in texts],  # type: ignore[misc]
                max_tokens,
                None if report is None else lambda j, outcome: report(texts[j], outcome),
                None if wanted is None else lambda j: wanted(texts[j]),
            )
            for j, i in enumerate(texts):
                results[i] = done[j]
        if images:
            self._run_images([(i, prepared[i]) for i in images], results)  # type: ignore[misc]
            if report is not None:
                for i in images:
                    report(i, results[i])
        return results

    def _run_images(self, items: list[tuple[int, PreparedImages]], results: list[Any]) -> None:
        try:
            out = self.embed_images({k: np.concatenate([p.pixels[k] for _, p in items]) for k in items[0][1].pixels})
        except Exception:
            if len(items) == 1:
                raise
            for one in items:
                try:
                    self._run_images([one], results)
                except Exception as e:
                    results[one[0]] = e
            return
        row = 0
        for i, p in items:
            n = len(p.pixels["pixel_values"])
            try:
                results[i] = p.finish(out[row : row + n], 0)
            except Exception as e:
                results[i] = e
            row += n

    def warmup(self) -> None:
        # Text only: the image tower is built on the first image request (handler.backends.towers), so a
        # text-only instance never loads it; that request pays its session's build and first run.
        self({"inputs": ["warm-up"]})


def manifest_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The image recipe, the text padding rule, and an image tower, checked."""
    padding = (raw.get("tokenizer") or {}).get("padding", "longest")
    if padding not in ("longest", "max_length"):
        raise ValueError(f"tokenizer.padding {padding!r}; valid: longest, max_length")
    side = (raw.get("tokenizer") or {}).get("padding_side", "right")
    if side not in ("right", "left"):
        raise ValueError(f"tokenizer.padding_side {side!r}; valid: right, left")
    towers = raw.get("towers")
    if not isinstance(towers, dict) or "image" not in towers:
        raise ValueError("an image-text pack needs towers.image (the vision tower's graph)")
    return {"image": ImageRecipe.parse(raw.get("image")), "padding": padding, "padding_side": side}


IMAGES: dict[str, Any] = {
    "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}],
    "description": 'texts, or with "modality": "image" images as base64 strings or data:image/...;base64, URLs '
    "(never fetched URLs)",
}
SPEC = TaskSpec(
    name=ImageTextTask.name,
    factory=ImageTextTask,
    request={
        "title": "image-text",
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "inputs": IMAGES,
            "modality": nullable({"enum": list(MODALITIES)}),
            "model": MODEL,
            "encoding_format": nullable({"enum": ["float", "base64"]}),
        },
    },
    example={"inputs": "a photo of a cat"},
    answer={
        "title": "image-text",
        "type": "object",
        "required": ["embeddings", "model", "usage"],
        "properties": {
            "embeddings": {"type": "array", "items": VECTOR_OR_BASE64},
            "model": {"type": "string"},
            "usage": USAGE,
        },
    },
    fields=manifest_fields,
    routes=("/embeddings", "/v1/embeddings", *TEXT_ROUTES),
    batches=True,
    tei_kind="embedding",
    tei_info=lambda manifest: {
        "pooling": "image-text",
        "modalities": list(MODALITIES),
        "dimension": manifest.dimension,
    },
    tei_info_schema={"type": "object", "required": ["pooling"], "properties": {"pooling": {"type": "string"}}},
)
