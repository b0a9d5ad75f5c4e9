"""A torch.export program, run without torch's deserializer: the pack's `program.json` (torch.export's own
serialized schema, `torch._export.serde`, written at pack time without weights) interpreted node by node
over `torch.ops.aten`, with the weights mapped from `model.safetensors` (the program's parameter names).

Why not `torch.export.load`: it unpickles (`torch.load(weights_only=False)` for weights and constants stored
as pickles), and its deserializer `eval`s every symbolic shape (`sympy.sympify`), resolves call targets by
walking attributes from the `torch` module (`torch.os.system` is one), and costs ~2 s of imports and
rebuilding (sympy, the serde module, fake tensors, the verifier; measured in docs/coldstart.md). Here:
`json.loads`, then each node's target must be one of an allowlist of ATen operator overloads
(`handler.backends.program_ops.ALLOWED`: what the exporter emits for every family and task, each functional;
anything else, `from_file`, `empty`, in-place `add_`, `_sparse_coo_tensor_unsafe`, ..., is refused at load as
`ProgramError` naming the operator) or integer arithmetic on sizes; arguments are plain values or results defined
earlier (checked at load: a name nothing defines is refused there, not a `KeyError` on every request); nothing
is evaluated, imported or unpickled. Dynamic shapes need no symbolic machinery: a size is a Python int read from
the real tensor (`aten.sym_size.int`) when the program runs.

What a run may do: no allowed operator writes to an argument, so the mapped weights every request shares and the
request's own input buffers (aliased, not copied, by views) are only read; an output that still aliases either
is copied before it leaves. An operator that allocates a size the program computes (program_ops.SIZED:
`arange`, `zeros`, `expand`, ...) is refused above `size_limit` (the largest weight, or the inputs' elements
times their longest dimension times the widest weight dimension: [batch, heads, seq, seq] fits), and integer
arithmetic above `MAX_INT`. Anything that fails while running (torch's RuntimeError, an out-of-memory, a refused
size) is a `ModelRunError` naming the file and the node. (Two bounded tensors can still broadcast to their
product: torch refuses a size it cannot allocate, a ModelRunError like any other failure.)
"""

from __future__ import annotations

import gc
import json
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from handler.backends.program_ops import ALLOWED, INT_OPS, SIZED
from handler.core.errors import ModelLoadError, ModelRunError

SCHEMA_MAJOR = 8  # torch._export.serde.schema.SCHEMA_VERSION[0] this interpreter reads
# torch._export.serde.schema's enums (tests/unit/test_program.py checks them against the installed torch).
SCALAR_TYPES = {
    1: torch.uint8,
    2: torch.int8,
    3: torch.int16,
    4: torch.int32,
    5: torch.int64,
    6: torch.float16,
    7: torch.float32,
    8: torch.float64,
    12: torch.bool,
    13: torch.bfloat16,
}
LAYOUTS = {7: torch.strided}
MEMORY_FORMATS = {
    0: None,
    1: torch.contiguous_format,
    2: torch.channels_last,
    3: torch.channels_last_3d,
    4: torch.preserve_format,
}
_ATEN = re.compile(r"torch\.ops\.aten\.([a-z_][a-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)")
MAX_INT = 1 << 62  # a size past this is no tensor's; without a bound, repeated `mul`s grow without limit


def _int_op(f: Callable[..., Any]) -> Callable[..., int]:
    def run(*args: Any) -> int:
        if not all(type(a) is int for a in args):
            raise TypeError(f"integer arithmetic on {', '.join(type(a).__name__ for a in args)}")
        result: int = f(*args)
        if abs(result) > MAX_INT:
            raise OverflowError(f"size {result} is past {MAX_INT}")
        return result

    return run


_INT_OPS: dict[str, Callable[..., int]] = {
    name: _int_op(getattr(operator, name.removeprefix("_operator."))) for name in INT_OPS
}
# Arguments that must be these literals: dropout in eval mode, attention without dropout (what an inference
# program is traced with; otherwise two runs of one request could differ).
_FIXED = {
    "torch.ops.aten.dropout.default": ("train", 2, False),
    "torch.ops.aten.scaled_dot_product_attention.default": ("dropout_p", 4, 0.0),
}
_KEYWORD = 2  # torch._export.serde.schema.ArgumentKind.KEYWORD

# One argument: ("v", value) a constant, ("n", name) an earlier result, ("l", [...]) a list of either.
Arg = tuple[str, Any]
# One node's results: a name (None: unused), or a list of names for an operator that returns several tensors
# (a tuple, or a list: `aten.unbind`, `aten.chunk`), unpacked in order.
Outs = str | None | list[str | None]
# One node: operator, positional and keyword arguments, the names of its results, the names last used here,
# its target (for errors and the size bound).
Step = tuple[Callable[..., Any], list[Arg], dict[str, Arg], Outs, tuple[str, ...], str]


