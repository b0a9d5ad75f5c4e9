"""The quality gate's pieces: the built-in calibration set, the agreement figures, the threshold check, the
precision options' closed sets, and the per-row int8 embedding table rewrite."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

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


def test_sparse_figures_are_the_overlap_of_the_largest_terms() -> None:
    rng = np.random.default_rng(0)
    want = np.maximum(rng.normal(size=(4, 200)), 0)  # about half the terms non-zero
    same = measure("sparse", want, want)
    assert same["figure"] == same["min_top_k_overlap"] == 1.0 and same["max_dot_rel_diff"] == 0.0
    got = want.copy()
    top = np.argsort(-want[2])[:32]
    got[2, top[:4]] = 0  # four of row 2's 32 largest terms lost: 28 of 32 kept (their places taken by others)
    figures = measure("sparse", want, got)
    assert figures["figure"] == round(28 / 32, 6) and figures["median_top_k_overlap"] == 1.0
    assert figures["metric"] == "min top-32 term overlap vs float32" and figures["items"] == 4
    few = np.zeros((1, 200))
    few[0, [3, 9]] = [1.0, 2.0]  # fewer non-zero terms than k: those are the top
    assert measure("sparse", few, few)["figure"] == 1.0
    assert measure("sparse", few, np.zeros((1, 200)))["figure"] == 0.0
    with pytest.raises(QualityError, match="min top-32 term overlap"):
        check("sparse", figures, None, "--quantize int8")  # 0.875 < the default 0.9


def test_check_refuses_below_the_threshold_with_the_figure() -> None:
    figures = measure("embedding", np.eye(2, dtype=np.float32), np.array([[1, 0.1], [0, 1]], np.float32))
    assert check("embedding", figures, 0.99, "--quantize int8")["passed"] is True
    with pytest.raises(QualityError, match=r"--quantize int8: quality 0\.995037 \(min cosine vs float32\) is below"):
        check("embedding", figures, 0.999, "--quantize int8")
    assert check("embedding", figures, None, "x")["min_quality"] == 0.99  # the task's default


def test_precision_closed_sets_list_the_valid_choices() -> None:
    with pytest.raises(PrecisionError, match="valid: float32, float16, bfloat16"):
        Precision(dtype="int4")
    with pytest.raises(PrecisionError, match="valid: int8, int8-block, int4"):
        Precision(quantize="int2")
    with pytest.raises(PrecisionError, match="choose one"):
        Precision(dtype="float16", quantize="int8")
    with pytest.raises(PrecisionError, match="between 0 and 1"):
        Precision(quantize="int8", min_quality=1.5)
    kept, unsupported = Precision(quantize="int8").backends(("onnx", "torch"), {}, None)
    assert kept == ("onnx",) and "int8" in unsupported["torch"]
    with pytest.raises(PrecisionError, match="no backend packs this model in bfloat16"):
        Precision(dtype="bfloat16").backends(("onnx",), {"torch": "no program"}, None)


def test_int8_dynamic_is_refused_with_its_reason_and_the_choices() -> None:
    """One activation scale per tensor: a text's answer would depend on its batch-mates (issue 38)."""
    with pytest.raises(PrecisionError) as refused:
        Precision(quantize="int8-dynamic")
    message = str(refused.value)
    assert "\n" not in message and "batch-mates" in message and "valid: int8, int8-block, int4" in message


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


def test_model_texts_hold_the_tokenizers_specials_lengths_and_scripts() -> None:
    """What users send that the generic set lacks (issue 38: mpnet's shipped int8 served `</s> <pad>` at 0.368)."""
    from infra.pack.calibration import model_texts
    from tests.tiny_models import build_tokenizer

    tokenizer, _ = build_tokenizer("mpnet", 16)
    texts = model_texts(tokenizer, 16)
    assert {"</s>", "<pad>", "<s>", "<mask>"} <= set(texts)
    assert any("</s>" in t and "<pad>" in t for t in texts)
    lengths = [len(tokenizer(t)["input_ids"]) for t in texts]
    assert 16 in lengths and 17 in lengths  # exactly the max length, and one token over
    assert max(lengths) > 16 * 4  # repetition far past it
    assert len(texts) == len(set(texts)) and "" not in texts


