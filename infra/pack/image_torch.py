"""`pack --from DIR --backends onnx,torch` for image-text: each tower as torch.export's program for the torch backend.

The same module each tower's ONNX graph is exported from (image_pack._Tower: get_text_features /
get_image_features' pooled, projected output), captured with torch.export (batch dynamic; CLIP's text sequence
too), written as infra.pack.torch_program writes an encoder's program (program.json without weights, weights in
model.safetensors under the program's parameter names, only operators the run-time interpreter allows), and run
through that interpreter on the probes against eager before it is kept. handler.backends.towers then holds one
torch backend per tower, as it does for onnx.

SigLIP2's NaFlex vision tower: transformers resizes the position embeddings to each image's `spatial_shapes` with
plain tensor arithmetic (F.interpolate's bilinear + antialias weights, built per image), which torch.export
captures with the batch dynamic. What it cannot run is the two input checks before it (`torch_compilable_check`:
every grid positive and within max_num_patches): under export they become `aten.all` -> `_is_all_true` ->
`item` -> `sym_ite` -> `_assert_scalar`, a data-dependent boolean the run-time interpreter has no value for. They
are switched off for the capture (transformers' own TRANSFORMERS_DISABLE_TORCH_CHECK, read per call) and their
now unused `all` nodes dropped: the run time's grids come from handler.tasks.pixels.naflex_size, which keeps
them within both bounds (the ONNX graph holds no such check either).
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from infra.pack.hf_checks import SourceError, one_line
from infra.pack.image_source import ImageTextSource

WEIGHTS_FILE = "model.safetensors"


def export_tower_program(
    source: ImageTextSource, tower: str, module: Any, names: tuple[str, ...], probes: list[dict[str, Any]], where: Path
) -> dict[str, Any]:
    """Write `where`/program.json + model.safetensors for one tower (`module`, image_pack._Tower's, fed `names`;
    checked on the `probes`); the torch backend's manifest entry (paths relative to the pack: `tower`/...)."""
    import torch
    from safetensors.torch import save_file
    from torch._export.serde.serialize import serialize

    from handler.backends.program import parameter_names
    from infra.pack.torch_program import MAX_BATCH, PROGRAM_FILE, ProgramExportError, _check, allowed_only

    feeds = [tuple(torch.from_numpy(f[n]) for n in names) for f in probes]
    attention = module.model.config._attn_implementation
    module = _named(module, names)
    with torch.no_grad():
        want = [module(*f) for f in feeds]
    batch = torch.export.Dim("batch", max=MAX_BATCH)
    axes: dict[int, Any] = {0: batch}
    if tower == "text" and source.padding == "longest":
        axes[1] = torch.export.Dim("sequence", max=source.max_seq_length)
    try:
        with torch.no_grad(), warnings.catch_warnings(), _no_input_checks():
            warnings.simplefilter("ignore")
            ep = torch.export.export(module, feeds[-1], dynamic_shapes=tuple(axes for _ in names), strict=False)
            ep.graph_module.graph.eliminate_dead_code()  # the checks' conditions, computed and never read
            artifact = serialize(
                ep, serialize_state_dict=False, serialize_constants=False, serialize_example_inputs=False
            )
        raw = json.loads(artifact.exported_program)
        for node in raw["graph_module"]["graph"]["nodes"]:
            node["metadata"] = {}  # the pack machine's stack traces: not needed to run
        allowed_only(raw)
        program = json.dumps(raw, separators=(",", ":"), allow_nan=False).encode()
        state = {**ep.state_dict, **ep.constants}
        # one storage each, contiguous (safetensors refuses shared storage)
        tensors = {n: state[n].detach().clone().contiguous() for n in parameter_names(raw).values()}
        diff = _check(program, tensors, feeds, want)
    except (ProgramExportError, KeyError) as e:
        raise SourceError(f"{source.root}: the {tower} tower's torch program: {one_line(e)}") from None
    except Exception as e:  # torch.export raises many types (UserError, GuardOnDataDependentSymNode, ...)
        raise SourceError(f"{source.root}: torch.export cannot capture the {tower} tower ({one_line(e)})") from None
    where.mkdir(parents=True, exist_ok=True)
    (where / PROGRAM_FILE).write_bytes(program)
    save_file(tensors, str(where / WEIGHTS_FILE))
    files = [f"{tower}/{PROGRAM_FILE}", f"{tower}/{WEIGHTS_FILE}"]
    return {
        "architecture": "exported-program",
        "program": files[0],
        "weights": files[1],
        "files": files,
        "exported_with": {"torch": torch.__version__},
        "attention": attention,
        "max_abs_diff": float(np.float32(diff)),
    }


@contextlib.contextmanager
def _no_input_checks() -> Iterator[None]:
    """transformers' torch_compilable_check off while torch.export captures (see the module docstring)."""
    key = "TRANSFORMERS_DISABLE_TORCH_CHECK"
    before = os.environ.get(key)
    os.environ[key] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def _named(tower: Any, names: tuple[str, ...]) -> Any:
    """`tower` with a forward whose parameters are named as the manifest's inputs: the program's input names are
    the forward's (the torch backend checks them against the manifest)."""
    import torch

    class Pixels(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tower = tower

        def forward(self, pixel_values: Any) -> Any:
            return self.tower(pixel_values)

    class Ids(Pixels):
        def forward(self, input_ids: Any) -> Any:
            return self.tower(input_ids)

    class IdsAndMask(Pixels):
        def forward(self, input_ids: Any, attention_mask: Any) -> Any:  # type: ignore[override]
            return self.tower(input_ids, attention_mask)

    class NaFlex(Pixels):  # SigLIP2: patches, which of them are real, each image's patch grid
        def forward(self, pixel_values: Any, pixel_attention_mask: Any, spatial_shapes: Any) -> Any:  # type: ignore[override]
            return self.tower(pixel_values, pixel_attention_mask, spatial_shapes)

    kinds = {
        ("pixel_values",): Pixels,
        ("input_ids",): Ids,
        ("input_ids", "attention_mask"): IdsAndMask,
        ("pixel_values", "pixel_attention_mask", "spatial_shapes"): NaFlex,
    }
    return kinds[names]().eval()