class ProgramError(ModelLoadError):
    """program.json is not a program this interpreter runs (never half-loaded)."""


def _fail(path: Path, what: str) -> ProgramError:
    return ProgramError(f"{path}: {what}")


class Program:
    """A callable: the user inputs, in the program's order → its outputs (a tuple)."""

    def __init__(
        self,
        path: Path,
        constants: dict[str, Any],
        inputs: list[str],
        steps: list[Step],
        outputs: list[str],
    ) -> None:
        self.path = path
        self._constants = constants
        self.inputs = inputs
        self._steps = steps
        self._outputs = outputs
        weights = [t for t in constants.values() if isinstance(t, torch.Tensor)]
        self._largest = max((int(t.numel()) for t in weights), default=0)
        self._widest = max((max(t.shape, default=1) for t in weights), default=1)
        self._shared = {_storage(t) for t in constants.values() if isinstance(t, torch.Tensor)}

    def __call__(self, *args: torch.Tensor) -> tuple[Any, ...]:
        if len(args) != len(self.inputs):
            raise TypeError(
                f"{self.path}: expects {len(self.inputs)} inputs ({', '.join(self.inputs)}), got {len(args)}"
            )
        env = dict(self._constants)
        env.update(zip(self.inputs, args, strict=True))

        def value(a: Arg) -> Any:
            kind, v = a
            if kind == "n":
                return env[v]
            if kind == "l":
                return [value(x) for x in v]
            return v

        limit = size_limit(args, self._largest, self._widest)
        step: Step | None = None
        try:
            for step in self._steps:
                op, pos, kw, outs, done, target = step
                positional = [value(a) for a in pos]
                sized = SIZED.get(target)
                if sized is not None and (n := sized(positional)) > limit:
                    raise MemoryError(f"{n} elements asked for, past this run's bound of {limit}")
                result = op(*positional, **{k: value(a) for k, a in kw.items()})
                if isinstance(outs, str):
                    env[outs] = result
                elif isinstance(outs, list):
                    for name, r in zip(outs, result, strict=True):
                        if name is not None:
                            env[name] = r
                for name in done:  # an intermediate no later node reads: freed now, not at the end of the call
                    del env[name]
            answers = tuple(env[n] for n in self._outputs)
        except Exception as e:  # torch's RuntimeError, a refused size, an allocation that fails: the model's
            where = f"node {_step_name(step)} ({step[5]})" if step is not None else "its outputs"
            raise ModelRunError(f"{self.path}: {where} failed: {type(e).__name__}: {_short(e)}") from e
        shared = self._shared | {_storage(a) for a in args}
        # No operator writes, but the caller may (in-place post-processing of the answer): never hand it memory
        # that a weight or a pooled input buffer also is.
        return tuple(a.clone() if isinstance(a, torch.Tensor) and _storage(a) in shared else a for a in answers)


def size_limit(inputs: Sequence[Any], largest: int, widest: int) -> int:
    """The most elements a SIZED operator may allocate in a run on `inputs`: the largest weight (`largest`
    elements), or the inputs' elements times their longest dimension times the weights' widest dimension
    (`widest`, at least the hidden size, the heads and the labels). Every tensor an encoder makes fits: position
    biases [batch, heads, seq, seq] (MPNet's `expand`, DeBERTa's `repeat`), masks [batch, 1, seq, seq]."""
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    elements = sum(int(t.numel()) for t in tensors)
    longest = max((max(t.shape, default=1) for t in tensors), default=1)
    return max(largest, elements * max(1, longest) * max(1, widest))


def _storage(t: torch.Tensor) -> int:
    return int(t.untyped_storage().data_ptr())


def _step_name(step: Step) -> str:
    outs = step[3]
    names = _flat(outs)
    return names[0] if names else "(no result)"


def _short(error: BaseException) -> str:
    return " ".join(str(error).split())[:300]


def parameter_names(raw: Mapping[str, Any]) -> dict[str, str]:
    """The program's lifted inputs (graph argument name → state-dict name): parameters, buffers, constants."""
    names: dict[str, str] = {}
    for spec in raw["graph_module"]["signature"]["input_specs"]:
        ((kind, body),) = spec.items()
        if kind == "parameter":
            names[body["arg"]["name"]] = body["parameter_name"]
        elif kind == "buffer":
            names[body["arg"]["name"]] = body["buffer_name"]
        elif kind == "tensor_constant":
            names[body["arg"]["name"]] = body["tensor_constant_name"]
        elif kind != "user_input":
            raise ValueError(f"input kind {kind!r}")
    return names