def test_model_texts_cover_each_script_of_the_vocabulary() -> None:
    from infra.pack.calibration import _scripts

    class Vocab:
        def get_vocab(self) -> dict[str, int]:
            return {w: i for i, w in enumerate(["[PAD]", "the", "##ing", "中", "##国", "ع", "ب", "я", "가", "1"])}

    assert _scripts(Vocab()) == ["ع ب", "中 国", "я", "가"]  # ARABIC, CJK, CYRILLIC, HANGUL; Latin is elsewhere


def test_embedding_figures_name_the_worst_text_and_the_retrieval_agreement() -> None:
    from infra.pack.calibration import RETRIEVAL_DOCS, RETRIEVAL_QUERIES, retrieval_texts

    texts = ["ok", *retrieval_texts(), "x" * 200]
    rng = np.random.default_rng(0)
    want = rng.standard_normal((len(texts), 16))
    got = want.copy()
    got[-1] = -want[-1]  # the long text is the worst
    figures = measure("embedding", want, got, texts=texts)
    assert figures["worst_text"] == "x" * 80 + "... (200 characters)"
    assert figures["retrieval_top1_agreement"] == figures["retrieval_top10_agreement"] == 1.0
    assert figures["min_cosine"] <= figures["p1_cosine"] <= figures["median_cosine"]
    docs = slice(1 + len(RETRIEVAL_QUERIES), 1 + len(RETRIEVAL_QUERIES) + len(RETRIEVAL_DOCS))
    shuffled = got.copy()
    shuffled[docs] = rng.standard_normal((len(RETRIEVAL_DOCS), 16))  # the documents' embeddings scrambled
    broken = measure("embedding", want, shuffled, texts=texts)
    assert broken["retrieval_top1_agreement"] < 0.5 and broken["retrieval_top10_agreement"] < 0.7
    assert "retrieval_top1_agreement" not in measure("embedding", want, got, texts=["a"] * len(texts))


def _linear_graph(where: Path, k: int = 64, n: int = 32) -> Path:
    """A float32 model.onnx (x -> MatMul(W) + b -> y, data beside it) with an outlier input channel."""
    from onnx import TensorProto, helper, numpy_helper

    from infra.pack.onnx_io import save_onnx_file

    rng = np.random.default_rng(1)
    weights = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w")]
    weights.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"))
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["xw"], name="/enc/MatMul"),
            helper.make_node("Add", ["xw", "b"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", n])],
        weights,
    )
    save_onnx_file(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), where)
    return where / "model.onnx"


def _activations(rows: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)
    x[:, 5] *= 40.0  # an outlier channel, as after GELU in a trained FFN
    return x


def test_int8_rows_are_quantized_alone_and_agree_with_float32(tmp_path: Path) -> None:
    """Per-row activation scales: a row's answer is the same alone and beside a row 1,000x larger (one scale
    per tensor, int8-dynamic's, loses it); with SmoothQuant's migration, close to float32."""
    import onnxruntime as ort

    from infra.pack.quantize import Int8Options, activation_maxima, matmul_groups, quantize_int8

    graph = _linear_graph(tmp_path / "float")
    feeds = [{"x": _activations(16, seed)} for seed in range(3)]
    import onnx

    groups = matmul_groups(onnx.load(str(graph), load_external_data=False), Int8Options())
    maxima, answers = activation_maxima(graph, groups, feeds)
    assert list(maxima) == ["x"] and maxima["x"].shape == (64,) and int(np.argmax(maxima["x"])) == 5
    # the x40 channel all in int8 (no float32 outlier channels): what the migration alone does
    model = quantize_int8(graph, Int8Options(outlier_channel=0.0), maxima)
    ops = [n.op_type for n in model.graph.node]
    assert "MatMulIntegerToFloat" in ops and "MatMul" not in ops
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    row = _activations(1, 7)
    loud = np.concatenate([row, 1000.0 * _activations(3, 8)])
    alone, beside = session.run(None, {"x": row})[0], session.run(None, {"x": loud})[0][:1]
    np.testing.assert_allclose(alone, beside, rtol=1e-6, atol=1e-6)
    want = answers[0]
    got = session.run(None, feeds[0])[0]
    cos = (want * got).sum(1) / (np.linalg.norm(want, axis=1) * np.linalg.norm(got, axis=1))
    assert cos.min() > 0.999, cos
    plain = quantize_int8(graph, Int8Options(alpha=0.0, outlier_channel=0.0), None)
    plain_session = ort.InferenceSession(plain.SerializeToString(), providers=["CPUExecutionProvider"])
    unsmoothed = plain_session.run(None, feeds[0])[0]
    error, plain_error = np.abs(got - want).mean(), np.abs(unsmoothed - want).mean()
    assert error < plain_error  # the migration moved the outlier channel's range into the weights


