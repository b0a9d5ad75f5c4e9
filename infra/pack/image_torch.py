"""`pack --from DIR --backends onnx,torch` for image-text: each tower as torch.export's program for the torch backend.

The same module each tower's ONNX graph is exported from (image_pack._Tower: get_text_features /
get_image_features' pooled, projected output), captured with torch.export (batch dynamic; CLIP's text sequence
too), written as infra.pack.torch_program writes an encoder's program (program.json without weights, weights in
model.safetensors under the program's parameter names, only operators the run-time interpreter allows), and run
through that interpreter on the probes against eager before it is kept. handler.backends.towers then holds one
torch backend per tower, as it does for onnx.
"""

from __future__ import annotations

import json
import warnings
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
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.export(module, feeds[-1], dynamic_shapes=tuple(axes for _ in names), strict=False)
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

    kinds = {("pixel_values",): Pixels, ("input_ids",): Ids, ("input_ids", "attention_mask"): IdsAndMask}
    return kinds[names]().eval()
