"""handler.backends.program: torch.export's serialized program run by warmstart's own interpreter, which
evaluates, imports and unpickles nothing (pack-time side: infra/pack/torch_program.py)."""

from __future__ import annotations

import copy
import json
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from handler.backends import program, program_ops
from handler.backends.program import ProgramError, load, parameter_names
from handler.core.errors import ModelLoadError, ModelRunError


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
        scale: torch.Tensor = self.scale  # type: ignore[assignment]  # a buffer (nn.Module types it Tensor | Module)
        return torch.nn.functional.normalize(torch.tanh(self.proj(pooled)) * scale, dim=1)


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
        out: torch.Tensor = torch.softmax(a @ b.transpose(1, 2) + bias, dim=-1) @ v
        return out


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


# ------------------------------------------------------------------ issue 32: an allowlist, names, typed errors


def _node(target: str, args: list[dict[str, Any]], out: str, **keywords: dict[str, Any]) -> dict[str, Any]:
    inputs = [{"name": f"a{i}", "arg": a, "kind": 1} for i, a in enumerate(args)]
    inputs += [{"name": k, "arg": a, "kind": program._KEYWORD} for k, a in keywords.items()]
    return {"target": target, "inputs": inputs, "outputs": [{"as_tensor": {"name": out}}], "metadata": {}, "name": out}


def _with(raw: dict[str, Any], nodes: list[dict[str, Any]], output: str | None = None) -> dict[str, Any]:
    """`raw` with `nodes` run first, and its output replaced by `output`."""
    bad = copy.deepcopy(raw)
    bad["graph_module"]["graph"]["nodes"][:0] = nodes
    if output is not None:
        bad["graph_module"]["signature"]["output_specs"][0]["user_output"]["arg"]["as_tensor"]["name"] = output
    return bad


def _t(name: str) -> dict[str, Any]:
    return {"as_tensor": {"name": name}}


def _feeds() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    return ids, torch.ones_like(ids)


HEAP_WRITE = [  # issue 32 fault 1: a write at an offset the pack chooses (a sparse index far out of range)
    _node(
        "torch.ops.aten.full.default", [{"as_ints": [1, 1]}, {"as_int": 1 << 40}], "index", dtype={"as_scalar_type": 5}
    ),
    _node("torch.ops.aten.full.default", [{"as_ints": [1]}, {"as_float": 1.0}], "values"),
    _node("torch.ops.aten._sparse_coo_tensor_unsafe.default", [_t("index"), _t("values"), {"as_ints": [4]}], "sparse"),
    _node("torch.ops.aten._to_dense.default", [_t("sparse")], "dense"),
]