def test_int8_rows_are_quantized_as_the_numpy_reference_says(tmp_path: Path) -> None:
    """The in-graph per-row quantization (ReduceMax/ReduceMin, one QuantizeLinear with a block as wide as the
    row: opset 21) is u = round(x / s) + 128 with s = max|row| / 127, and the product is the integer one scaled
    back: the graph's answer equals numpy's, row by row."""
    import onnxruntime as ort
    from onnx import numpy_helper

    from infra.pack.quantize import QUANTIZE_OPSET, Int8Options, quantize_int8

    graph = _linear_graph(tmp_path / "float")
    model = quantize_int8(graph, Int8Options(alpha=0.0), None)
    assert [(o.domain, o.version) for o in model.opset_import if o.domain == ""] == [("", QUANTIZE_OPSET)]
    blocked = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert len(blocked) == 1 and {a.name: a.i for a in blocked[0].attribute}["block_size"] == 64
    # the row's zero point (128) from the scale's shape alone, and the peak from both ends of the row
    ops = [n.op_type for n in model.graph.node]
    assert ops[:8] == ["ReduceMax", "ReduceMin", "Neg", "Max", "Div", "Shape", "ConstantOfShape", "QuantizeLinear"]
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    q, wscale, bias = inits["w_int8"].astype(np.float64), inits["w_int8_scales"].astype(np.float64), inits["b"]
    x = _activations(8, 3)
    x[2] *= 1e4  # a loud row: its scale is its own
    s = np.abs(x).max(axis=1, keepdims=True).astype(np.float32) / np.float32(127.0)
    u = np.clip(np.rint(x / s) + 128, 0, 255) - 128
    want = (u @ q) * wscale * s + bias
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x})[0]
    error = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
    assert error.max() < 1e-5, error


def _gelu_graph(where: Path, k: int = 64, n: int = 32) -> Path:
    """A float32 model.onnx (x -> Gelu -> MatMul(W) + b -> y, data beside it): an FFN's second product."""
    from onnx import TensorProto, helper, numpy_helper

    from infra.pack.onnx_io import save_onnx_file

    rng = np.random.default_rng(2)
    weights = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w")]
    weights.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"))
    graph = helper.make_graph(
        [
            helper.make_node("Gelu", ["x"], ["h"], name="/enc/act"),
            helper.make_node("MatMul", ["h", "w"], ["hw"], name="/enc/MatMul"),
            helper.make_node("Add", ["hw", "b"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", n])],
        weights,
    )
    save_onnx_file(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9), where)
    return where / "model.onnx"


def _gelu(x: np.ndarray) -> np.ndarray:
    import math

    return np.asarray(0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0))), np.float64)


