"""The pre-optimized model's data file in the order a start reads it (infra/pack/opt_layout.py): the same
computation, every buffer page-aligned, what a start reads one span, and a layout that does not add up refused.
Bytes read on a cold start are measured in bench/coldstart/reads.py, not here."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.core.manifest import load_manifest
from infra.pack.opt_layout import LOAD, RUN, LayoutError, buffers, check, packed_buffers, relayout
from infra.pack.optimize import OPT_DATA, OPT_FILE, PAGE, optimize, touched_ranges

VOCAB, WIDTH = 200, 64


def write_embedder(path: Path) -> None:
    """ids int64 [batch, seq] -> Gather(table) -> MatMul -> Add -> Relu -> MatMul: a table and two weights big
    enough (16 KB) to go to the data file and to be prepacked; random values, so a misplaced byte shows."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {
        "table": rng.standard_normal((VOCAB, WIDTH)).astype(np.float32),
        "w1": rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) / 8,
        "b1": rng.standard_normal(WIDTH).astype(np.float32),
        "w2": rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) / 8,
    }
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["e"]),
            helper.make_node("MatMul", ["e", "w1"], ["h"]),
            helper.make_node("Add", ["h", "b1"], ["hb"]),
            helper.make_node("Relu", ["hb"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["y"]),
        ],
        "embedder",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", WIDTH])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save_model(model, str(path))


def ort_save(source: Path, out: Path) -> Path:
    """ONNX Runtime's own optimized save with prepacked weights (as optimize() makes it, before the layout)."""
    import onnxruntime as ort

    out.mkdir(parents=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(out / OPT_FILE)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", OPT_DATA)
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "4096")
    options.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    return out / OPT_FILE


