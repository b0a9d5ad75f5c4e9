"""The torch backend's artifact: the same module hf_export exports to ONNX (the stock transformers model plus
the task's head), captured with `torch.export` and saved as torch.export's own serialized program
(`torch._export.serde`, JSON) *without* its weights, which go to `model.safetensors` under the program's
parameter names. The run-time side is `handler.backends.program` (no torch deserializer, nothing unpickled).

Attention: transformers' "sdpa" (one `aten.scaled_dot_product_attention` per layer, the kernel the
hand-written encoder calls); MPNet's attention is its own (relative position bias) and stays "eager".
Batch and sequence are dynamic (sequence up to the model's max_seq_length). The program is run through the
run-time interpreter against the eager module on the probe batches and on a 1x1 batch before it is kept.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.pack.hf_source import HFSource

PROGRAM_FILE = "program.json"
ATOL = 1e-4  # max abs difference against the eager module, as the ONNX export's check
MAX_BATCH = 1 << 16


class ProgramExportError(RuntimeError):
    """torch.export could not capture the model, or the program does not reproduce it (never packed)."""


@dataclass(frozen=True)
class ExportedProgram:
    program: bytes  # program.json
    tensors: dict[str, Any]  # the program's parameters, buffers and constants by name (torch tensors)
    max_abs_diff: float


def export_program(source: HFSource, safetensors_dir: Path) -> ExportedProgram:
    import torch
    from torch._export.serde.serialize import serialize

    from handler.backends.program import load, parameter_names
    from infra.pack.hf_export import build_head, input_names, load_torch_model, probe_batches

    model = load_torch_model(source, safetensors_dir)
    if source.family != "mpnet":
        model.set_attn_implementation("sdpa")
    head = build_head(source, model)
    names = input_names(source)
    probes = probe_batches(source, int(source.config["vocab_size"]))
    probes.append({k: v[:1, :1] for k, v in probes[0].items()})  # the smallest batch: one row, one token
    example = tuple(torch.from_numpy(probes[1][n]) for n in names)  # padded rows: the masked path is traced
    batch = torch.export.Dim("batch", max=MAX_BATCH)
    sequence = torch.export.Dim("sequence", max=source.max_seq_length)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.export(
                head, example, dynamic_shapes={n: {0: batch, 1: sequence} for n in names}, strict=False
            )
            artifact = serialize(
                ep, serialize_state_dict=False, serialize_constants=False, serialize_example_inputs=False
            )
    except Exception as e:  # torch.export raises many types (UserError, GuardOnDataDependentSymNode, ...)
        raise ProgramExportError(
            f"{source.root}: torch.export cannot capture the model ({type(e).__name__}: {e})"
        ) from e
    raw = json.loads(artifact.exported_program)
    for node in raw["graph_module"]["graph"]["nodes"]:
        node["metadata"] = {}  # stack traces and module paths of the pack machine: not needed to run
    program = json.dumps(raw, separators=(",", ":"), allow_nan=False).encode()
    state = {**ep.state_dict, **ep.constants}
    tensors: dict[str, Any] = {}
    for name in parameter_names(raw).values():
        value = state.get(name)
        if not isinstance(value, torch.Tensor):
            raise ProgramExportError(
                f"{source.root}: the program's input {name!r} is not a tensor ({type(value).__name__})"
            )
        # Own storage each (safetensors refuses shared storage: tied weights), contiguous, float32 as loaded.
        tensors[name] = value.detach().clone().contiguous()
    diff = _check(source, program, tensors, head, names, probes, load)
    return ExportedProgram(program, tensors, diff)


def _check(
    source: HFSource,
    program: bytes,
    tensors: dict[str, Any],
    head: Any,
    names: tuple[str, ...],
    probes: list[dict[str, Any]],
    load: Any,
) -> float:
    import tempfile

    import torch

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / PROGRAM_FILE
        path.write_bytes(program)
        run = load(path, tensors)
    diff = 0.0
    with torch.inference_mode():
        for probe in probes:
            feeds = [torch.from_numpy(probe[n]) for n in names]
            got = run(*feeds)[0]
            want = head(*feeds)
            if got.shape != want.shape:
                raise ProgramExportError(
                    f"{source.root}: the program answers shape {tuple(got.shape)}, the model {tuple(want.shape)}"
                )
            diff = max(diff, float((got - want).abs().max()) if want.numel() else 0.0)
    if not diff <= ATOL:
        raise ProgramExportError(f"{source.root}: the exported program differs from the model by {diff:.3g} (> {ATOL})")
    return diff