def test_int8_rows_after_a_gelu_take_the_gelus_floor_for_their_negative_side(tmp_path: Path) -> None:
    """A GELU's output is never below -0.16997: the row's peak is max(its largest value, GELU_FLOOR x the
    largest smoothing multiplier), one ReduceMax and no ReduceMin. Nothing is clipped (a row of GELU's minimum,
    all negative, still quantizes inside +-127), the graph equals numpy's reference row by row, and a row's
    answer is the same alone and beside rows 1,000x larger."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    from infra.pack.quantize import GELU_FLOOR, Int8Options, activation_maxima, matmul_groups, quantize_int8

    graph = _gelu_graph(tmp_path / "float")
    model = quantize_int8(graph, Int8Options(alpha=0.0, outlier_channel=0.0), None)
    ops = [n.op_type for n in model.graph.node]
    assert "ReduceMin" not in ops and ops.count("ReduceMax") == 1 and "MatMulIntegerToFloat" in ops
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    q, wscale, bias = inits["w_int8"].astype(np.float64), inits["w_int8_scales"].astype(np.float64), inits["b"]
    x = _activations(8, 4)
    x[2] *= 1e3  # a loud row
    x[3] = -0.7518  # GELU's minimum everywhere: the row's largest value is negative
    x[4] = -6.0  # GELU ~ -6e-9 everywhere: the floor sets the step, nothing rounds past it
    h = _gelu(x.astype(np.float64)).astype(np.float32)
    s = np.maximum(h.max(axis=1, keepdims=True), np.float32(GELU_FLOOR)) / np.float32(127.0)
    u = np.rint(h / s)
    assert np.abs(u).max() <= 127  # inside the range: the bound holds
    want = ((u @ q) * wscale * s + bias).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x})[0]
    error = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
    assert error.max() < 1e-5, error
    beside = session.run(None, {"x": np.concatenate([x[3:4], 1000.0 * _activations(3, 9)])})[0][:1]
    np.testing.assert_allclose(session.run(None, {"x": x[3:4]})[0], beside, rtol=1e-6, atol=1e-6)
    # smoothed: the floor scales with the largest multiplier, and the all-negative row stays close to float32
    feeds = [{"x": _activations(16, seed)} for seed in range(2)]
    groups = matmul_groups(onnx.load(str(graph), load_external_data=False), Int8Options())
    maxima, _ = activation_maxima(graph, groups, feeds)
    smoothed = quantize_int8(graph, Int8Options(outlier_channel=0.0), maxima)
    values = {t.name: numpy_helper.to_array(t) for t in smoothed.graph.initializer}
    floor = next(v for k, v in values.items() if k.endswith("_floor"))
    multiplier = next(v for k, v in values.items() if k.endswith("_smooth"))
    assert float(floor) == pytest.approx(GELU_FLOOR * float(multiplier.max()), rel=1e-6)
    float32 = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    int8 = ort.InferenceSession(smoothed.SerializeToString(), providers=["CPUExecutionProvider"])
    got = int8.run(None, {"x": x})[0]
    cos = (float32 * got).sum(1) / (np.linalg.norm(float32, axis=1) * np.linalg.norm(got, axis=1))
    assert cos.min() > 0.999, cos


def test_int8_outlier_channels_keep_their_products_in_float32(tmp_path: Path) -> None:
    """Channels whose calibration peak is past outlier_channel x the median's leave the int8 product (zeroed
    there) for a small float32 MatMul of their rows (Gather on the last axis): a row whose scale one massive
    channel set keeps its other channels, and a row's answer is still the same alone and in a batch."""
    import onnx
    import onnxruntime as ort

    from infra.pack.quantize import Int8Options, activation_maxima, matmul_groups, quantize_int8

    graph = _linear_graph(tmp_path / "float")
    feeds = [{"x": _activations(16, seed)} for seed in range(3)]
    feeds[0]["x"][3, 9] = 2000.0  # a massive activation: one token, one channel
    groups = matmul_groups(onnx.load(str(graph), load_external_data=False), Int8Options())
    maxima, answers = activation_maxima(graph, groups, feeds)
    split = quantize_int8(graph, Int8Options(outlier_channel=6.0, max_outlier_channels=4), maxima)
    gathers = [n for n in split.graph.node if n.op_type == "Gather"]
    assert len(gathers) == 1 and [n.op_type for n in split.graph.node].count("MatMul") == 1
    outliers = onnx.numpy_helper.to_array(next(t for t in split.graph.initializer if t.name == gathers[0].input[1]))
    assert outliers.tolist() == [5, 9]  # the x40 channel and the massive one, sorted

    w = onnx.numpy_helper.to_array(next(t for t in onnx.load(str(graph)).graph.initializer if t.name == "w"))
    massive = feeds[0]["x"][3, 9] * w[9]  # what the massive channel alone adds to the row

    def error(model: Any) -> float:
        """The row's error against what its 63 other channels add (which a scale set by 2000 rounds off)."""
        got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds[0])
        return float(np.linalg.norm(got[0][3] - answers[0][3]) / np.linalg.norm(answers[0][3] - massive))

    split_error, whole_error = error(split), error(quantize_int8(graph, Int8Options(outlier_channel=0.0), maxima))
    assert split_error < 0.02 and whole_error > 5 * split_error, (split_error, whole_error)
    session = ort.InferenceSession(split.SerializeToString(), providers=["CPUExecutionProvider"])
    alone = session.run(None, {"x": feeds[0]["x"][3:4]})[0]
    beside = session.run(None, {"x": np.concatenate([feeds[0]["x"][3:4], 100.0 * _activations(5, 9)])})[0][:1]
    np.testing.assert_allclose(alone, beside, rtol=1e-6, atol=1e-6)
    assert Int8Options(outlier_channel=6.0).to_json()["float_channels"].startswith("peak past 6.0")


