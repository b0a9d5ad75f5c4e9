"""`warmstart pack --from DIR` for a CLIP / SigLIP / SigLIP2 directory: task `image-text`, two graphs in one pack.

text/model.onnx: the text tower with its projection (transformers' `get_text_features`), image/model.onnx: the
vision tower with its projection (`get_image_features`); both checked against the eager model before anything
is published (their largest differences go into the manifest's `parity`). The image preprocessing is written
as the manifest's `image` recipe (handler.tasks.pixels runs it with Pillow + numpy).

Backends: onnx by default; `--backends onnx,torch` (or torch) adds text/program.json and image/program.json,
torch.export's program of each tower (infra.pack.image_torch; SigLIP2's NaFlex tower included), one torch
backend per tower at run time (handler.backends.towers).
int8 / int8-block: both towers quantized, each behind the quality gate (infra.pack.image_int8: the text tower
on the built-in calibration texts, the image tower on calibration images generated at pack time, SigLIP2's as
NaFlex patches of each image's own grid). The torch programs stay float32 (torch with int8 is refused).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from handler.core.manifest import FORMAT, FORMAT_VERSION, TensorSpec
from infra.pack.hf_checks import SourceError, one_line
from infra.pack.image_source import ImageTextSource, read_image_text
from infra.pack.onnx_io import ONNX_DATA, ONNX_FILE, OPSET
from infra.pack.precision import Precision
from infra.pack.progress import phase
from infra.pack.publish import check_model_id, check_output, default_id, default_version, publish

TASK = "image-text"
TOWERS = ("text", "image")
OUTPUTS = {"text": "text_embeds", "image": "image_embeds"}
ATOL = 1e-4  # the graphs against eager transformers (float32)
BACKENDS = ("onnx", "torch")  # torch: one torch.export program per tower (infra.pack.image_torch), on request
ONNX_FILES = (ONNX_FILE, ONNX_DATA)


def pack_image_text(
    source_dir: Path,
    out: Path,
    *,
    model_id: str | None = None,
    version: str | None = None,
    backends: Iterable[str] | None = None,
    force: bool = False,
    source_info: dict[str, str] | None = None,
    precision: Precision | None = None,
) -> Path:
    """Pack the CLIP / SigLIP / SigLIP2 directory `source_dir` into `out`; refusals (SourceError) before any write."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # transformers must never reach for a hub from here
    phase("reading the model directory")
    source = read_image_text(Path(source_dir))
    asked = None if backends is None else list(backends)
    chosen = tuple(dict.fromkeys(b.strip() for b in asked or ("onnx",) if b.strip()))
    bad = [b for b in chosen if b not in BACKENDS] or ([] if chosen else ["(none)"])
    if bad:
        raise SourceError(f"backend {', '.join(bad)} for task {TASK}; valid: {', '.join(BACKENDS)}")
    precision = precision or Precision()
    if precision.dtype != "float32":
        raise SourceError(
            f"--dtype {precision.dtype} for task {TASK}: packed float32, or int8 for onnx (--quantize int8, int8-block)"
        )
    if precision.quantize is not None:
        # int4 (causal LMs only), or torch asked for with int8 (its programs are float), refused naming why
        chosen, _ = precision.backends(chosen, {}, asked)
    model_id = check_model_id(model_id) if model_id is not None else default_id(source.root)
    out = check_output(out, force, [source.root])
    phase("loading the weights")
    model, tokenizer = load(source)
    digest = _content_sha256(source)
    version = version or default_version(digest, TASK, precision.label)

    def build(tmp: Path) -> dict[str, Any]:
        pad_id = write_tokenizer(source, tokenizer, tmp / "tokenizer.json")
        side = str(getattr(tokenizer, "padding_side", "right"))  # SigLIP2's tokenizer pads on the left
        parity: dict[str, float] = {}
        specs: dict[str, dict[str, Any]] = {tower: {} for tower in TOWERS}
        for tower in TOWERS:
            if "onnx" in chosen:
                phase(f"exporting the {tower} tower")
                parity[tower] = export_tower(source, model, tower, tmp / tower)
                specs[tower]["onnx"] = {"model": f"{tower}/{ONNX_FILE}", "files": [f"{tower}/{n}" for n in ONNX_FILES]}
            if "torch" in chosen:
                from infra.pack.image_torch import export_tower_program

                phase(f"capturing the {tower} tower's torch program")
                names = tower_inputs(source, tower)
                module = _Tower.module(model, tower, names)
                feeds = probes(source, tower, int(model.config.text_config.vocab_size))
                specs[tower]["torch"] = export_tower_program(source, tower, module, names, feeds, tmp / tower)
                parity.setdefault(tower, specs[tower]["torch"]["max_abs_diff"])
        manifest = manifest_for(source, model_id, version, pad_id, parity, digest, source_info, specs, side)
        if precision.quantize is not None:
            from infra.pack.image_int8 import quantize_towers

            with tempfile.TemporaryDirectory() as staging:
                quality = quantize_towers(source, tokenizer, precision, tmp, Path(staging))
            manifest["precision"] = precision.entry(quality, backend="onnx")
        return manifest

    return publish(build, out, force, [source.root])