def run(model: Path, ids: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    out: np.ndarray[Any, Any] = session.run(None, {"ids": ids})[0]
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ORT's save of the tiny embedder, as ORT lays it out (never changed: tests copy it)."""
    root = tmp_path_factory.mktemp("layout")
    write_embedder(root / "embedder.onnx")
    model = ort_save(root / "embedder.onnx", root / "ort")
    assert any(b.key.startswith("prepacked") for b in graph_buffers(model)), "the tiny MatMuls must be prepacked"
    return model


def graph_buffers(model: Path) -> list[Any]:
    import onnx

    return buffers(
        onnx.load(str(model), load_external_data=False), OPT_DATA, (model.with_name(OPT_DATA)).stat().st_size
    )


def copy(model: Path, to: Path) -> Path:
    to.mkdir()
    for name in (OPT_FILE, OPT_DATA):
        shutil.copyfile(model.with_name(name), to / name)
    return to / OPT_FILE


def contents(model: Path) -> dict[tuple[str, str, int], bytes]:
    """Every buffer's bytes, by (tensor, entry, index): what must not change when only the offsets move."""
    data = model.with_name(OPT_DATA).read_bytes()
    return {(b.tensor.name, b.key, b.index): data[b.offset : b.offset + b.length] for b in graph_buffers(model)}


def test_the_relaid_model_computes_the_same_and_holds_the_same_bytes(saved: Path, tmp_path: Path) -> None:
    model = copy(saved, tmp_path / "laid")
    record = relayout(model, OPT_DATA)
    ids = np.random.default_rng(1).integers(0, VOCAB, (3, 11)).astype(np.int64)
    assert np.array_equal(run(model, ids), run(saved, ids))  # bit-identical, not merely close
    assert contents(model) == contents(saved)
    found = check(model, OPT_DATA)
    assert all(b.offset % PAGE == 0 for b in found)
    assert record["load_bytes"] == sum(b.length for b in found if b.group == LOAD) > 0
    assert record["run_bytes"] == sum(b.length for b in found if b.group == RUN) > 0
    assert record["table_bytes"] == VOCAB * WIDTH * 4


def test_what_a_start_reads_is_one_span_in_the_order_it_is_read(saved: Path, tmp_path: Path) -> None:
    model = copy(saved, tmp_path / "laid")
    relayout(model, OPT_DATA)
    found = sorted(check(model, OPT_DATA), key=lambda b: b.offset)
    groups = [b.group for b in found]
    assert groups == sorted(groups)  # the originals (read at load), then the run's, then the table, last
    assert found[-1].tensor.name == "table"
    (span,) = touched_ranges(model, merge_gap=0)
    table = found[-1]
    assert span[0] == 0 and span[1] <= table.offset and span[0] + span[1] > max(b.offset for b in found[:-1])
    # Before the layout the same ranges were pieces among the table's bytes.
    assert sum(n for _, n in touched_ranges(saved, merge_gap=0)) <= span[1]


def test_optimize_lays_the_data_out_and_records_it(saved: Path, tmp_path: Path) -> None:
    from infra.pack import pack_onnx

    write_embedder(tmp_path / "embedder.onnx")
    packed = pack_onnx(tmp_path / "embedder.onnx", tmp_path / "packed", "embedder", "1")
    entry = optimize(packed)  # proves the relaid model bit-identical to the portable one on its probes
    assert entry["layout"]["version"] == 1 and entry["unaligned_tensors"] == 0
    assert (
        entry["touched_ranges"][OPT_DATA]
        == touched_ranges(packed / OPT_FILE)
        == [[0, entry["touched_ranges"][OPT_DATA][0][1]]]
    )
    check(packed / OPT_FILE, OPT_DATA)
    assert load_manifest(packed).files[OPT_DATA].size == (packed / OPT_DATA).stat().st_size


def test_every_buffer_of_a_prepacked_entry_and_its_original_are_read(tmp_path: Path) -> None:
    """ONNX Runtime reads a prepacked weight's original once at load (to hash it) and all of its packed buffers
    (an Attention's entry has three): the prefetch ranges hold them all, and leave out only the table."""
    import onnx
    from onnx import TensorProto, helper

    def external(name: str, offset: int, length: int, **extra: str) -> Any:
        tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[length // 4])
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in {"location": "m.data", "offset": str(offset), "length": str(length), **extra}.items():
            tensor.external_data.add(key=key, value=value)
        return tensor

    one = 1 << 20  # far apart: nothing merges
    packed = f"Attention+123|{3 * one};{PAGE};0|{5 * one};{PAGE};0|{7 * one};{PAGE};0"
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"]), helper.make_node("Relu", ["qkv"], ["y"])],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [external("table", 0, PAGE), external("qkv", one, PAGE, prepacked_0=packed)],
    )
    onnx.save_model(helper.make_model(graph), str(tmp_path / "m.onnx"))
    assert touched_ranges(tmp_path / "m.onnx") == [[n * one, PAGE] for n in (1, 3, 5, 7)]


def tamper(model: Path, tensor: str, key: str, value: str) -> None:
    import onnx

    graph = onnx.load(str(model), load_external_data=False)
    (entry,) = [e for t in graph.graph.initializer if t.name == tensor for e in t.external_data if e.key == key]
    entry.value = value
    model.write_bytes(graph.SerializeToString())


def a_prepacked(model: Path) -> tuple[str, str, str]:
    (tensor, key, value) = next(
        (t.name, e.key, e.value)
        for t in __import__("onnx").load(str(model), load_external_data=False).graph.initializer
        for e in t.external_data
        if e.key.startswith("prepacked")
    )
    return tensor, key, value


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("overlap", "overlaps"),
        ("past_end", "past the data file"),
        ("packed_garbled", "is not '<offset>;<length>;<flag>'"),
        ("packed_no_buffers", "is not '<kernel>+<hash>|<offset>;<length>;<flag>...'"),
        ("negative", "is negative"),
        ("other_file", "expected 'model.opt.onnx.data'"),
    ],
)
def test_an_inconsistent_layout_is_refused_and_nothing_is_changed(
    saved: Path, tmp_path: Path, change: str, message: str
) -> None:
    model = copy(saved, tmp_path / "m")
    table = next(b for b in graph_buffers(model) if b.tensor.name == "table")
    tensor, key, value = a_prepacked(model)
    head, first, *rest = value.split("|")
    size = model.with_name(OPT_DATA).stat().st_size
    edits = {
        "overlap": (tensor, key, "|".join([head, f"{table.offset + PAGE};{first.split(';', 1)[1]}", *rest])),
        "past_end": ("table", "offset", str(size - PAGE)),
        "packed_garbled": (tensor, key, "|".join([head, "12;34", *rest])),
        "packed_no_buffers": (tensor, key, head),
        "negative": ("table", "length", "-4"),
        "other_file": ("table", "location", "elsewhere.data"),
    }
    tamper(model, *edits[change])
    before = {p.name: p.read_bytes() for p in model.parent.iterdir()}
    with pytest.raises(LayoutError, match=message.replace("|", r"\|").replace("+", r"\+")):
        relayout(model, OPT_DATA)
    with pytest.raises(LayoutError):
        check(model, OPT_DATA)
    assert {p.name: p.read_bytes() for p in model.parent.iterdir()} == before


def test_a_laid_out_file_with_a_buffer_off_its_page_is_refused(saved: Path, tmp_path: Path) -> None:
    model = copy(saved, tmp_path / "m")
    relayout(model, OPT_DATA)
    table = next(b for b in graph_buffers(model) if b.tensor.name == "table")
    tamper(model, "table", "offset", str(table.offset + 16))
    with pytest.raises(LayoutError, match="not at a 4096-byte offset"):
        check(model, OPT_DATA)


def test_packed_buffers_reads_every_part() -> None:
    assert packed_buffers("MatMul+1|0;8;0|4096;16;1", "k") == [(0, 8, "0"), (4096, 16, "1")]
    with pytest.raises(LayoutError, match="not a byte count"):
        packed_buffers("MatMul+1|x;8;0", "k")