def test_int8_exact_token_rows_run_in_float_and_only_where_unmasked(tmp_path: Path) -> None:
    """exact_tokens: the rows of those token ids (attention mask 1) get their product from a float MatMul
    (GatherND -> MatMul by the float16-stored weight -> ScatterND); other rows, and padding with the same id,
    stay int8; a batch with none of them runs; a row's answer is the same alone and in a batch."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from infra.pack.onnx_io import save_onnx_file
    from infra.pack.quantize import Int8Options, quantize_int8

    rng = np.random.default_rng(4)
    table, w = rng.standard_normal((50, 64)).astype(np.float32), rng.standard_normal((64, 32)).astype(np.float32)
    table[:, 5] *= 40.0
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "input_ids"], ["x"], name="/embeddings/Gather"),
            helper.make_node("MatMul", ["x", "w"], ["y"], name="/enc/MatMul"),
        ],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["b", "s"]) for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 32])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(w, "w")],
    )
    save_onnx_file(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), tmp_path)
    model = quantize_int8(tmp_path / "model.onnx", Int8Options(tables=False, exact_tokens=(0, 2)))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("GatherND") == 1 and ops.count("ScatterND") == 1 and "MatMulIntegerToFloat" in ops
    half = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16]
    assert [t.name for t in half] == ["w_half"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.array([[0, 7, 2, 9, 0], [0, 3, 2, 0, 0]], np.int64)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int64)  # the second row's last two are padding (id 0)
    got = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    want = table[ids] @ w
    error = np.linalg.norm(got - want, axis=-1) / np.linalg.norm(want, axis=-1)
    routed = np.isin(ids, (0, 2)) & (mask == 1)
    assert error[routed].max() < 2e-3  # float activations, float16 weights
    assert error[~routed].min() > 2e-3  # int8: the x40 channel's scale leaves the rest a few steps
    none = np.array([[7, 9, 3]], np.int64)
    plain = session.run(None, {"input_ids": none, "attention_mask": np.ones_like(none)})[0]
    # none routed (NonZero empty): the same int8 rows as beside the routed ones
    np.testing.assert_allclose(plain[0], np.stack([got[0, 1], got[0, 3], got[1, 1]]), rtol=1e-6, atol=1e-5)
    alone = session.run(None, {"input_ids": ids[1:, :3], "attention_mask": mask[1:, :3]})[0]
    np.testing.assert_allclose(alone[0], got[1, :3], rtol=1e-6, atol=1e-5)


def test_the_gate_fails_fast_on_a_sample_before_running_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pack the gate refuses says so after the sample (issue 38: int8-dynamic on mpnet was refused ~440 s in)."""
    from types import SimpleNamespace

    from infra.pack import quantize
    from infra.pack.quality import SAMPLE_EVERY, sample

    graph = _linear_graph(tmp_path / "float")
    feeds = [{"x": _activations(4, seed)} for seed in range(4 * SAMPLE_EVERY)]
    runs: list[str] = []
    runner = quantize._runner

    def counted(model: Path) -> object:
        run = runner(model)
        kind = "float32" if model == graph else "int8"

        def call(feed: dict[str, object]) -> object:
            runs.append(kind)
            return run(feed)

        return call

    monkeypatch.setattr(quantize, "_runner", counted)
    source = SimpleNamespace(task="embedding", problem_type=None)

    def gate(figures: dict[str, object], early: str = "") -> dict[str, object]:
        return check("embedding", figures, 0.9999999, "--quantize int8", early)

    with pytest.raises(QualityError, match=r"on a sample of 20 of the 64 calibration texts, checked first"):
        quantize.quantize_checked(source, graph, feeds, quantize.Int8Options(), tmp_path / "s", gate)
    assert runs == ["int8"] * len(sample(feeds))  # the float32 sample ran in the probe; nothing else ran
    runs.clear()
    _, figures = quantize.quantize_checked(source, graph, feeds, quantize.Int8Options(), tmp_path / "t", None)
    assert figures["items"] == 64 and runs.count("float32") == len(feeds) - len(sample(feeds))