def test_a_program_that_writes_the_heap_is_refused_at_load(
    exported: tuple[torch.nn.Module, dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    """Run in a child: before the allowlist, the child died of SIGSEGV (or ran on with its heap corrupted)."""
    import subprocess
    import sys

    from safetensors.torch import save_file

    _, raw, tensors = exported
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    path = write(tmp_path, _with(raw, HEAP_WRITE, "dense"))
    child = f"""
from pathlib import Path
import torch
from handler.backends.program import ProgramError, load
from handler.backends.weights import mmap_safetensors
try:
    run = load(Path({str(path)!r}), mmap_safetensors(Path({str(tmp_path / "model.safetensors")!r})))
except ProgramError as e:
    print("refused:", e)
else:
    ids = torch.tensor([[1, 2]])
    print("ran:", run(ids, torch.ones_like(ids)))
"""
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused:" in done.stdout and "'torch.ops.aten.full.default' is not one this interpreter runs" in done.stdout


@pytest.mark.parametrize(
    "target",
    [
        "torch.ops.aten.add_.Tensor",  # in place on a weight: issue 32 fault 2
        "torch.ops.aten.copy_.default",
        "torch.ops.aten.add.out",
        "torch.ops.aten._sparse_coo_tensor_unsafe.default",
        "torch.ops.aten._to_dense.default",
        "torch.ops.aten.empty.memory_format",
        "torch.ops.aten.set_.source_Storage",
        "torch.ops.aten.as_strided.default",
    ],
)
def test_operators_outside_the_allowlist_are_refused_by_name(
    exported: tuple[torch.nn.Module, dict[str, Any], dict[str, Any]], tmp_path: Path, target: str
) -> None:
    _, raw, tensors = exported
    bad = copy.deepcopy(raw)
    _first_node(bad, "tanh")["target"] = target
    with pytest.raises(ProgramError, match=re.escape(repr(target))):
        load(write(tmp_path, bad), tensors)


def test_three_identical_requests_get_one_answer_and_the_weights_stay(
    exported: tuple[torch.nn.Module, dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    """issue 32 fault 2: `add_` on a mapped weight gave three requests three answers (refused now); an output
    that is a weight or an input is copied, so what a caller does to its answer reaches no other request."""
    _, raw, tensors = exported
    weights = {k: v.clone() for k, v in tensors.items()}
    names = {v: k for k, v in parameter_names(raw).items()}
    bias, scale = names["proj.bias"], names["scale"]
    bad = _with(raw, [_node("torch.ops.aten.add_.Tensor", [_t(bias), _t(scale)], "grown")])
    for node in bad["graph_module"]["graph"]["nodes"][1:]:
        for item in node["inputs"]:
            if item["arg"] == _t(bias):
                item["arg"] = _t("grown")
    with pytest.raises(ProgramError, match="add_"):
        load(write(tmp_path, bad), weights)

    ids, mask = _feeds()
    for output in (bias, "ids"):
        run = load(write(tmp_path, _with(raw, [], output)), weights)
        first = run(ids, mask)[0]
        want = first.clone()
        first.add_(100)  # a caller post-processing its answer in place
        torch.testing.assert_close(run(ids, mask)[0], want, atol=0, rtol=0)
    torch.testing.assert_close(weights, tensors, atol=0, rtol=0)
    assert torch.equal(ids, _feeds()[0])


def test_a_name_nothing_defines_is_refused_at_load(
    exported: tuple[torch.nn.Module, dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    """issue 32 fault 3: it loaded, and with warm-up off every request was a bare KeyError."""
    _, raw, tensors = exported
    bad = copy.deepcopy(raw)
    node = _first_node(bad, "tanh")
    node["inputs"][0]["arg"] = _t("ghost")
    with pytest.raises(ProgramError, match=r"\(torch\.ops\.aten\.tanh\.default\) reads 'ghost', which nothing"):
        load(write(tmp_path, bad), tensors)
    twice = _with(raw, [_node("torch.ops.aten.zeros_like.default", [_t("ids")], "ids")])
    with pytest.raises(ProgramError, match="defines 'ids' a second time"):
        load(write(tmp_path, twice), tensors)


def test_failures_while_running_are_model_run_errors(
    exported: tuple[torch.nn.Module, dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    """issue 32 fault 3: a huge size was a bare RuntimeError; now any failure names the node, typed."""
    _, raw, tensors = exported
    ids, mask = _feeds()
    huge = _with(raw, [_node("torch.ops.aten.zeros.default", [{"as_ints": [1 << 20, 1 << 20]}], "huge")], "huge")
    with pytest.raises(ModelRunError, match=r"node huge \(torch\.ops\.aten\.zeros\.default\) failed: MemoryError"):
        load(write(tmp_path, huge), tensors)(ids, mask)
    wrong = _with(raw, [_node("torch.ops.aten.view.default", [_t("ids"), {"as_ints": [7, 7]}], "wrong")], "wrong")
    with pytest.raises(ModelRunError, match=r"node wrong \(torch\.ops\.aten\.view\.default\) failed: RuntimeError"):
        load(write(tmp_path, wrong), tensors)(ids, mask)
    empty = _with(raw, [_node("torch.ops.aten.empty.memory_format", [{"as_ints": [1 << 40]}], "e")], "e")
    with pytest.raises(ProgramError, match="empty"):
        load(write(tmp_path, empty), tensors)
    assert issubclass(ModelRunError, ModelLoadError)  # failing at warm-up, init fails as a load error


def test_sizes_are_bounded_by_the_run_not_refused_below_it(
    exported: tuple[torch.nn.Module, dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    _, raw, tensors = exported
    ids, mask = _feeds()
    largest = max(t.numel() for t in tensors.values())
    limit = program.size_limit((ids, mask), largest, 50)
    assert limit == max(largest, 10 * 5 * 50)  # the inputs' 10 elements, their longest dim 5, the vocabulary 50
    for n, ok in ((limit, True), (limit + 1, False)):
        run = load(
            write(tmp_path, _with(raw, [_node("torch.ops.aten.arange.default", [{"as_int": n}], "r")], "r")), tensors
        )
        if ok:
            assert run(ids, mask)[0].numel() == n
        else:
            with pytest.raises(ModelRunError, match="past this run's bound"):
                run(ids, mask)


def test_dropout_and_attention_dropout_must_be_off(
    exported: tuple[torch.nn.Module, dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    _, raw, tensors = exported
    train = _node("torch.ops.aten.dropout.default", [_t("ids"), {"as_float": 0.5}, {"as_bool": True}], "d")
    with pytest.raises(ProgramError, match="train must be False"):
        load(write(tmp_path, _with(raw, [train], "d")), tensors)


def test_the_pack_writes_in_place_nodes_as_their_functional_twins_only_where_exact() -> None:
    from infra.pack.torch_program import ProgramExportError, allowed_only

    def graph(nodes: list[dict[str, Any]], output: str) -> dict[str, Any]:
        spec = {"user_output": {"arg": _t(output)}}
        return {"graph_module": {"graph": {"nodes": nodes}, "signature": {"output_specs": [spec]}}}

    fresh = graph(
        [
            _node("torch.ops.aten.mul.Tensor", [_t("x"), _t("x")], "sq"),
            _node("torch.ops.aten.add_.Tensor", [_t("sq"), _t("w")], "sum"),
        ],
        "sum",
    )
    allowed_only(fresh)
    assert [n["target"] for n in fresh["graph_module"]["graph"]["nodes"]][1] == "torch.ops.aten.add.Tensor"
    chain = graph(  # SigLIP2's resize, `(a - b).abs_().div_(s)`: each write is on the one before's new tensor
        [
            _node("torch.ops.aten.sub.Tensor", [_t("x"), _t("w")], "d"),
            _node("torch.ops.aten.abs_.default", [_t("d")], "a"),
            _node("torch.ops.aten.div_.Tensor", [_t("a"), _t("w")], "q"),
        ],
        "q",
    )
    allowed_only(chain)
    targets = [n["target"] for n in chain["graph_module"]["graph"]["nodes"]]
    assert targets[1:] == ["torch.ops.aten.abs.default", "torch.ops.aten.div.Tensor"]
    on_weight = graph([_node("torch.ops.aten.add_.Tensor", [_t("w"), _t("x")], "sum")], "sum")
    read_again = graph(  # `sq` is read after the write: the functional twin would give that reader another value
        [
            _node("torch.ops.aten.mul.Tensor", [_t("x"), _t("x")], "sq"),
            _node("torch.ops.aten.add_.Tensor", [_t("sq"), _t("w")], "sum"),
            _node("torch.ops.aten.add.Tensor", [_t("sq"), _t("sum")], "out"),
        ],
        "out",
    )
    on_view = graph(
        [
            _node("torch.ops.aten.view.default", [_t("x"), {"as_ints": [-1]}], "flat"),
            _node("torch.ops.aten.add_.Tensor", [_t("flat"), _t("w")], "sum"),
        ],
        "sum",
    )
    for bad in (on_weight, read_again, on_view):
        with pytest.raises(ProgramExportError, match=r"calls torch\.ops\.aten\.add_\.Tensor"):
            allowed_only(bad)


def test_the_allowlist_is_functional_and_its_sized_operators_are_bounded() -> None:
    """Every allowed operator exists here, writes no argument (its schema is not mutable), is no `out=` overload,
    no `*_unsafe` and nothing sparse; every one that takes a size list or an end (arange) is SIZED, except the
    ones that keep their input's element count or make it smaller (view, reshape, slice)."""
    keep_count = {"view.default", "reshape.default", "slice.Tensor", "expand_as.default"}
    for target in program_ops.ALLOWED:
        name, overload = target.removeprefix("torch.ops.aten.").split(".")
        op = getattr(getattr(torch.ops.aten, name), overload)
        schema = op._schema
        assert not schema.is_mutable, target
        assert not name.endswith("_") or name.startswith("__"), target
        assert not overload.startswith("out") and "unsafe" not in name and "sparse" not in name, target
        sizes = any(
            str(a.type) in ("List[int]", "SymInt[]") and a.name in ("size", "repeats") for a in schema.arguments
        )
        if (sizes or name == "arange") and f"{name}.{overload}" not in keep_count:
            assert target in program_ops.SIZED, target
    assert set(program_ops.SIZED) <= program_ops.ALLOWED
    assert program_ops.ALIASING.isdisjoint(program_ops.FRESH)
