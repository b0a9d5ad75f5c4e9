"""The quality gate's pieces: the built-in calibration set, the agreement figures, the threshold check, the
precision options' closed sets, and the per-row int8 embedding table rewrite."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from infra.pack.calibration import builtin_texts, pairs, read_calibration
from infra.pack.precision import Precision, PrecisionError
from infra.pack.quality import QualityError, check, measure, spearman


def test_builtin_texts_are_varied_deterministic_and_sized() -> None:
    texts = builtin_texts()
    assert len(texts) == 400 and texts == builtin_texts()
    assert builtin_texts(1000, seed=1) != builtin_texts(1000, seed=0)
    assert len(builtin_texts(1000, seed=1)) == 1000
    assert "" in texts and " " in texts  # empty, whitespace
    assert any(any("\u4e00" <= c <= "\u9fff" for c in t) for t in texts)  # CJK
    assert any(any(ord(c) >= 0x1F600 for c in t) for t in texts)  # emoji
    assert any("def " in t or "SELECT" in t for t in texts)  # code
    assert any(len(t.split()) > 600 for t in texts)  # past any max length we pack
    assert any(any("\u0600" <= c <= "\u06ff" for c in t) for t in texts)  # Arabic


def test_read_calibration_lines_and_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "cal.txt"
    path.write_text('plain text\n"with\\na newline"\n\n')
    assert read_calibration(path) == ["plain text", "with\na newline", ""]
    path.write_text("")
    with pytest.raises(ValueError, match="no texts"):
        read_calibration(path)


def test_pairs_group_each_query_with_eight_documents() -> None:
    got = pairs(builtin_texts(80))
    assert len(got) == 8 * 10 and all(q.strip() for q, _ in got)


def test_embedding_figures_are_min_and_median_cosine() -> None:
    want = np.eye(4, dtype=np.float32)
    got = want.copy()
    got[0] = [1, 1, 0, 0]  # cosine 0.7071
    figures = measure("embedding", want, got)
    assert figures["figure"] == figures["min_cosine"] == pytest.approx(0.707107, abs=1e-6)
    assert figures["median_cosine"] == 1.0 and figures["items"] == 4
    nan = got.copy()
    nan[2, 0] = np.nan
    assert measure("embedding", want, nan)["figure"] == 0.0  # never a pass on NaN


def test_rerank_figures_are_top1_agreement_and_spearman() -> None:
    want = np.array([0.1, 0.9, 0.3, 0.2, 0.8, 0.1, 0.5, 0.4], np.float32)
    same = measure("rerank", want, want * 2 + 1, group=4)  # a monotone transform: ranks unchanged
    assert same["top1_agreement"] == 1.0 and same["spearman"] == pytest.approx(1.0)
    swapped = want.copy()
    swapped[[1, 2]] = swapped[[2, 1]]  # the first group's top document changes
    figures = measure("rerank", want, swapped, group=4)
    assert figures["top1_agreement"] == 0.5 and figures["figure"] == min(0.5, figures["spearman"])
    assert spearman(np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0])) == pytest.approx(-1.0)


def test_classify_figures_are_label_agreement() -> None:
    want = np.array([[2.0, 1.0], [0.0, 1.0], [3.0, -1.0], [1.0, 0.9]], np.float32)
    got = want.copy()
    got[3] = [0.9, 1.0]
    assert measure("classify", want, got)["label_agreement"] == 0.75
    multi = measure("classify", want, got - 0.95, "multi_label_classification")  # sigmoid > 0.5 per label
    assert multi["label_agreement"] == pytest.approx(0.75)


def test_check_refuses_below_the_threshold_with_the_figure() -> None:
    figures = measure("embedding", np.eye(2, dtype=np.float32), np.array([[1, 0.1], [0, 1]], np.float32))
    assert check("embedding", figures, 0.99, "--quantize int8")["passed"] is True
    with pytest.raises(QualityError, match=r"--quantize int8: quality 0\.995037 \(min cosine vs float32\) is below"):
        check("embedding", figures, 0.999, "--quantize int8")
    assert check("embedding", figures, None, "x")["min_quality"] == 0.99  # the task's default


def test_precision_closed_sets_list_the_valid_choices() -> None:
    with pytest.raises(PrecisionError, match="valid: float32, float16, bfloat16"):
        Precision(dtype="int4")
    with pytest.raises(PrecisionError, match="valid: int8, int8-dynamic, int4"):
        Precision(quantize="int2")
    with pytest.raises(PrecisionError, match="choose one"):
        Precision(dtype="float16", quantize="int8")
    with pytest.raises(PrecisionError, match="between 0 and 1"):
        Precision(quantize="int8", min_quality=1.5)
    kept, unsupported = Precision(quantize="int8").backends(("onnx", "torch"), {}, None)
    assert kept == ("onnx",) and "int8" in unsupported["torch"]
    with pytest.raises(PrecisionError, match="no backend packs this model in bfloat16"):
        Precision(dtype="bfloat16").backends(("onnx",), {"torch": "no program"}, None)


def test_embedding_tables_become_int8_per_row_and_still_run() -> None:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from infra.pack.quantize import MIN_TABLE_ROWS, quantize_tables

    rng = np.random.default_rng(0)
    table = rng.standard_normal((MIN_TABLE_ROWS + 5, 8)).astype(np.float32)
    table[3] *= 1000.0  # one row with large values: per-row scales keep the other rows' precision
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["out"], axis=0)],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["n", 8])],
        [numpy_helper.from_array(table, "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    assert quantize_tables(model) == ["table"]
    onnx.checker.check_model(model)
    stored = {t.name: t.data_type for t in model.graph.initializer}
    assert stored == {"table_int8": TensorProto.INT8, "table_scale": TensorProto.FLOAT}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.arange(len(table), dtype=np.int64)
    got = session.run(None, {"ids": ids})[0]
    error = np.abs(got - table).max(axis=1) / np.abs(table).max(axis=1)
    assert error.max() <= 0.5 / 127 + 1e-6  # half a step of each row's own scale