def test_special_token_rows_stay_exact_in_an_int8_table() -> None:
    """The rows named (the tokenizer's special tokens: a text of them alone is the worst one) come back exact
    through the small float residual table; the others keep their per-row int8 step."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from infra.pack.quantize import MIN_TABLE_ROWS, quantize_tables

    table = np.random.default_rng(2).standard_normal((MIN_TABLE_ROWS + 5, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["out"], axis=0)],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["n", 8])],
        [numpy_helper.from_array(table, "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    assert quantize_tables(model, [0, 2, 10**9]) == ["table"]  # an id past the table is ignored
    exact = next(t for t in model.graph.initializer if t.name == "table_exact")
    assert list(exact.dims) == [3, 8]  # the zero row, then rows 0 and 2
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.arange(len(table), dtype=np.int64)
    got = session.run(None, {"ids": ids})[0]
    np.testing.assert_allclose(got[[0, 2]], table[[0, 2]], rtol=0, atol=1e-6)
    error = np.abs(got - table).max(axis=1) / np.abs(table).max(axis=1)
    assert 0 < error[1] <= 0.5 / 127 + 1e-6 and error.max() <= 0.5 / 127 + 1e-6


def test_the_search_keeps_the_group_that_breaks_the_worst_row_in_float32(tmp_path: Path) -> None:
    """Two MatMul groups, one fed a channel 1,000x the others (no SmoothQuant: one per-row scale crushes the
    rest of its row): the search keeps that one float32, measured, and stops there; with the target met by
    int8 alone it keeps nothing."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from infra.pack.int8_search import cosines, search
    from infra.pack.onnx_io import save_onnx_file
    from infra.pack.quantize import Int8Options, _runner, int8_answers, quantize_int8

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), n) for n in ("w1", "w2")]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["a"], name="/enc/a/MatMul"),
            helper.make_node("MatMul", ["z", "w2"], ["b"], name="/enc/b/MatMul"),
            helper.make_node("Add", ["a", "b"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", 64]) for n in ("x", "z")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])],
        inits,
    )
    save_onnx_file(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), tmp_path)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    x[:, 5] = 1000.0 * np.abs(x[:, 5]) + 1000.0
    feeds = [{"x": x, "z": rng.standard_normal((8, 64)).astype(np.float32)}]
    want = _runner(tmp_path / "model.onnx")(feeds[0])
    base = onnx.load(str(tmp_path / "model.onnx"))
    options = Int8Options(alpha=0.0, tables=False, weight_bits=7)  # 8 bits meet the target all int8 here

    def run(keep: object, feeds: object) -> object:
        return int8_answers(quantize_int8(base, options, None, keep), feeds)  # type: ignore[arg-type]

    found, got = search(run, ["x", "z"], feeds, want, target=0.9999, budget=0.5)
    assert found.kept == ["x"] and found.full[0] < 0.9999 <= found.full[-1]
    assert cosines(want, got).min() >= 0.9999
    assert search(run, ["x", "z"], feeds, want, target=0.5)[0].kept == []


def _two_layer_graph(where: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """input_ids -> table -> /encoder/layer.0/ MatMul -> /encoder/layer.1/ MatMul, data beside it; table[:, 5]
    x40 (the int8 rows' error stays visible)."""
    from onnx import TensorProto, helper, numpy_helper

    from infra.pack.onnx_io import save_onnx_file

    rng = np.random.default_rng(4)
    table = rng.standard_normal((50, 64)).astype(np.float32)
    table[:, 5] *= 40.0
    w0, w1 = (rng.standard_normal((64, 64)).astype(np.float32) for _ in range(2))
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "input_ids"], ["x"], name="/embeddings/Gather"),
            helper.make_node("MatMul", ["x", "w0"], ["h"], name="/encoder/layer.0/MatMul"),
            helper.make_node("MatMul", ["h", "w1"], ["y"], name="/encoder/layer.1/MatMul"),
        ],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["b", "s"]) for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 64])],
        [numpy_helper.from_array(a, n) for a, n in ((table, "table"), (w0, "w0"), (w1, "w1"))],
    )
    save_onnx_file(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), where)
    return table, w0, w1