def _content_sha256(source: ImageTextSource) -> str:
    import hashlib

    from infra.pack.hf_checks import open_source

    h = hashlib.sha256()
    for name in ("config.json", "preprocessor_config.json", "model.safetensors"):
        with open_source(source.root / name) as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def load(source: ImageTextSource) -> tuple[Any, Any]:
    """transformers' two-tower model (float32, eval) and fast tokenizer, from the directory only."""
    import transformers  # pack time only

    try:
        model = transformers.AutoModel.from_pretrained(str(source.root), local_files_only=True, dtype="float32")
    except Exception as e:
        raise SourceError(f"{source.root}: transformers cannot load the model ({one_line(e)})") from None
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(source.root), local_files_only=True, use_fast=True)
    except Exception as e:
        raise SourceError(f"{source.root}: transformers cannot load its tokenizer ({one_line(e)})") from None
    return model.eval(), tokenizer


def write_tokenizer(source: ImageTextSource, tokenizer: Any, dest: Path) -> int:
    # SigLIP2: transformers' Siglip2Tokenizer rebuilds the file's vocabulary with its own normalizer (lowercased,
    # as SigLIP2 was trained) and pre-tokenizer; what it built is what is served, not the file as it lies.
    if (source.root / "tokenizer.json").is_file() and source.kind != "siglip2":
        shutil.copyfile(source.root / "tokenizer.json", dest)
    else:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise SourceError(f"{source.root}: transformers built no fast tokenizer ({type(tokenizer).__name__})")
        backend.save(str(dest))
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else 0)


class _Tower:
    """One tower as a module whose forward is transformers' get_*_features' pooled, projected output."""

    @staticmethod
    def module(model: Any, tower: str, inputs: tuple[str, ...]) -> Any:
        import torch

        class Tower(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, *args: Any) -> Any:
                feeds = dict(zip(inputs, args, strict=True))
                if tower == "text":
                    return self.model.get_text_features(**feeds).pooler_output
                return self.model.get_image_features(**feeds).pooler_output

        return Tower().eval()