def load(path: Path, weights: Mapping[str, torch.Tensor], device: torch.device | None = None) -> Program:
    """program.json at `path`, its parameters taken from `weights` (mapped tensors: aliased, not copied, on
    CPU; on `device` when given, moved there once). The program's device arguments (where it was traced: CPU)
    become `device`."""
    # The parse makes ~20k short-lived, acyclic objects: with the collector on, they can set off a full
    # collection of everything `import torch` made (~150 ms measured at init); refcounting frees them anyway.
    enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            raw = json.loads(path.read_bytes())
        except (OSError, ValueError, RecursionError) as e:
            raise _fail(path, f"not readable as JSON ({e})") from None
        try:
            return _build(path, raw, weights, device or torch.device("cpu"))
        except ProgramError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError, MemoryError) as e:
            raise _fail(path, f"not a torch.export program this torch backend runs ({type(e).__name__}: {e})") from None
    finally:
        if enabled:
            gc.enable()


def _build(path: Path, raw: Any, weights: Mapping[str, torch.Tensor], device: torch.device) -> Program:
    major = raw["schema_version"]["major"]
    if major != SCHEMA_MAJOR:
        raise _fail(path, f"schema version {major}; this interpreter reads {SCHEMA_MAJOR}")
    graph = raw["graph_module"]["graph"]
    signature = raw["graph_module"]["signature"]
    lifted = parameter_names(raw)
    constants: dict[str, Any] = {}
    for arg, name in lifted.items():
        if name not in weights:
            raise _fail(path, f"tensor {name!r} is not in the weights file")
        constants[arg] = weights[name] if device.type == "cpu" else weights[name].to(device)
    inputs: list[str] = []
    for spec in signature["input_specs"]:
        ((kind, body),) = spec.items()
        if kind == "user_input":
            inputs.append(body["arg"]["as_tensor"]["name"])
    outputs = []
    for spec in signature["output_specs"]:
        ((kind, body),) = spec.items()
        if kind != "user_output":
            raise _fail(path, f"output kind {kind!r} (an inference program returns only its outputs)")
        outputs.append(body["arg"]["as_tensor"]["name"])
    nodes = graph["nodes"]
    _check_names(path, nodes, [*constants, *inputs], outputs)
    live = _live(nodes, outputs)
    steps: list[Step] = []
    for node in nodes:
        op = _operator(path, node["target"])  # dead code too: a program holds only operators we would run
        outs = _output_names(node["outputs"])
        if not any(o in live for o in _flat(outs)):
            continue  # dead code (e.g. a base model's pooler no head reads)
        if isinstance(outs, list):  # the results no node reads are not kept
            outs = [o if o in live else None for o in outs]
        pos: list[Arg] = []
        kw: dict[str, Arg] = {}
        for item in node["inputs"]:
            value = _argument(path, item["arg"], device)
            if item.get("kind") == _KEYWORD:
                kw[item["name"]] = value
            else:
                pos.append(value)
        if node["target"] in _FIXED:
            name, index, literal = _FIXED[node["target"]]
            given = kw.get(name, pos[index] if index < len(pos) else ("v", literal))
            if given != ("v", literal):
                raise _fail(path, f"node {node.get('name')!r} ({node['target']}): {name} must be {literal}")
        steps.append((op, pos, kw, outs, tuple(_names_in([i["arg"] for i in node["inputs"]])), node["target"]))
    # Each intermediate is dropped after the last node that reads it (weights, inputs and outputs are kept).
    keep = set(constants) | set(inputs) | set(outputs)
    seen: set[str] = set()
    for i in range(len(steps) - 1, -1, -1):
        op, pos, kw, outs, read, target = steps[i]
        last = tuple(dict.fromkeys(n for n in read if n not in keep and n not in seen))
        seen.update(last)
        steps[i] = (op, pos, kw, outs, last, target)
    return Program(path, constants, inputs, steps, outputs)


def _check_names(path: Path, nodes: Sequence[Mapping[str, Any]], given: Sequence[str], outputs: Sequence[str]) -> None:
    """Every name a node reads is defined before it (an input, a weight, an earlier node's result), once."""
    defined = set(given)
    for node in nodes:
        for name in _names_in([i["arg"] for i in node["inputs"]]):
            if name not in defined:
                raise _fail(
                    path,
                    f"node {node.get('name')!r} ({node['target']}) reads {name!r}, which nothing before it defines",
                )
        for name in _flat(_output_names(node["outputs"])):
            if name in defined:
                raise _fail(path, f"node {node.get('name')!r} ({node['target']}) defines {name!r} a second time")
            defined.add(name)
    for name in outputs:
        if name not in defined:
            raise _fail(path, f"output {name!r} is defined by no node")


def _output_names(outputs: Sequence[Mapping[str, Any]]) -> Outs:
    if len(outputs) == 1:
        ((kind, body),) = outputs[0].items()
        if kind == "as_tensors":  # one list of tensors (`aten.unbind.int`, `aten.chunk.default`)
            return [str(t["name"]) for t in body]
        return _output_name(outputs[0])
    return [_output_name(o) for o in outputs]


