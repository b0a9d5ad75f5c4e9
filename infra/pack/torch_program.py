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

The program holds only the operators the run time allows (handler/backends/program_ops.py): the two in-place
ones torch.export emits (MPNet's and DeBERTa's `add_` on a fresh sum, DeBERTa's `detach_` on a fresh copy) are
written as their functional twins where that computes the same value (the tensor written is a fresh result no
other node reads); any other operator outside the table refuses the program (ProgramExportError naming it).
"""

from __future__ import annotations

import json
import math
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
    dtype: str = "float32"
    quality: dict[str, Any] | None = None  # --dtype float16/bfloat16: infra.pack.quality's figures vs float32


def export_program(
    source: HFSource,
    safetensors_dir: Path,
    model: Any = None,
    reference: Reference | None = None,
    dtype: str = "float32",
    calibration: list[dict[str, Any]] | None = None,
) -> ExportedProgram:
    """The program of `model` (else loaded from `safetensors_dir`) with the task's head, checked against the
    module the ONNX graph is checked against: the model as loaded (eager attention, or hf_export's), its outputs
    (`reference`, else computed here) taken before the attention is switched. Attention: "sdpa" first where
    transformers has it for the model (MPNet has not), then the attention as loaded; the first program that
    matches is kept. `model` is left as it came (its attention restored; with a `dtype` other than float32 it is
    left in that dtype).

    `dtype` float16 / bfloat16: the model's weights are cast and the program captured in that dtype (its head,
    pooling and normalize, in float32; its output float32). It cannot match float32 to 1e-4: it must run and
    give finite outputs of the right shape on the probes, and its agreement with the float32 model on the
    `calibration` batches (numpy feeds) is measured (`quality`) for the caller's gate."""
    import torch

    from infra.pack.hf_export import build_head, input_names, load_torch_model, reference_outputs

    if model is None:
        model = load_torch_model(source, safetensors_dir)
    head = build_head(source, model)
    names = input_names(source)
    reference = reference or reference_outputs(source, model)  # the probes, then one row of one token
    feeds = [tuple(torch.from_numpy(p[n]) for n in names) for p in reference.probes]
    want = [torch.from_numpy(o) for o in reference.outputs]
    calibration_feeds = [tuple(torch.from_numpy(c[n]) for n in names) for c in calibration or []]
    with torch.inference_mode():
        calibrated = [head(*f) for f in calibration_feeds] if dtype != "float32" else []
    if dtype != "float32":
        model.to(getattr(torch, dtype))
    loaded = model.config._attn_implementation
    failures: list[str] = []
    try:
        for attention in _attentions(source, model, loaded):
            try:
                program = _export(source, head, names, feeds, want, attention, dtype)
            except ProgramExportError as e:
                failures.append(f"{attention} attention: {e}")
                continue
            if dtype == "float32":
                return program
            return _measured(source, program, calibration_feeds, calibrated)
    finally:
        if model.config._attn_implementation != loaded:
            model.set_attn_implementation(loaded)
    raise ProgramExportError(f"{source.root}: " + "; ".join(failures))


def _measured(
    source: HFSource, program: ExportedProgram, feeds: list[tuple[Any, ...]], reference: list[Any]
) -> ExportedProgram:
    """`program` with its agreement with the float32 outputs `reference` on the calibration `feeds`."""
    import dataclasses
    import tempfile

    import numpy as np
    import torch

    from handler.backends.program import load
    from infra.pack.quality import measure

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / PROGRAM_FILE
        path.write_bytes(program.program)
        run = load(path, program.tensors)
    with torch.inference_mode():
        got = np.concatenate([run(*f)[0].float().numpy() for f in feeds]) if feeds else np.zeros((0, 1))
    want = np.concatenate([r.float().numpy() for r in reference]) if reference else np.zeros((0, 1))
    quality = measure(source.task, want, got, source.problem_type) if feeds else None
    return dataclasses.replace(program, quality=quality)


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
    dtype: str = "float32",
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
    allowed_only(raw)
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
    diff = _check(program, tensors, feeds, want, ATOL if dtype == "float32" else float("inf"))
    return ExportedProgram(program, tensors, diff, attention, dtype)


def allowed_only(raw: dict[str, Any]) -> None:
    """Rewrite `raw`'s in-place nodes to their functional twins where the value is the same; refuse (a
    ProgramExportError naming it) any operator the run-time interpreter does not allow."""
    from handler.backends.program import _flat, _names_in, _output_names
    from handler.backends.program_ops import ALLOWED, FRESH, INT_OPS, functional_twin

    nodes = raw["graph_module"]["graph"]["nodes"]
    producer: dict[str, str] = {}
    readers: dict[str, int] = {}
    for node in nodes:
        for name in _names_in([i["arg"] for i in node["inputs"]]):
            readers[name] = readers.get(name, 0) + 1
        for name in _flat(_output_names(node["outputs"])):
            producer[name] = node["target"]
    for spec in raw["graph_module"]["signature"]["output_specs"]:
        for name in _names_in(spec):
            readers[name] = readers.get(name, 0) + 1
    for node in nodes:
        target = node["target"]
        twin = functional_twin(target)
        if twin is not None:
            written = str(node["inputs"][0]["arg"].get("as_tensor", {}).get("name")) if node["inputs"] else ""
            # Exact only when what it writes is a new tensor (no view of a weight or an input) read nowhere else.
            if producer.get(written, "") in FRESH and readers.get(written) == 1:
                node["target"] = twin
                # its result is now that twin's new tensor: a chain (SigLIP2's `.abs_().div_().clamp_()`) follows
                for name in _flat(_output_names(node["outputs"])):
                    producer[name] = twin
                continue
        if target not in ALLOWED and target not in INT_OPS:
            raise ProgramExportError(
                f"the program calls {target}, which the torch backend's interpreter does not run "
                "(handler/backends/program_ops.py lists what it does)"
            )


def _check(
    program: bytes, tensors: dict[str, Any], feeds: list[tuple[Any, ...]], want: list[Any], atol: float = ATOL
) -> float:
    """Run the program through the run-time interpreter on every probe batch; its largest difference from
    `want` (the model's outputs), refused above `atol` or when not finite (a reduced dtype: `atol` inf, finite
    outputs of the right shape; its agreement is the quality gate's to judge)."""
    import tempfile

    import torch

    from handler.backends.program import load

    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / PROGRAM_FILE
            path.write_bytes(program)
            run = load(path, tensors)
        steps: list[float] = []
        with torch.inference_mode():
            for feed, expected in zip(feeds, want, strict=True):
                got = run(*feed)[0]
                if got.shape != expected.shape:
                    raise ProgramExportError(
                        f"the program answers shape {tuple(got.shape)}, the model {tuple(expected.shape)}"
                    )
                steps.append(float((got - expected).abs().max()) if expected.numel() else 0.0)
        # Not max() alone: max(0.0, nan) is 0.0, and a NaN difference must refuse.
        diff = math.nan if any(math.isnan(step) for step in steps) else max(steps, default=0.0)
    except ProgramExportError:
        raise
    except Exception as e:  # the interpreter refuses it (ProgramError) or an operator fails on a probe batch
        raise ProgramExportError(f"the run-time interpreter cannot run it ({type(e).__name__}: {_short(e)})") from e
    if not diff <= atol:  # NaN included
        raise ProgramExportError(f"the exported program differs from the model by {diff:.3g} (> {atol})")
    return diff


def _short(error: BaseException) -> str:
    return " ".join(str(error).split())[:400]