def probes(source: ImageTextSource, tower: str, vocab_size: int) -> list[dict[str, Any]]:
    """Inputs the graph is checked on: two batch shapes, padded rows for CLIP's mask."""
    rng = np.random.default_rng(0)
    if tower == "image" and source.kind == "siglip2":
        # grids of one batch all differ (a single row, a single column among them): a program that kept the
        # example's grid, or one position grid for all, fails the check
        return [naflex_probe(source, grids) for grids in (((2, 3),), ((4, 4), (1, 7), (5, 2), (9, 1)))]
    if tower == "image":
        size = source.image_size
        return [{"pixel_values": rng.standard_normal((n, 3, size, size)).astype(np.float32)} for n in (1, 3)]
    out = []
    for n, length in ((1, 7), (3, 11)):
        length = source.max_seq_length if source.padding == "max_length" else length
        ids = rng.integers(5, vocab_size, (n, length)).astype(np.int64)
        eos = source.config.get("text_config", {}).get("eos_token_id")
        if source.kind == "clip" and isinstance(eos, int):
            ids[:, -1] = eos
        feed = {"input_ids": ids}
        if source.kind == "clip":
            mask = np.ones((n, length), np.int64)
            if n > 1:  # a shorter row, padded: its end-of-text sits before the padding
                mask[1, length // 2 :] = 0
                if isinstance(eos, int):
                    ids[1, length // 2 - 1] = eos
            feed["attention_mask"] = mask
        out.append(feed)
    return out


def naflex_probe(source: ImageTextSource, grids: tuple[tuple[int, int], ...]) -> dict[str, Any]:
    """SigLIP2's image feeds for patch grids (rows, cols) of different shapes: random patches, padded."""
    patch, max_patches = source.recipe.size
    rng = np.random.default_rng(len(grids))
    grids = tuple((min(r, max_patches), max(1, min(c, max_patches // min(r, max_patches)))) for r, c in grids)
    mask = np.zeros((len(grids), max_patches), np.int32)
    for i, (rows, cols) in enumerate(grids):
        mask[i, : rows * cols] = 1
    values = (rng.standard_normal((len(grids), max_patches, 3 * patch * patch)) * mask[..., None]).astype(np.float32)
    return {"pixel_values": values, "pixel_attention_mask": mask, "spatial_shapes": np.array(grids, np.int64)}


def tower_inputs(source: ImageTextSource, tower: str) -> tuple[str, ...]:
    return source.recipe.inputs if tower == "image" else source.text_inputs


def export_tower(source: ImageTextSource, model: Any, tower: str, where: Path) -> float:
    """Export one tower to `where`/model.onnx(+.data); the largest difference from eager on the probes."""
    import onnxruntime as ort
    import torch

    from infra.pack.onnx_io import save_onnx_file

    names = tower_inputs(source, tower)
    vocab = int(source.config.get("text_config", {}).get("vocab_size") or model.config.text_config.vocab_size)
    feeds = probes(source, tower, vocab)
    module = _Tower.module(model, tower, names)
    with torch.no_grad():
        want = [module(*(torch.from_numpy(f[n]) for n in names)).numpy() for f in feeds]
    dynamic: dict[str, dict[int, str]] = {n: {0: "batch"} for n in names}
    if tower == "text" and source.padding == "longest":
        dynamic = {n: {0: "batch", 1: "sequence"} for n in names}
    dynamic[OUTPUTS[tower]] = {0: "batch"}
    example = tuple(torch.from_numpy(feeds[-1][n]) for n in names)
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings: checked below
        path = Path(tmp) / ONNX_FILE
        try:
            torch.onnx.export(
                module,
                example,
                str(path),
                input_names=list(names),
                output_names=[OUTPUTS[tower]],
                dynamic_axes=dynamic,
                opset_version=OPSET,
                do_constant_folding=True,
                dynamo=False,
            )
        except Exception as e:
            raise SourceError(f"{source.root}: the {tower} tower does not export to ONNX ({one_line(e)})") from None
        save_onnx_file(path, where)
    session = ort.InferenceSession(str(where / ONNX_FILE), providers=["CPUExecutionProvider"])
    got = [session.run(None, f)[0] for f in feeds]
    diff = max(float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True))
    if not diff <= ATOL:
        raise SourceError(f"{source.root}: the exported {tower} tower differs from transformers by {diff:.3g}")
    return diff


def manifest_for(
    source: ImageTextSource,
    model_id: str,
    version: str,
    pad_id: int,
    parity: dict[str, float],
    digest: str,
    source_info: dict[str, str] | None,
    specs: dict[str, dict[str, Any]],
    padding_side: str = "right",
) -> dict[str, Any]:
    """Text tower as the manifest's main graph (inputs, outputs, tokenizer); the image tower under `towers`.
    `specs`: each tower's backend entries (paths relative to the pack); the main entry's files are both towers'."""
    sequence: int | str = source.max_seq_length if source.padding == "max_length" else "sequence"
    vector = TensorSpec("", "float32", ("batch", source.dimension))
    main = {
        name: {**entry, "files": [*entry["files"], *specs["image"][name]["files"]]}
        for name, entry in specs["text"].items()
    }
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "id": model_id,
        "version": version,
        "task": TASK,
        "default_backend": next(iter(main)),
        "source": {
            "dir": source.root.resolve().name,
            "architecture": source.config.get("architectures", ["?"])[0],
            "content_sha256": digest,
            **(source_info or {}),
        },
        "backends": main,
        "inputs": [TensorSpec(n, "int64", ("batch", sequence)).to_json() for n in source.text_inputs],
        "outputs": [{**vector.to_json(), "name": OUTPUTS["text"]}],
        "towers": {
            "image": {
                "backends": specs["image"],
                "inputs": [spec.to_json() for spec in image_inputs(source)],
                "outputs": [{**vector.to_json(), "name": OUTPUTS["image"]}],
            }
        },
        "tokenizer": {
            "file": "tokenizer.json",
            "truncation": source.max_seq_length,
            "padding": source.padding,
            "padding_side": padding_side,
            "pad_id": pad_id,
        },
        "image": source.recipe.to_json(),
        "max_seq_length": source.max_seq_length,
        "dimension": source.dimension,
        "pooling": {"normalize": True, "in_graph": False},
        "parity": {f"{tower}_max_abs_diff": value for tower, value in parity.items()},
        "precision": {"dtype": "float32", "quantization": None},
    }


def image_inputs(source: ImageTextSource) -> list[TensorSpec]:
    if source.recipe.resize != "naflex":
        size = source.image_size
        return [TensorSpec("pixel_values", "float32", ("batch", 3, size, size))]
    patch, max_patches = source.recipe.size
    return [
        TensorSpec("pixel_values", "float32", ("batch", max_patches, 3 * patch * patch)),
        TensorSpec("pixel_attention_mask", "int32", ("batch", max_patches)),
        TensorSpec("spatial_shapes", "int64", ("batch", 2)),
    ]
