"""handler.backends.program against generated hostile programs (issue 32): a real torch.export program
(tests/unit/test_program.py's Tiny) mutated with operators from the allowlist, operators outside it (in place on
a weight, `*_unsafe`, sparse constructors, any ATen operator this torch has), names nothing defines, and huge
sizes. Whatever comes out, load refuses it with ProgramError, or every run gives the answer a freshly loaded
program gives (or the same ModelRunError), and neither the weights nor the inputs change.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handler.backends import program_ops
from handler.backends.program import ProgramError, load
from handler.core.errors import ModelRunError
from tests.unit.test_program import Tiny, _node, _t, exported, write

__all__ = ["exported"]  # the fixture, used here by name

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Every ATen operator overload this torch knows, as a program would name it.
ATEN = sorted(
    {
        "torch.ops.aten." + s.name.removeprefix("aten::") + "." + (s.overload_name or "default")
        for s in torch._C._jit_get_all_schemas()
        if s.name.startswith("aten::")
    }
)
HOSTILE = [
    "torch.ops.aten.add_.Tensor",
    "torch.ops.aten.mul_.Tensor",
    "torch.ops.aten.copy_.default",
    "torch.ops.aten.zero_.default",
    "torch.ops.aten.fill_.Scalar",
    "torch.ops.aten.index_put_.default",
    "torch.ops.aten.tanh_.default",
    "torch.ops.aten.add.out",
    "torch.ops.aten._sparse_coo_tensor_unsafe.default",
    "torch.ops.aten.sparse_coo_tensor.indices",
    "torch.ops.aten._to_dense.default",
    "torch.ops.aten.to_dense.default",
    "torch.ops.aten.empty.memory_format",
    "torch.ops.aten.full.default",
    "torch.ops.aten.new_empty.default",
    "torch.ops.aten.as_strided.default",
    "torch.ops.aten.set_.source_Storage",
    "torch.ops.aten.resize_.default",
    "torch.ops.aten.from_file.default",
    "torch.ops.aten._unsafe_view.default",
    "torch.ops.aten.bernoulli.p",
]
HUGE = [  # (target, args given the name of a tensor): sizes a program computes, bounded at run time
    ("torch.ops.aten.zeros.default", lambda x, n: [{"as_ints": [n, n]}]),
    ("torch.ops.aten.arange.default", lambda x, n: [{"as_int": n * n}]),
    ("torch.ops.aten.expand.default", lambda x, n: [_t(x), {"as_ints": [n, n, -1, -1]}]),
    ("torch.ops.aten.repeat.default", lambda x, n: [_t(x), {"as_ints": [n, n]}]),
    ("torch.ops.aten.new_ones.default", lambda x, n: [_t(x), {"as_ints": [n, n]}]),
]
ALLOWED = sorted(program_ops.ALLOWED - {"torch.ops.aten.dropout.default"})  # refused unless train=False


def _nodes(raw: dict[str, Any]) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = raw["graph_module"]["graph"]["nodes"]
    return nodes


def _reads(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for i in node["inputs"] if "as_tensor" in i["arg"]]


@st.composite
def mutations(draw: st.DrawFn, raw: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """A mutated program, and whether load must refuse it."""
    bad = copy.deepcopy(raw)
    nodes = _nodes(bad)
    kind = draw(st.sampled_from(["allowed", "hostile", "any", "undefined", "huge", "inplace_on_weight"]))
    index = draw(st.integers(0, len(nodes) - 1))
    if kind == "allowed":  # an allowed operator on another node's arguments: runs, or fails typed
        nodes[index]["target"] = draw(st.sampled_from(ALLOWED))
        return bad, False
    if kind in ("hostile", "any"):
        target = draw(st.sampled_from(HOSTILE if kind == "hostile" else ATEN))
        nodes[index]["target"] = target
        return bad, target not in program_ops.ALLOWED
    if kind == "undefined":
        readers = [n for n in nodes if _reads(n)]
        node = draw(st.sampled_from(readers))
        draw(st.sampled_from(_reads(node)))["arg"] = _t(draw(st.sampled_from(["ghost", "later_" + node["name"]])))
        return bad, True
    victim = draw(st.sampled_from([i["as_tensor"]["name"] for i in bad["graph_module"]["graph"]["inputs"]]))
    if kind == "huge":
        target, args = draw(st.sampled_from(HUGE))
        made = _node(target, args(victim, 1 << draw(st.integers(4, 40))), "made")
    else:  # in place on a weight or an input, wired in where that tensor was read
        made = _node(draw(st.sampled_from(HOSTILE[:7])), [_t(victim), _t(victim)], "made")
    nodes.insert(0, made)
    for node in nodes[1:]:
        for item in _reads(node):
            if item["arg"] == _t(victim) and draw(st.booleans()):
                item["arg"] = _t("made")
    return bad, kind == "inplace_on_weight"


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode() + tensors[name].contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _answer(run: Any, ids: torch.Tensor, mask: torch.Tensor) -> tuple[str, Any]:
    try:
        return "ok", [a.clone() if isinstance(a, torch.Tensor) else a for a in run(ids, mask)]
    except ModelRunError as e:
        return "error", str(e).split(" failed: ")[0]


def _same(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    if a[0] != b[0] or a[0] == "error":
        return a == b
    return all(
        torch.equal(x, y) or (x.dtype.is_floating_point and torch.allclose(x, y, equal_nan=True, rtol=0, atol=0))
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape
        else x == y
        for x, y in zip(a[1], b[1], strict=True)
    )


@pytest.fixture(scope="module")
def base(exported: tuple[Tiny, dict[str, Any], dict[str, Any]]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    _, raw, tensors = exported
    return raw, tensors


@SETTINGS
@given(data=st.data())
def test_a_generated_program_is_refused_or_runs_the_same_every_time(
    base: tuple[dict[str, Any], dict[str, torch.Tensor]], tmp_path: Path, data: st.DataObject
) -> None:
    raw, tensors = base
    bad, must_refuse = data.draw(mutations(raw))
    weights = {k: v.clone() for k, v in tensors.items()}
    before = _digest(weights)
    path = write(tmp_path, bad)
    try:
        run = load(path, weights)
    except ProgramError:
        return
    assert not must_refuse, json.dumps([n["target"] for n in _nodes(bad)])
    ids = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    mask = torch.ones_like(ids)
    first = _answer(run, ids, mask)
    again = _answer(run, ids, mask)
    fresh = _answer(load(path, {k: v.clone() for k, v in tensors.items()}), ids, mask)
    assert _same(first, again) and _same(first, fresh), (first, again, fresh)
    assert _digest(weights) == before
    assert torch.equal(ids, torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])) and bool(mask.all())
