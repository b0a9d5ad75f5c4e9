"""handler.backends.program: torch.export's serialized program run by warmstart's own interpreter, which
evaluates, imports and unpickles nothing (pack-time side: infra/pack/torch_program.py)."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from handler.backends import program
from handler.backends.program import ProgramError, load, parameter_names


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.proj = torch.nn.Linear(8, 4)
        self.unused = torch.nn.Linear(8, 8)
        self.register_buffer("scale", torch.full((4,), 0.5), persistent=False)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) * mask.unsqueeze(-1).to(torch.float32)
        _ = self.unused(x)  # dead code: dropped at load
        pooled = x.sum(1) / mask.sum(1, keepdim=True).clamp(min=1).to(torch.float32)
        return torch.nn.functional.normalize(torch.tanh(self.proj(pooled)) * self.scale, dim=1)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, dict[str, Any], dict[str, Any]]:
    from torch._export.serde.serialize import serialize

    torch.manual_seed(0)
    module = Tiny().eval()
    ids = torch.randint(0, 50, (3, 7))
    mask = torch.ones_like(ids)
    batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("sequence", max=32)
    ep = torch.export.export(module, (ids, mask), dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}), strict=False)
    artifact = serialize(ep, serialize_state_dict=False, serialize_constants=False, serialize_example_inputs=False)
    raw = json.loads(artifact.exported_program)
    state = {**ep.state_dict, **ep.constants}
    tensors = {name: state[name].detach().clone() for name in parameter_names(raw).values()}
    return module, raw, tensors


def write(tmp_path: Path, raw: dict[str, Any]) -> Path:
    path = tmp_path / "program.json"
    path.write_text(json.dumps(raw))
    return path


def test_runs_like_the_module_at_any_batch_and_length(
    exported: tuple[torch.nn.Module, dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    module, raw, tensors = exported
    run = load(write(tmp_path, raw), tensors)
    assert run.inputs == ["ids", "mask"]
    with torch.inference_mode():
        for batch, seq in ((1, 1), (2, 5), (5, 30)):
            ids = torch.randint(0, 50, (batch, seq))
            mask = torch.ones_like(ids)
            mask[-1, seq // 2 + 1 :] = 0
            torch.testing.assert_close(run(ids, mask)[0], module(ids, mask), atol=1e-6, rtol=0)


class Lists(torch.nn.Module):
    """Operators that take a list of tensors (`aten.index.Tensor`, `aten.cat`) and return one (`aten.unbind`,
    `aten.chunk`): ModernBERT's attention unbinds q, k, v and chunks its GLU; GTE and Nomic BERT index rotary
    tables with two index tensors read nowhere else."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)
        self.table = torch.nn.Parameter(torch.randn(40, 40))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(*x.shape[:2], 3, 8).unbind(dim=-2)
        a, b = torch.cat([q, k], dim=-1).chunk(2, dim=-1)
        n = x.shape[1]
        rows = torch.arange(n).unsqueeze(1)
        cols = torch.arange(n).unsqueeze(0)
        bias = self.table[rows, cols]  # [n, n], the index tensors used only in this list
        return torch.softmax(a @ b.transpose(1, 2) + bias, dim=-1) @ v


def test_lists_of_tensors_in_and_out(tmp_path: Path) -> None:
    from torch._export.serde.serialize import serialize

    torch.manual_seed(0)
    module = Lists().eval()
    seq = torch.export.Dim("sequence", max=32)
    example = (torch.randn(2, 6, 8),)
    ep = torch.export.export(module, example, dynamic_shapes=({0: torch.export.Dim("b"), 1: seq},), strict=False)
    artifact = serialize(ep, serialize_state_dict=False, serialize_constants=False, serialize_example_inputs=False)
    raw = json.loads(artifact.exported_program)
    targets = {node["target"] for node in raw["graph_module"]["graph"]["nodes"]}
    assert {"torch.ops.aten.unbind.int", "torch.ops.aten.index.Tensor", "torch.ops.aten.cat.default"} <= targets
    state = {**ep.state_dict, **ep.constants}
    run = load(write(tmp_path, raw), {name: state[name] for name in parameter_names(raw).values()})
    with torch.inference_mode():
        for shape in ((1, 1, 8), (3, 17, 8)):
            x = torch.randn(*shape)
            torch.testing.assert_close(run(x)[0], module(x), atol=1e-6, rtol=0)