def _flat(outs: Outs) -> list[str]:
    return [o for o in (outs if isinstance(outs, list) else [outs]) if o is not None]


def _output_name(out: Mapping[str, Any]) -> str | None:
    ((kind, body),) = out.items()
    if kind == "as_tensor":
        return str(body["name"])
    if kind == "as_sym_int":
        return str(body["as_name"])
    if kind == "as_none":
        return None
    raise ValueError(f"node output {kind!r}")


def _names_in(arg: Any) -> list[str]:
    if isinstance(arg, dict):
        if "as_tensor" in arg:
            return [arg["as_tensor"]["name"]]
        if "as_tensors" in arg:  # a list of tensors (`aten.cat`, `aten.index.Tensor`): TensorArguments, by name
            return [t["name"] for t in arg["as_tensors"]]
        if "as_name" in arg and isinstance(arg["as_name"], str):
            return [arg["as_name"]]
        return [n for v in arg.values() for n in _names_in(v)]
    if isinstance(arg, list):
        return [n for v in arg for n in _names_in(v)]
    return []


def _live(nodes: Sequence[Mapping[str, Any]], outputs: Sequence[str]) -> set[str]:
    live = set(outputs)
    for node in reversed(nodes):
        if live.intersection(_flat(_output_names(node["outputs"]))):
            live.update(_names_in([i["arg"] for i in node["inputs"]]))
    return live


def _operator(path: Path, target: Any) -> Callable[..., Any]:
    if target in _INT_OPS:
        return _INT_OPS[target]
    match = _ATEN.fullmatch(target) if isinstance(target, str) else None
    if match is None or target not in ALLOWED:
        raise _fail(
            path,
            f"operator {target!r} is not one this interpreter runs (an allowlist of functional ATen operators: "
            "handler/backends/program_ops.py)",
        )
    packet = getattr(torch.ops.aten, match.group(1), None)
    overload = getattr(packet, match.group(2), None) if packet is not None else None
    if not isinstance(overload, torch._ops.OpOverload):
        raise _fail(path, f"operator {target!r} is not in this torch ({torch.__version__})")
    return overload


def _argument(path: Path, arg: Mapping[str, Any], device: torch.device) -> Arg:
    ((kind, body),) = arg.items()
    if kind == "as_tensor":
        return ("n", str(body["name"]))
    if kind == "as_tensors":
        return ("l", [("n", str(t["name"])) for t in body])
    if kind == "as_optional_tensors":
        return ("l", [_argument(path, t, device) if "as_tensor" in t else ("v", None) for t in body])
    if kind == "as_none":
        return ("v", None)
    if kind in ("as_int", "as_float", "as_bool", "as_string"):
        return ("v", _plain(path, kind, body))
    if kind in ("as_ints", "as_floats", "as_bools", "as_strings"):
        return ("v", [_plain(path, kind[:-1], v) for v in body])
    if kind == "as_sym_int":
        return _sym_int(body)
    if kind == "as_sym_ints":
        return ("l", [_sym_int(s) for s in body])
    if kind == "as_scalar_type":
        if body not in SCALAR_TYPES:
            raise _fail(path, f"scalar type {body!r}")
        return ("v", SCALAR_TYPES[body])
    if kind == "as_layout":
        if body not in LAYOUTS:
            raise _fail(path, f"layout {body!r}")
        return ("v", LAYOUTS[body])
    if kind == "as_memory_format":
        if body not in MEMORY_FORMATS:
            raise _fail(path, f"memory format {body!r}")
        return ("v", MEMORY_FORMATS[body])
    if kind == "as_device":
        # The program runs where its weights are; a device in it is where it was traced (cpu).
        if body.get("type") != "cpu":
            raise _fail(path, f"device {body!r}")
        return ("v", device)
    raise _fail(path, f"argument kind {kind!r}")


def _plain(path: Path, kind: str, value: Any) -> Any:
    types: dict[str, tuple[type, ...]] = {
        "as_int": (int,),
        "as_float": (float, int, str),
        "as_bool": (bool,),
        "as_string": (str,),
    }
    if (isinstance(value, bool) and kind != "as_bool") or not isinstance(value, types[kind]):
        raise _fail(path, f"{kind} {value!r}")
    number: Any = value
    return float(number) if kind == "as_float" else value  # floats: "Infinity", "-Infinity", "NaN" as strings


def _sym_int(body: Mapping[str, Any]) -> Arg:
    ((kind, value),) = body.items()
    if kind == "as_name":
        return ("n", str(value))
    if kind == "as_int" and isinstance(value, int) and not isinstance(value, bool):
        return ("v", value)
    raise ValueError(f"symbolic int {body!r}")
