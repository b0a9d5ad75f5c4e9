"""A torch.export program, run without torch's deserializer: the pack's `program.json` (torch.export's own
serialized schema, `torch._export.serde`, written at pack time without weights) interpreted node by node
over `torch.ops.aten`, with the weights mapped from `model.safetensors` (the program's parameter names).

Why not `torch.export.load`: it unpickles (`torch.load(weights_only=False)` for weights and constants stored
as pickles), and its deserializer `eval`s every symbolic shape (`sympy.sympify`), resolves call targets by
walking attributes from the `torch` module (`torch.os.system` is one), and costs ~2 s of imports and
rebuilding (sympy, the serde module, fake tensors, the verifier; measured in docs/coldstart.md). Here:
`json.loads`, then each node's target must be an ATen operator overload (`torch.ops.aten.NAME.OVERLOAD`,
`from_file` excluded) or integer arithmetic on sizes; arguments are plain values or earlier nodes' results;
nothing is evaluated, imported or unpickled. Dynamic shapes need no symbolic machinery: a size is a Python
int read from the real tensor (`aten.sym_size.int`) when the program runs.
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

from handler.core.errors import ModelLoadError

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
_REFUSED_OPS = {"from_file"}  # reads a file named by the graph
_INT_OPS: dict[str, Callable[..., Any]] = {
    "_operator.add": operator.add,
    "_operator.sub": operator.sub,
    "_operator.mul": operator.mul,
    "_operator.floordiv": operator.floordiv,
    "_operator.mod": operator.mod,
    "_operator.neg": operator.neg,
}
_KEYWORD = 2  # torch._export.serde.schema.ArgumentKind.KEYWORD

# One argument: ("v", value) a constant, ("n", name) an earlier result, ("l", [...]) a list of either.
Arg = tuple[str, Any]
# One node's results: a name (None: unused), or a list of names for an operator that returns several tensors
# (a tuple, or a list: `aten.unbind`, `aten.chunk`), unpacked in order.
Outs = str | None | list[str | None]
# One node: operator, positional and keyword arguments, the names of its results, the names last used here.
Step = tuple[Callable[..., Any], list[Arg], dict[str, Arg], Outs, tuple[str, ...]]


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

        for op, pos, kw, outs, done in self._steps:
            result = op(*[value(a) for a in pos], **{k: value(a) for k, a in kw.items()})
            if isinstance(outs, str):
                env[outs] = result
            elif isinstance(outs, list):
                for name, r in zip(outs, result, strict=True):
                    if name is not None:
                        env[name] = r
            for name in done:  # an intermediate no later node reads: freed now, not at the end of the call
                del env[name]
        return tuple(env[n] for n in self._outputs)


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
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
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
    live = _live(nodes, outputs)
    steps: list[tuple[Callable[..., Any], list[Arg], dict[str, Arg], Outs, Any]] = []
    for node in nodes:
        outs = _output_names(node["outputs"])
        if not any(o in live for o in _flat(outs)):
            continue  # dead code (e.g. a base model's pooler no head reads)
        if isinstance(outs, list):  # the results no node reads are not kept
            outs = [o if o in live else None for o in outs]
        op = _operator(path, node["target"])
        pos: list[Arg] = []
        kw: dict[str, Arg] = {}
        for item in node["inputs"]:
            value = _argument(path, item["arg"], device)
            if item.get("kind") == _KEYWORD:
                kw[item["name"]] = value
            else:
                pos.append(value)
        steps.append((op, pos, kw, outs, _names_in([i["arg"] for i in node["inputs"]])))
    # Each intermediate is dropped after the last node that reads it (weights, inputs and outputs are kept).
    keep = set(constants) | set(inputs) | set(outputs)
    seen: set[str] = set()
    for i in range(len(steps) - 1, -1, -1):
        op, pos, kw, outs, read = steps[i]
        last = tuple(dict.fromkeys(n for n in read if n not in keep and n not in seen))
        seen.update(last)
        steps[i] = (op, pos, kw, outs, last)
    return Program(path, constants, inputs, steps, outputs)


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


def _operator(path: Path, target: str) -> Callable[..., Any]:
    if target in _INT_OPS:
        return _INT_OPS[target]
    match = _ATEN.fullmatch(target)
    if match is None or match.group(1) in _REFUSED_OPS:
        raise _fail(path, f"operator {target!r}: only ATen operators run here")
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