def test_weights_are_aliased_not_copied(
    exported: tuple[torch.nn.Module, dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    _, raw, tensors = exported
    run = load(write(tmp_path, raw), tensors)
    held = {t.data_ptr() for t in run._constants.values()}
    assert held == {t.data_ptr() for t in tensors.values()}


def test_loading_unpickles_nothing(
    exported: tuple[torch.nn.Module, dict[str, Any], dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, raw, tensors = exported

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("unpickling at load")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    load(write(tmp_path, raw), tensors)


def _first_node(raw: dict[str, Any], target_part: str) -> dict[str, Any]:
    return next(n for n in raw["graph_module"]["graph"]["nodes"] if target_part in n["target"])


@pytest.mark.parametrize(
    "target",
    [
        "torch.os.system",  # reachable by attribute walk from `torch`: torch's own deserializer would call it
        "torch.load",
        "builtins.eval",
        "torch.ops.aten.from_file.default",  # an ATen operator that reads a file the graph names
        "torch.ops.higher_order.cond",
        "torch.ops.aten.no_such_op.default",
        "#extension",
    ],
)
def test_only_aten_operators_run(
    exported: tuple[torch.nn.Module, dict[str, Any], dict[str, Any]], tmp_path: Path, target: str
) -> None:
    _, raw, tensors = exported
    bad = copy.deepcopy(raw)
    node = _first_node(bad, "tanh")
    node["target"] = target
    with pytest.raises(ProgramError, match="operator"):
        load(write(tmp_path, bad), tensors)


def test_symbolic_expressions_are_never_evaluated(
    exported: tuple[torch.nn.Module, dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    _, raw, tensors = exported
    bad = copy.deepcopy(raw)
    marker = tmp_path / "evaluated"
    graph = bad["graph_module"]["graph"]
    for value in graph["tensor_values"].values():  # torch's deserializer sympify()s these (an eval)
        for size in value["sizes"]:
            if "as_expr" in size:
                size["as_expr"]["expr_str"] = f"__import__('pathlib').Path({str(marker)!r}).touch() or s0"
    run = load(write(tmp_path, bad), tensors)
    run(torch.zeros((1, 3), dtype=torch.int64), torch.ones((1, 3), dtype=torch.int64))
    assert not marker.exists()


def test_malformed_programs_are_model_load_errors(
    exported: tuple[torch.nn.Module, dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    _, raw, tensors = exported
    (tmp_path / "program.json").write_text("{not json")
    with pytest.raises(ProgramError, match="not readable as JSON"):
        load(tmp_path / "program.json", tensors)
    with pytest.raises(ProgramError, match=r"not a torch\.export program"):
        load(write(tmp_path, {"schema_version": {"major": program.SCHEMA_MAJOR}}), tensors)
    newer = copy.deepcopy(raw)
    newer["schema_version"]["major"] += 1
    with pytest.raises(ProgramError, match="schema version"):
        load(write(tmp_path, newer), tensors)
    missing = dict(tensors)
    missing.pop(next(iter(missing)))
    with pytest.raises(ProgramError, match="is not in the weights file"):
        load(write(tmp_path, raw), missing)


def test_enum_tables_match_torchs_schema() -> None:
    from torch._export.serde import schema

    assert schema.SCHEMA_VERSION[0] == program.SCHEMA_MAJOR
    names = {
        torch.uint8: "BYTE",
        torch.int8: "CHAR",
        torch.int16: "SHORT",
        torch.int32: "INT",
        torch.int64: "LONG",
        torch.float16: "HALF",
        torch.float32: "FLOAT",
        torch.float64: "DOUBLE",
        torch.bool: "BOOL",
        torch.bfloat16: "BFLOAT16",
    }
    assert {v: names[d] for v, d in program.SCALAR_TYPES.items()} == {
        schema.ScalarType[n].value: n for n in names.values()
    }
    assert {schema.Layout.Strided.value: torch.strided} == program.LAYOUTS
    formats = {1: "ContiguousFormat", 2: "ChannelsLast", 3: "ChannelsLast3d", 4: "PreserveFormat"}
    assert {k: schema.MemoryFormat[v].value for k, v in formats.items()} == {k: k for k in formats}
    assert schema.ArgumentKind.KEYWORD.value == program._KEYWORD
