"""The torch backend's artifact: the same module hf_export exports to ONNX (the stock transformers model plus
the task's head), captured with `torch.export` and saved as torch.export's own serialized program
(`torch._export.serde`, JSON) *without* its weights, which go to `model.safetensors` under the program's
parameter names. The run-time side is `handler.backends.program` (no torch deserializer, nothing unpickled).

Attention: transformers' "sdpa" where the model's class has it (one `aten.scaled_dot_product_attention` per
layer, the kernel the hand-written encoder calls), else the attention the model was loaded with (MPNet's own,
relative position bias; DeBERTa's disentangled attention); an sdpa program that does not match is replaced by
one captured with the loaded attention. Batch and sequence are dynamic (sequence up to the model's
max_seq_length). The program is run through the run-time interpreter on the probe batches and on a 1x1 batch
against the module the ONNX graph is checked against (the model as loaded, before its attention is switched)
before it is kept.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.pack.hf_source import HFSource

if TYPE_CHECKING:
    from infra.pack.hf_export import Reference

PROGRAM_FILE = "program.json"
ATOL = 1e-4  # max abs difference against the eager module, as the ONNX export's check
MAX_BATCH = 1 << 16


class ProgramExportError(RuntimeError):
    """torch.export could not capture the model, or the program does not reproduce it (never packed)."""


@dataclass(frozen=True)
class ExportedProgram:
    program: bytes  # program.json
    tensors: dict[str, Any]  # the program's parameters, buffers and constants by name (torch tensors)
    max_abs_diff: float  # against the model as loaded (the module the ONNX graph is checked against)
    attention: str  # transformers' attention implementation the program was captured with


def export_program(
    source: HFSource, safetensors_dir: Path, model: Any = None, reference: Reference | None = None
) -> ExportedProgram:
    """The program of `model` (else loaded from `safetensors_dir`) with the task's head, checked against the
    module the ONNX graph is checked against: the model as loaded (eager attention, or hf_export's), its outputs
    (`reference`, else computed here) taken before the attention is switched. Attention: "sdpa" first where
    transformers has it for the model (MPNet has not), then the attention as loaded; the first program that
    matches is kept. `model` is left as it came (its attention restored)."""
    import torch

    from infra.pack.hf_export import build_head, input_names, load_torch_model, reference_outputs

    if model is None:
        model = load_torch_model(source, safetensors_dir)
    head = build_head(source, model)
    names = input_names(source)
    reference = reference or reference_outputs(source, model)  # the probes, then one row of one token
    feeds = [tuple(torch.from_numpy(p[n]) for n in names) for p in reference.probes]
    want = [torch.from_numpy(o) for o in reference.outputs]
    loaded = model.config._attn_implementation
    failures: list[str] = []
    try:
        for attention in _attentions(source, model, loaded):
            try:
                return _export(source, head, names, feeds, want, attention)
            except ProgramExportError as e:
                failures.append(f"{attention} attention: {e}")
    finally:
        if model.config._attn_implementation != loaded:
            model.set_attn_implementation(loaded)
    raise ProgramExportError(f"{source.root}: " + "; ".join(failures))


def _attentions(source: HFSource, model: Any, loaded: str) -> list[str]:
    """The attention implementations to try, in order: "sdpa" (one `aten.scaled_dot_product_attention` per
    layer) where the model's class has it, then the one it was loaded with."""
    if source.family == "mpnet" or not getattr(model, "_supports_sdpa", False) or loaded == "sdpa":
        return [loaded]
    return ["sdpa", loaded]


def _export(
    source: HFSource,
    head: Any,
    names: tuple[str, ...],
    feeds: list[tuple[Any, ...]],
    want: list[Any],
    attention: str,
) -> ExportedProgram:
    import torch
    from torch._export.serde.serialize import serialize

    from handler.backends.program import parameter_names

    model = head.model
    if model.config._attn_implementation != attention:
        model.set_attn_implementation(attention)
    batch = torch.export.Dim("batch", max=MAX_BATCH)
    sequence = torch.export.Dim("sequence", max=source.max_seq_length)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.export(  # padded rows (feeds[1]): the masked path is traced
                head, feeds[1], dynamic_shapes={n: {0: batch, 1: sequence} for n in names}, strict=False
            )
            artifact = serialize(
                ep, serialize_state_dict=False, serialize_constants=False, serialize_example_inputs=False
            )
    except Exception as e:  # torch.export raises many types (UserError, GuardOnDataDependentSymNode, ...)
        raise ProgramExportError(f"torch.export cannot capture the model ({type(e).__name__}: {_short(e)})") from e
    raw = json.loads(artifact.exported_program)
    for node in raw["graph_module"]["graph"]["nodes"]:
        node["metadata"] = {}  # stack traces and module paths of the pack machine: not needed to run
    program = json.dumps(raw, separators=(",", ":"), allow_nan=False).encode()
    state = {**ep.state_dict, **ep.constants}
    tensors: dict[str, Any] = {}
    storages: set[int] = set()
    for name in parameter_names(raw).values():
        value = state.get(name)
        if not isinstance(value, torch.Tensor):
            raise ProgramExportError(f"the program's input {name!r} is not a tensor ({type(value).__name__})")
        # Contiguous, one storage each (safetensors refuses shared storage: tied weights get a copy), float32 as
        # loaded; the others are the model's own tensors, not copies (the model's size in memory, not twice it).
        tensor = value.detach()
        storage = tensor.untyped_storage().data_ptr()
        if storage in storages or not tensor.is_contiguous():
            tensor = tensor.clone(memory_format=torch.contiguous_format)
        storages.add(tensor.untyped_storage().data_ptr())
        tensors[name] = tensor
    del ep, state
    diff = _check(program, tensors, feeds, want)
    return ExportedProgram(program, tensors, diff, attention)


def _check(program: bytes, tensors: dict[str, Any], feeds: list[tuple[Any, ...]], want: list[Any]) -> float:
    """Run the program through the run-time interpreter on every probe batch; its largest difference from
    `want` (the model's outputs)."""
    import tempfile

    import torch

    from handler.backends.program import load

    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / PROGRAM_FILE
            path.write_bytes(program)
            run = load(path, tensors)
        diff = 0.0
        with torch.inference_mode():
            for feed, expected in zip(feeds, want, strict=True):
                got = run(*feed)[0]
                if got.shape != expected.shape:
                    raise ProgramExportError(
                        f"the program answers shape {tuple(got.shape)}, the model {tuple(expected.shape)}"
                    )
                diff = max(diff, float((got - expected).abs().max()) if expected.numel() else 0.0)
    except ProgramExportError:
        raise
    except Exception as e:  # the interpreter refuses it (ProgramError) or an operator fails on a probe batch
        raise ProgramExportError(f"the run-time interpreter cannot run it ({type(e).__name__}: {_short(e)})") from e
    if not diff <= ATOL:
        raise ProgramExportError(f"the exported program differs from the model by {diff:.3g} (> {ATOL})")
    return diff


def _short(error: BaseException) -> str:
    return " ".join(str(error).split())[:400]