def test_int8_exact_token_rows_can_stop_after_the_first_groups(tmp_path: Path) -> None:
    """exact_groups=1: the special rows run in float in the first group only (one float16 weight, one ScatterND),
    the second group all int8; the record says where."""
    import onnx
    import onnxruntime as ort

    from infra.pack.quantize import Int8Options, quantize_int8

    table, w0, w1 = _two_layer_graph(tmp_path)
    options = Int8Options(tables=False, outlier_channel=0.0, alpha=0.0, exact_tokens=(0, 2))
    every = quantize_int8(tmp_path / "model.onnx", options)
    first = quantize_int8(tmp_path / "model.onnx", replace(options, exact_groups=1))
    for model, halves in ((every, ["w0_half", "w1_half"]), (first, ["w0_half"])):
        assert [t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16] == halves
        assert [n.op_type for n in model.graph.node].count("ScatterND") == len(halves)
    ids = np.array([[0, 7, 2, 9]], np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    want = table[ids] @ w0 @ w1

    def error(model: object) -> np.ndarray:
        got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]  # type: ignore[attr-defined]
        return np.asarray(np.linalg.norm(got - want, axis=-1) / np.linalg.norm(want, axis=-1))

    routed = np.isin(ids, (0, 2))
    assert error(every)[routed].max() < 2e-3  # float in both groups
    assert 2e-3 < error(first)[routed].min() < error(first)[~routed].min()  # the second group's int8 error only
    assert "the first 1 groups" in replace(options, exact_groups=1).to_json()["exact_token_rows"]["how"]
    assert "every group" in options.to_json()["exact_token_rows"]["how"]


def test_float_paths_are_tried_cheapest_first_and_the_first_that_passes_is_kept(tmp_path: Path) -> None:
    """float_paths: all int8, the special rows in the first layer's groups, outlier channels, both, the special
    rows everywhere, both; choose_paths runs a plan on every text only once it passes on the hard rows."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from infra.pack.quantize import Int8Options, choose_paths, float_paths, layer_prefixes

    _two_layer_graph(tmp_path)
    model = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    options = Int8Options(float_rows=(0, 2), target=0.99)
    assert layer_prefixes(model, options) == [1]
    # five layers of two groups each: the first layer's 2 groups, the first 3 layers' 6
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    names = [f"/encoder/layer.{i}/{part}/MatMul" for i in range(5) for part in ("attention", "output")]
    nodes = [helper.make_node("MatMul", [f"x{k}", "w"], [f"x{k + 1}"], name=n) for k, n in enumerate(names)]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in ("x0", f"x{len(names)}")]
    five = helper.make_model(helper.make_graph(nodes, "g", io[:1], io[1:], [w]))
    assert layer_prefixes(five, options) == [2, 6]
    assert [p.exact_groups for p in float_paths(options, five) if p.exact_tokens] == [2, 2, 6, 6, -1, -1]
    plans = float_paths(options, model)
    assert [(bool(p.outlier_channel), p.exact_tokens and p.exact_groups) for p in plans] == [
        (False, ()),
        (False, 1),
        (True, ()),
        (True, 1),
        (False, -1),
        (True, -1),
    ]
    assert [(bool(p.outlier_channel), p.exact_tokens) for p in float_paths(replace(options, float_rows=()), model)] == [
        (False, ()),
        (True, ()),
    ]
    rng = np.random.default_rng(5)
    want = rng.standard_normal((12, 8))
    # each feed row carries its row number: a fake int8 graph answers want's row, negated where the plan is wrong
    feeds = [{"x": np.repeat(np.arange(6.0), 3).reshape(6, 3) + start} for start in (0, 6)]
    broken = {plans[0]: [3], plans[1]: [3], plans[2]: [7], plans[3]: []}
    full_runs = []

    def runner(plan: Int8Options) -> object:
        def run(keep: object, some: list[dict[str, np.ndarray]]) -> Any:
            if some is feeds:
                full_runs.append(plans.index(plan))
            rows = np.concatenate([f["x"][:, 0] for f in some]).astype(int)
            return np.where(np.isin(rows, broken[plan])[:, None], -want[rows], want[rows])

        return run

    chosen, got, tried = choose_paths(runner, plans, feeds, want)  # type: ignore[arg-type]
    # plans 1 and 2 failed on the hard rows (plan 0's worst 16: here every row): never run on every feed
    assert full_runs == [0, 3] and chosen == plans[3]
    assert [t.get("min_cosine", t.get("hard_rows_min_cosine")) for t in tried] == [-1.0, -1.0, -1.0, 1.0]
    assert (
        "hard_rows_min_cosine" in tried[1]
        and "hard_rows_min_cosine" in tried[2]
        and tried[3]
        == {
            "outlier_channels": True,
            "exact_token_groups": 1,
            "min_cosine": 1.0,
        }
    )
    np.testing.assert_allclose(got, want)
