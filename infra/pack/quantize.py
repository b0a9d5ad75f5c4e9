"""`--quantize int8` / `int8-block`: the exported float32 graph's weights stored as int8, in ONNX Runtime's
quantized operators (`int8-dynamic` is refused: REFUSED says why).

"int8" (the default): each MatMul by a constant weight becomes ORT's MatMulIntegerToFloat with per-output-channel
weight scales (7-bit: on a CPU without VNNI, MLAS's u8 x s8 pair sums saturate int16 at 8 bits, measured) and
each token's activations quantized with its own scale in the graph (ReduceMax and ReduceMin per row, or the
GELU's known floor for the negative side after a GELU; standard operators),
after a SmoothQuant migration (alpha 0.5) from the float32 graph's activation maxima on the calibration sample:
a row's answer never depends on its batch-mates. "int8-block": MatMulNBits with 8-bit weights, symmetric, one
scale per block of 32 along K, accuracy level 4 (activations quantized per block of each row at run time).

Both: embedding tables (a Gather of a large 2-D initializer by token ids: the word table alone is half of
MiniLM's bytes) stored int8 with one float32 scale per row, looked up as Gather(int8) -> Cast -> Mul(Gather(scales)):
standard operators, each row's error bounded by its own largest value. Kept in float: the task's head after the
encoder (sentence-transformers Dense modules, a classifier, a pooler: few weights, and their error lands in the
answer unaveraged), anything named in `exclude`, the groups int8's sensitivity search keeps (infra.pack.int8_search)
and the special tokens' table rows (exact). int8's float paths (outlier channels, the special tokens' rows in the
first layer's, the first half's or every group) are chosen per model, the cheapest that reaches the target
(float_paths). Figures: docs/benchmarks.md, "int8 that is fast and right" and "int8:
the sensitivity search and the special tokens".

About one thing (turning one float32 encoder graph into its int8 form behind the quality gate: the methods share
the MatMul grouping, the tables, the head exclusions and the checked run that calls them), hence one module.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

METHODS = ("int8", "int8-block")
# Refused with the reason (Precision checks it before any work): the choices that exist no more.
REFUSED = {
    "int8-dynamic": (
        "one activation scale per tensor: a text's answer depends on its batch-mates (alone vs inside a 32-text "
        "request, cosine 0.964 on all-MiniLM-L6-v2 and 0.351 on all-mpnet-base-v2)"
    ),
}
# Node names (torch.onnx names nodes after the module path) kept in float: the head after the encoder.
HEAD = re.compile(r"^/(dense|model/classifier|model/pooler|classifier|pooler)/")
# Embedding table rows kept exact besides the special tokens: a row's int8 error past OUTLIER_ROW x the median
# (MiniLM: `.`, `,`, [CLS], [SEP], [PAD] are among the worst ~10), at most MAX_FLOAT_ROWS (a few hundred KB).
OUTLIER_ROW = 0.0  # 0: none (3.0 on MiniLM lowered the all-int8 worst text, 0.9561 vs 0.9725 with no exact rows)
MAX_FLOAT_ROWS = 256
MIN_TABLE_ROWS = 1000  # smaller tables (positions, token types) stay float: a few KB, read for every token
BLOCK = 32  # MatMulNBits' block along K: 128 measured min cosine 0.997 vs 0.999 at 32 on MiniLM, no faster
ACCURACY_LEVEL = 4  # int8 activations (per block), integer dot products: MLAS's fast path
SEARCH_COSINE = 0.99  # the worst cosine int8's sensitivity search aims at, at least (infra.pack.int8_search)
ALPHA = 0.5  # SmoothQuant's migration strength (the paper's default for BERT-sized encoders)
# int8: an activation channel whose calibration peak is past OUTLIER_CHANNEL x the median channel's keeps its
# products in float32 (LLM.int8()'s decomposition), at most MAX_OUTLIER_CHANNELS per group: the row scale is
# then set by the row's ordinary channels (7-bit weights, 516 texts: p1 0.957 -> 0.989 on all-mpnet-base-v2,
# 0.9922 -> 0.9945 on MiniLM; mpnet's peaks reach 50-100x the median channel's)
OUTLIER_CHANNEL = 6.0
MAX_OUTLIER_CHANNELS = 16
# int8: 8-bit weights (+-127). The CPUs measured with VNNI/AMX (MLAS's tdpbusd / vpdpbusd) add u8 x s8 products in
# int32; AVX2 alone adds pairs in int16 (vpmaddubsw) and saturates there (7 bits kept it inside: MiniLM min
# cosine 0.986 vs 0.969 on an AVX2 host). 7 bits cost mpnet its gate: p1 0.989 vs 0.9925 at 8 (outlier channels)
WEIGHT_BITS = 8
# int8: activations produced by a GELU (the exporter's fused forms and ONNX's own) are never below -0.16997
# (erf form, at x = -0.752; the tanh form's is -0.17004): a bound for the row's negative side (no ReduceMin)
GELUS = frozenset({"Gelu", "BiasGelu", "FastGelu"})
GELU_FLOOR = 0.171
QUANTIZE_OPSET = 21  # QuantizeLinear's block_size (a block per row)
QUANTIZE_IR = 10  # what opset 21 needs
Feeds = dict[str, Any]


@dataclass(frozen=True)
class Int8Options:
    """What `quantize_int8` does; the defaults are what `--quantize int8` packs."""

    method: str = "int8"
    tables: bool = True  # embedding tables per-row int8
    exclude: tuple[str, ...] = ()  # regexes on node names, kept in float (besides the head)
    block_size: int = BLOCK  # int8-block
    alpha: float = ALPHA  # int8: SmoothQuant migration, 0 for none
    weight_bits: int = WEIGHT_BITS  # 7: +-63, inside int16 where MLAS multiplies without VNNI (WEIGHT_BITS)
    weight_type: str = "s8"  # int8: "u8" stores weights uint8 with zero point 128 (MLAS's u8u8 kernels)
    float_rows: tuple[int, ...] = ()  # embedding table rows kept exact (the tokenizer's special tokens)
    target: float = 0.0  # int8: the worst cosine the sensitivity search keeps groups float32 for (0: no search)
    outlier_channel: float = OUTLIER_CHANNEL  # int8: 0 for no float32 channels
    # int8: token ids whose rows (where the attention mask is 1) the MatMuls of the first `exact_groups` groups
    # (graph order; -1: every group) run in float, with float16 weights (exact_token_rows); () for none. Both,
    # and outlier_channel, are chosen by the search (float_paths: the cheapest that reaches the target)
    exact_tokens: tuple[int, ...] = ()
    max_outlier_channels: int = MAX_OUTLIER_CHANNELS
    exact_groups: int = -1

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            reason = f" ({REFUSED[self.method]})" if self.method in REFUSED else ""
            raise ValueError(f"--quantize {self.method!r}{reason}; valid: {', '.join(METHODS)}")

    @property
    def fuse_attention(self) -> bool:
        """Whether the graph quantized may have ORT's fused Attention: both methods need q, k and v as MatMuls
        (a fused Attention's weights would stay float: 0.36x the size instead of 0.27x on MiniLM)."""
        return False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "weights": "int8"}
        if self.method == "int8-block":
            out.update(
                operator="MatMulNBits", block_size=self.block_size, symmetric=True, accuracy_level=ACCURACY_LEVEL
            )
        else:
            out.update(
                operator="MatMulIntegerToFloat",
                activations="uint8, a scale per row (token), zero point 128",
                weight_scales="per output channel, symmetric",
                weight_bits=self.weight_bits,
                smoothquant_alpha=self.alpha,
                float_channels=f"peak past {self.outlier_channel} x the median channel's, "
                f"at most {self.max_outlier_channels} per group"
                if self.outlier_channel
                else "none",
                search_target=self.target,
            )
        out["embedding_tables"] = "int8, a scale per row" if self.tables else "float32"
        if self.tables:
            out["exact_table_rows"] = "the special tokens' and the worst-quantized rows (at most 256)"
        if self.method == "int8" and self.exact_tokens:
            where = "every group" if self.exact_groups < 0 else f"the first {self.exact_groups} groups"
            out["exact_token_rows"] = {
                "token_ids": list(self.exact_tokens),
                "how": f"their unmasked rows through float MatMuls (float16-stored weights) in {where}",
            }
        out["kept_float"] = ["head after the encoder", *self.exclude]
        return out


def excluded(name: str, options: Int8Options) -> bool:
    return bool(HEAD.match(name)) or any(re.search(p, name) for p in options.exclude)


def quantize_int8(
    model: Any,
    options: Int8Options | None = None,
    maxima: dict[str, Any] | None = None,
    keep: Iterable[str] = (),
    float_rows: Iterable[int] = (),
) -> Any:
    """The int8 graph of the float32 `model` (an onnx.ModelProto with its initializers loaded, or the path of
    one saved with its data beside it). `model` is left as it was. int8: `maxima` (activation_maxima) for
    SmoothQuant, None for none; `keep`: groups (activation input names) left float; `float_rows`: embedding
    table rows (token ids, the tokenizer's special tokens) kept exact (quantize_tables)."""
    import onnx

    options = options or Int8Options()
    if isinstance(model, str | Path):
        out = onnx.load(str(model), load_external_data=True)
    else:
        out = onnx.ModelProto()
        out.CopyFrom(model)
    if options.method == "int8-block":
        quantize_matmuls_blockwise(out, options)
    else:
        quantize_matmuls_rowwise(out, maxima, options, keep)
    if options.tables:
        quantize_tables(out, float_rows)
    return out


def quantize_matmuls_blockwise(model: Any, options: Int8Options) -> list[str]:
    """Each MatMul by a constant 2-D float32 weight -> MatMulNBits (8 bits, symmetric, blocks along K), in
    place; the nodes rewritten."""
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.capi._pybind_state import quantize_matmul_8bits  # ORT's own packing (what its quantizer calls)

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    block = options.block_size
    done = []
    for node in list(graph.node):
        if node.op_type != "MatMul" or node.input[1] not in inits or excluded(node.name, options):
            continue
        weight = inits[node.input[1]]
        if weight.data_type != TensorProto.FLOAT or len(weight.dims) != 2:
            continue
        w = numpy_helper.to_array(weight).astype(np.float32)
        rows, cols = w.shape
        k_blocks = -(-rows // block)
        if k_blocks * block != rows:
            w = np.pad(w, ((0, k_blocks * block - rows), (0, 0)))
        packed = np.zeros((cols, k_blocks, block), dtype=np.uint8)
        zero = np.zeros((cols, k_blocks), dtype=np.uint8)  # symmetric: unused
        scales = np.zeros((cols, k_blocks), dtype=np.float32)
        quantize_matmul_8bits(packed, np.ascontiguousarray(w), scales, zero, block, cols, rows, True)
        q_name, s_name = f"{node.input[1]}_int8", f"{node.input[1]}_int8_scales"
        graph.initializer.extend(
            [numpy_helper.from_array(packed, q_name), numpy_helper.from_array(scales.ravel(), s_name)]
        )
        replacement = helper.make_node(
            "MatMulNBits",
            [node.input[0], q_name, s_name],
            [node.output[0]],
            name=f"{node.name}_int8",
            domain="com.microsoft",
            K=rows,
            N=cols,
            bits=8,
            block_size=block,
            accuracy_level=ACCURACY_LEVEL,
        )
        index = list(graph.node).index(node)
        graph.node.remove(node)
        graph.node.insert(index, replacement)
        done.append(node.name)
    if done and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.add(domain="com.microsoft", version=1)
    _drop_unused(graph)
    return done


def matmul_groups(model: Any, options: Int8Options) -> dict[str, list[Any]]:
    """The MatMuls by a constant 2-D float32 weight (not excluded), grouped by their activation input: a group's
    activations are quantized once (query, key and value share theirs)."""
    from onnx import TensorProto

    inits = {t.name: t for t in model.graph.initializer}
    groups: dict[str, list[Any]] = {}
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in inits or excluded(node.name, options):
            continue
        weight = inits[node.input[1]]
        if weight.data_type == TensorProto.FLOAT and len(weight.dims) == 2:
            groups.setdefault(node.input[0], []).append(node)
    return groups


def activation_maxima(graph: Path, groups: Iterable[str], feeds: Iterable[Feeds]) -> tuple[dict[str, Any], list[Any]]:
    """Each group's activation input's largest magnitude per channel (the last axis, padding left out) over the
    float32 graph's runs on `feeds` (what SmoothQuant's migration is computed from), and the graph's first
    output on each feed (the gate's reference: one float32 run serves both). `graph`: a model.onnx with its data
    beside it; the probe (the graph with those tensors as outputs) is written beside it, sharing its data file,
    never serialized whole."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    probe = onnx.load(str(graph), load_external_data=False)
    names = [probe.graph.output[0].name, *groups]
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names if n not in known)
    where = graph.parent / "activation-probe.onnx"
    onnx.save_model(probe, str(where))
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(str(where), options, providers=["CPUExecutionProvider"])
    finally:
        where.unlink()
    wanted = {i.name for i in session.get_inputs()}
    out: dict[str, Any] = {}
    answers = []
    for feed in feeds:
        mask = feed.get("attention_mask")
        values = session.run(names, {k: v for k, v in feed.items() if k in wanted})
        answers.append(values[0])
        for name, value in zip(names[1:], values[1:], strict=True):
            value = np.abs(np.asarray(value, np.float32))
            if mask is not None and value.ndim == 3 and value.shape[:2] == mask.shape:
                value = value[mask.astype(bool)]  # padding's activations are never an answer's
            peak = value.reshape(-1, value.shape[-1]).max(axis=0)
            out[name] = peak if name not in out else np.maximum(out[name], peak)
    return out, answers


def quantize_matmuls_rowwise(
    model: Any, maxima: dict[str, Any] | None, options: Int8Options, keep: Iterable[str] = ()
) -> list[str]:
    """Each group of MatMuls by a constant weight (matmul_groups) -> integer matmuls, in place; the groups
    rewritten (named by their activation input). Per group:

    - SmoothQuant (alpha = options.alpha): per input channel j, s_j = max|X_j|^alpha / max|W_j|^(1-alpha) from
      the calibration `maxima`; X / s at run time (one Mul by a constant), W * s in the weights. Large
      activation channels move part of their range into the weights, which have a scale per output channel.
    - the activations quantized per row (token) at run time: scale = max|row| / 127, u = round(x / scale) + 128
      (after a GELU: max(the row's largest value, GELU_FLOOR x the largest multiplier) for max|row|)
      (uint8, zero point 128: MLAS's u8s8 kernels), so a row's step never depends on its batch-mates.
    - weights int8, symmetric, a scale per output channel (+-127, or +-63 with options.weight_bits 7).
    - MatMulIntegerToFloat (com.microsoft: the integer GEMM with the weight scales applied in its output pass),
      then a Mul by the row scales.
    Groups named in `keep` stay float (mixed precision)."""
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    kept = set(keep)
    selected = exact_token_rows(model, options.exact_tokens)
    limit = 2 ** (options.weight_bits - 1) - 1
    done = []
    everything = selected
    producers = {o: node for node in graph.node for o in node.output}
    for index, (x, nodes) in enumerate(matmul_groups(model, options).items()):
        if x in kept:
            continue
        selected = everything if options.exact_groups < 0 or index < options.exact_groups else ""
        weights = [numpy_helper.to_array(inits[n.input[1]]).astype(np.float32) for n in nodes]
        tag = _safe(x)
        first = list(graph.node).index(nodes[0])
        added: list[Any] = []
        act = None if maxima is None else maxima.get(x)
        outliers = outlier_channels(act, options) if act is not None else np.zeros(0, np.int64)
        # the outlier channels' products stay float32: their rows of the weights, unsmoothed
        exact = [w[outliers] for w in weights]
        originals = [w.copy() for w in weights] if selected else []
        multiplier = np.ones(weights[0].shape[0], np.float32)
        if options.alpha > 0 and act is not None:
            rest = np.asarray(act, np.float64).copy()
            rest[outliers] = 0  # scale 1 there: those channels leave the int8 product
            scale = smooth_scale(rest, weights, options.alpha)
            weights = [w * scale[:, None].astype(np.float32) for w in weights]
            multiplier = (1.0 / scale).astype(np.float32)
        if len(outliers):
            multiplier[outliers] = 0.0
            for w in weights:
                w[outliers] = 0.0
        source = x
        if (options.alpha > 0 and act is not None) or len(outliers):
            graph.initializer.append(numpy_helper.from_array(multiplier, f"{tag}_smooth"))
            added.append(helper.make_node("Mul", [x, f"{tag}_smooth"], [f"{tag}_smoothed"], name=f"{tag}_smooth"))
            source = f"{tag}_smoothed"
        if len(outliers):
            graph.initializer.append(numpy_helper.from_array(outliers.astype(np.int64), f"{tag}_outliers"))
            added.append(
                helper.make_node("Gather", [x, f"{tag}_outliers"], [f"{tag}_wide"], name=f"{tag}_outliers", axis=-1)
            )
        n = f"{tag}_q"
        graph.initializer.extend(
            [
                numpy_helper.from_array(np.array([-1], np.int64), f"{tag}_axis"),
                numpy_helper.from_array(np.array(1e-12, np.float32), f"{tag}_tiny"),
                numpy_helper.from_array(np.array(127.0, np.float32), f"{tag}_127"),
                numpy_helper.from_array(np.array(128, np.uint8), f"{tag}_zero"),
                numpy_helper.from_array(np.array(1.0, np.float32), f"{tag}_one"),
            ]
        )
        width = weights[0].shape[0]
        # The row's peak from ReduceMax and ReduceMin (no |x| tensor written), then one QuantizeLinear with a
        # block as wide as the row (opset 21): 3x faster than Div, Round, Add, Cast (1 thread, 32 x 128 x 768)
        added.append(helper.make_node("ReduceMax", [source, f"{tag}_axis"], [f"{n}_hi"], name=f"{n}_hi", keepdims=1))
        producer = producers.get(x)
        if producer is not None and producer.op_type in GELUS:
            # A GELU's output is never below -GELU_FLOOR: the smoothed row's negative side is bounded by
            # GELU_FLOOR x the largest multiplier, so that bound replaces the ReduceMin over the FFN's widest
            # activation (nothing is clipped; a row whose peak is under the bound gets a coarser step)
            floor = np.float32(max(GELU_FLOOR * float(multiplier.max()), 1e-12))
            graph.initializer.append(numpy_helper.from_array(np.array(floor, np.float32), f"{tag}_floor"))
            added.append(helper.make_node("Max", [f"{n}_hi", f"{tag}_floor"], [f"{n}_peak"], name=f"{n}_peak"))
        else:
            added += [
                helper.make_node("ReduceMin", [source, f"{tag}_axis"], [f"{n}_lo"], name=f"{n}_lo", keepdims=1),
                helper.make_node("Neg", [f"{n}_lo"], [f"{n}_neg"], name=f"{n}_neg"),
                helper.make_node("Max", [f"{n}_hi", f"{n}_neg", f"{tag}_tiny"], [f"{n}_peak"], name=f"{n}_peak"),
            ]
        added += [
            helper.make_node("Div", [f"{n}_peak", f"{tag}_127"], [f"{n}_scale"], name=f"{n}_scale"),
            # blocked QuantizeLinear wants a zero point of the scale's shape: 128 per row, made from the
            # scale's shape alone (two small nodes, where Mul by 0, Add 128, Cast were three)
            helper.make_node("Shape", [f"{n}_scale"], [f"{n}_shape"], name=f"{n}_shape"),
            helper.make_node(
                "ConstantOfShape",
                [f"{n}_shape"],
                [f"{n}_zp"],
                name=f"{n}_zp",
                value=numpy_helper.from_array(np.array([128], np.uint8)),
            ),
            helper.make_node(
                "QuantizeLinear",
                [source, f"{n}_scale", f"{n}_zp"],
                [f"{n}_u8"],
                name=f"{n}_u8",
                axis=-1,
                block_size=width,
            ),
        ]
        for node, w, kept_rows in zip(nodes, weights, exact, strict=True):
            wscale = np.abs(w).max(axis=0) / limit
            wscale[wscale == 0] = 1.0
            q = np.clip(np.rint(w / wscale), -limit, limit)
            name = node.input[1]
            graph.initializer.append(numpy_helper.from_array(wscale.astype(np.float32), f"{name}_int8_scales"))
            inputs = [f"{n}_u8", f"{name}_int8", f"{tag}_one", f"{name}_int8_scales", f"{tag}_zero"]
            if options.weight_type == "u8":  # MLAS's u8u8 kernels widen to int16 first: no saturation, 8 bits
                graph.initializer.append(numpy_helper.from_array((q + 128).astype(np.uint8), f"{name}_int8"))
                zero = np.full(q.shape[1], 128, np.uint8)
                graph.initializer.append(numpy_helper.from_array(zero, f"{name}_int8_zero"))
                inputs.append(f"{name}_int8_zero")
            else:
                graph.initializer.append(numpy_helper.from_array(q.astype(np.int8), f"{name}_int8"))
            out = node.output[0]
            rows = f"{out}_int8" if len(outliers) or selected else out
            added += [
                helper.make_node(
                    "MatMulIntegerToFloat",
                    inputs,
                    [f"{out}_unscaled"],
                    name=f"{node.name}_int8",
                    domain="com.microsoft",
                ),
                helper.make_node("Mul", [f"{out}_unscaled", f"{n}_scale"], [rows], name=f"{node.name}_rows"),
            ]
            if len(outliers):
                graph.initializer.append(numpy_helper.from_array(kept_rows, f"{name}_outlier_rows"))
                added += [
                    helper.make_node(
                        "MatMul", [f"{tag}_wide", f"{name}_outlier_rows"], [f"{out}_wide"], name=f"{node.name}_wide"
                    ),
                    helper.make_node(
                        "Add",
                        [rows, f"{out}_wide"],
                        [f"{out}_split" if selected else out],
                        name=f"{node.name}_outliers",
                    ),
                ]
                rows = f"{out}_split"
            if selected:
                added += _float_rows(graph, x, node, originals[nodes.index(node)], rows, selected)
            graph.node.remove(node)
        for k, node in enumerate(added):
            graph.node.insert(first + k, node)
        done.append(x)
    if done:
        _opset_at_least(model, "", QUANTIZE_OPSET)
        _opset_at_least(model, "com.microsoft", 1)
    _drop_unused(graph)
    return done


def exact_token_rows(model: Any, tokens: Sequence[int]) -> str:
    """The [n, 2] (batch, position) indices of the rows whose token is one of `tokens` and unmasked, computed
    once at the graph's start (nodes added in place); "" when there are none to route (no `tokens`, or no
    input_ids). Each row's route depends on its own token alone: never on its batch-mates."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    names = {i.name for i in graph.input}
    if not tokens or "input_ids" not in names:
        return ""
    ids = np.array(sorted(set(tokens)), np.int64).reshape(1, 1, -1)
    graph.initializer.extend(
        [numpy_helper.from_array(ids, "int8_exact_ids"), numpy_helper.from_array(np.array([-1], np.int64), "int8_last")]
    )
    nodes = [
        helper.make_node("Unsqueeze", ["input_ids", "int8_last"], ["int8_ids3"], name="int8_ids3"),
        helper.make_node("Equal", ["int8_ids3", "int8_exact_ids"], ["int8_each"], name="int8_each"),
        helper.make_node("Cast", ["int8_each"], ["int8_each_n"], name="int8_each_n", to=TensorProto.INT64),
        helper.make_node("ReduceMax", ["int8_each_n", "int8_last"], ["int8_any"], name="int8_any", keepdims=0),
    ]
    picked = "int8_any"
    if "attention_mask" in names:  # padding's rows are never an answer's
        nodes.append(helper.make_node("Mul", ["int8_any", "attention_mask"], ["int8_live"], name="int8_live"))
        picked = "int8_live"
    nodes += [
        helper.make_node("NonZero", [picked], ["int8_where"], name="int8_where"),
        helper.make_node("Transpose", ["int8_where"], ["int8_exact_rows"], name="int8_exact_rows", perm=[1, 0]),
    ]
    for k, node in enumerate(nodes):
        graph.node.insert(k, node)
    return "int8_exact_rows"


def _float_rows(graph: Any, x: str, node: Any, weight: Any, rows: str, selected: str) -> list[Any]:
    """Nodes writing node.output[0]: `rows` (the int8 product) with the `selected` rows replaced by their float
    product (GatherND -> MatMul by the float16-stored weight -> ScatterND)."""
    from onnx import TensorProto, helper, numpy_helper

    out, name = node.output[0], node.input[1]
    graph.initializer.append(numpy_helper.from_array(weight.astype(np.float16), f"{name}_half"))
    return [
        helper.make_node("GatherND", [x, selected], [f"{out}_exact_in"], name=f"{node.name}_exact_in"),
        helper.make_node("Cast", [f"{name}_half"], [f"{name}_float"], name=f"{node.name}_float", to=TensorProto.FLOAT),
        helper.make_node("MatMul", [f"{out}_exact_in", f"{name}_float"], [f"{out}_exact"], name=f"{node.name}_exact"),
        helper.make_node("ScatterND", [rows, selected, f"{out}_exact"], [out], name=f"{node.name}_exact_rows"),
    ]


def outlier_channels(act: Any, options: Int8Options) -> Any:
    """The input channels whose products stay float32: calibration peak past options.outlier_channel x the
    median channel's, the largest options.max_outlier_channels at most, sorted."""
    act = np.asarray(act, np.float64)
    if not options.outlier_channel or not len(act):
        return np.zeros(0, np.int64)
    bar = options.outlier_channel * float(np.median(act))
    order = np.argsort(-act)[: options.max_outlier_channels]
    return np.sort(order[act[order] > bar]).astype(np.int64)


def _opset_at_least(model: Any, domain: str, version: int) -> None:
    for entry in model.opset_import:
        if entry.domain == domain:
            entry.version = max(entry.version, version)
            break
    else:
        model.opset_import.add(domain=domain, version=version)
    if domain == "":
        model.ir_version = max(model.ir_version, QUANTIZE_IR)


def smooth_scale(act: Any, weights: list[Any], alpha: float) -> Any:
    """SmoothQuant's per-input-channel s_j = max|X_j|^alpha / max|W_j|^(1-alpha) (1 where either is 0)."""
    act = np.asarray(act, np.float64)
    wmax = np.max(np.abs(np.concatenate(weights, axis=1)), axis=1).astype(np.float64)
    scale = np.where((act > 0) & (wmax > 0), act**alpha / np.maximum(wmax, 1e-12) ** (1 - alpha), 1.0)
    return np.clip(scale, 1e-5, 1e5)


def _safe(name: str) -> str:
    return "int8" + re.sub(r"[^A-Za-z0-9_]", "_", name)


def quantize_tables(model: Any, float_rows: Iterable[int] = ()) -> list[str]:
    """Rewrite each Gather of a large 2-D float32 initializer used by nothing else (an embedding table) into a
    per-row int8 lookup, in place; the tables rewritten. Rows kept exact: `float_rows` (the special tokens: a
    text of specials alone, `</s> <pad>`, fell to cosine 0.345 on all-mpnet-base-v2 from the table's 3% row
    error) and the rows whose int8 error is past OUTLIER_ROW x the median (at most MAX_FLOAT_ROWS of them). Their
    error is added back from a small float table: + Gather(residual, Gather(row_map, ids)), row 0 all zeros."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    users: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            users[i] = users.get(i, 0) + 1
    done = []
    for node in list(graph.node):
        if node.op_type != "Gather" or node.input[0] not in inits or users.get(node.input[0]) != 1:
            continue
        table = inits[node.input[0]]
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if table.data_type != TensorProto.FLOAT or len(table.dims) != 2 or axis != 0 or table.dims[0] < MIN_TABLE_ROWS:
            continue
        values = numpy_helper.to_array(table).astype(np.float32)
        scale = np.abs(values).max(axis=1) / 127.0
        scale[scale == 0] = 1.0
        q = np.clip(np.rint(values / scale[:, None]), -127, 127).astype(np.int8)
        residual = values - q.astype(np.float32) * scale[:, None]
        rows = exact_rows(values, residual, float_rows)
        name, out, ids = table.name, node.output[0], node.input[1]
        graph.initializer.remove(table)
        graph.initializer.extend(
            [numpy_helper.from_array(q, f"{name}_int8"), numpy_helper.from_array(scale.reshape(-1, 1), f"{name}_scale")]
        )
        index = list(graph.node).index(node)
        graph.node.remove(node)
        wide = f"{out}_dequantized" if len(rows) else out
        lookup = [
            helper.make_node("Gather", [f"{name}_int8", ids], [f"{out}_int8"], name=f"{node.name}_int8", axis=0),
            helper.make_node("Cast", [f"{out}_int8"], [f"{out}_wide"], name=f"{node.name}_cast", to=TensorProto.FLOAT),
            helper.make_node("Gather", [f"{name}_scale", ids], [f"{out}_scale"], name=f"{node.name}_scale", axis=0),
            helper.make_node("Mul", [f"{out}_wide", f"{out}_scale"], [wide], name=f"{node.name}_dequantize"),
        ]
        if len(rows):
            row_map = np.zeros(len(values), np.int32)
            row_map[rows] = np.arange(1, len(rows) + 1, dtype=np.int32)
            small = np.concatenate([np.zeros((1, values.shape[1]), np.float32), residual[rows]])
            graph.initializer.extend(
                [numpy_helper.from_array(row_map, f"{name}_row_map"), numpy_helper.from_array(small, f"{name}_exact")]
            )
            lookup += [
                helper.make_node("Gather", [f"{name}_row_map", ids], [f"{out}_row"], name=f"{node.name}_row", axis=0),
                helper.make_node("Gather", [f"{name}_exact", f"{out}_row"], [f"{out}_fix"], name=f"{node.name}_fix"),
                helper.make_node("Add", [wide, f"{out}_fix"], [out], name=f"{node.name}_exact"),
            ]
        for k, n in enumerate(lookup):
            graph.node.insert(index + k, n)
        done.append(name)
    return done


def exact_rows(values: Any, residual: Any, float_rows: Iterable[int]) -> Any:
    """The table rows kept exact: `float_rows` in range, and the worst-quantized rows (relative error past
    OUTLIER_ROW x the median), at most MAX_FLOAT_ROWS in all, sorted."""
    wanted = {int(r) for r in float_rows if 0 <= int(r) < len(values)}
    if OUTLIER_ROW:
        error = np.linalg.norm(residual, axis=1) / np.maximum(np.linalg.norm(values, axis=1), 1e-12)
        bar = OUTLIER_ROW * np.median(error)
        wanted |= {int(i) for i in np.argsort(-error)[: MAX_FLOAT_ROWS - len(wanted)] if error[i] > bar}
    return np.array(sorted(wanted)[:MAX_FLOAT_ROWS], np.int64)


def _drop_unused(graph: Any) -> None:
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for tensor in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(tensor)


def pack_int8(
    source: Any,
    exported: Any,
    staged: Path,
    tmp: Path,
    precision: Any,
    calibration: list[dict[str, Any]],
    texts: list[str] | None = None,
    float_rows: Iterable[int] = (),
) -> dict[str, Any]:
    """`pack --from --quantize`: quantize the exported, checked float32 graph (`exported`, hf_export.Exported: its
    fusions chosen by `Int8Options.fuse_attention`), gate it (QualityError below the threshold, before anything
    is published: first on a sample, then on every text) and write it into `tmp`; the onnx backend's manifest
    entry, the gate's figures under "quality" (the caller moves them to the manifest's `precision`). `texts`: the
    calibration rows' texts in feed order (the worst is named; the retrieval check). The float32 graph is held
    in memory whole while it is quantized; nothing is serialized whole (a 0.6B model's float32 graph is past
    protobuf's 2 GB). `float_rows`: the tokenizer's special tokens (their embedding rows kept exact)."""
    from infra.pack.onnx_io import ONNX_DATA, ONNX_FILE, save_onnx_file
    from infra.pack.quality import DEFAULT_MIN_QUALITY, check

    threshold = DEFAULT_MIN_QUALITY[source.task] if precision.min_quality is None else precision.min_quality
    # The search aims at the gate's threshold for embeddings (its figure is the cosine it measures), and at
    # SEARCH_COSINE at least (a pack made with --min-quality 0 is still made as good as the default's)
    target = max(threshold, SEARCH_COSINE) if source.task == "embedding" else SEARCH_COSINE
    options = Int8Options(method=precision.quantize, float_rows=tuple(sorted(set(float_rows))), target=target)
    what = f"--quantize {precision.quantize}"

    def gate(figures: dict[str, Any], early: str = "") -> dict[str, Any]:
        return check(source.task, figures, precision.min_quality, what, early)

    quantized, quality = quantize_checked(source, exported.where / ONNX_FILE, calibration, options, staged, gate, texts)
    save_onnx_file(quantized, tmp)
    record = options.to_json()
    found = quality.pop("search", None)
    if found is not None:
        record = found.pop("chosen")  # the float paths the search chose (float_paths)
        record["kept_float"] += found["kept_float"]
        record["search"] = found
    return {
        "model": ONNX_FILE,
        "files": [ONNX_FILE, ONNX_DATA],
        "fused": exported.fused,
        "quantization": record,
        "quality": quality,
    }


def quantize_checked(
    source: Any,
    graph: Path,
    calibration: list[dict[str, Any]],
    options: Int8Options,
    staging: Path,
    gate: Callable[..., dict[str, Any]] | None = None,
    texts: list[str] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """The int8 graph of the float32 `graph` (a model.onnx with its data beside it), written to `staging`/int8 a
    tensor at a time, and its agreement with the float32 graph on the `calibration` batches
    (infra.pack.quality.measure), passed through `gate` when given. Fail fast: the float32 graph first runs a
    sample of the batches (quality.sample: SmoothQuant's activation maxima come from it), and the int8 graph is
    gated on that sample before the rest is run. Both run from their files, the int8 one opened after the
    quantized proto is gone: the peak is the quantization's (the float32 graph loaded) or the two sessions'."""
    import onnx

    from infra.pack.onnx_io import ONNX_FILE, save_onnx_file
    from infra.pack.quality import measure, sample

    def figures(rows: list[int], want: list[Any], got: list[Any]) -> dict[str, Any]:
        labels = None if texts is None else [t for i in rows for t in _batch_texts(texts, calibration, i)]
        if source.task == "hybrid":  # three outputs in one: the smallest of their figures
            from infra.pack.hybrid_quality import figures as hybrid_figures

            return hybrid_figures(source, [calibration[i] for i in rows], want, got, labels)
        if source.task == "multivector":  # token vectors: ranked by MaxSim (their batches differ in length)
            from infra.pack.late_quality import agreement, token_rows

            masks = [calibration[i]["attention_mask"] for i in rows]
            return agreement(token_rows(want, masks), token_rows(got, masks))
        return measure(
            source.task,
            np.concatenate([np.asarray(w, np.float32) for w in want]),
            np.concatenate([np.asarray(g, np.float32) for g in got]),
            source.problem_type,
            texts=labels,
        )

    first = sample(calibration)
    rest = [i for i in range(len(calibration)) if i not in set(first)]
    groups = matmul_groups(onnx.load(str(graph), load_external_data=False), options)
    maxima, want_first = activation_maxima(
        graph, groups if options.method == "int8" else (), [calibration[i] for i in first]
    )
    keep: list[str] = []
    found = None
    reference = _runner(graph)
    want = dict(zip(first, want_first, strict=True))
    if options.method == "int8" and options.target > 0 and first:
        # on every text: a group kept for the sample's worst text can break one outside it (MiniLM: the sample's
        # worst rose to 0.9935 and `[PAD] [SEP]`, outside it, fell to 0.86)
        want |= {i: reference(calibration[i]) for i in rest}
        # hybrid: a row per token, batches of different lengths; the search measures each text's CLS row
        cls_only = source.task == "hybrid"
        found, options = search_kept(
            graph, options, maxima, list(groups), calibration, [want[i] for i in range(len(want))], cls_only
        )
        keep = found.kept
    where = staging / "int8"
    # the proto's tensors are cleared as written
    save_onnx_file(quantize_int8(graph, options, maxima, keep, options.float_rows), where)
    candidate = _runner(where / ONNX_FILE)
    got_first = [candidate(calibration[i]) for i in first]
    if gate is not None and rest:
        n = sum(_rows(calibration[i]) for i in first)
        total = sum(_rows(f) for f in calibration)
        gate(
            figures(first, want_first, got_first),
            f" on a sample of {n} of the {total} calibration texts, checked first",
        )
    want |= {i: reference(calibration[i]) for i in rest if i not in want}
    got = dict(zip(first, got_first, strict=True)) | {i: candidate(calibration[i]) for i in rest}
    rows = list(range(len(calibration)))
    measured = figures(rows, [want[i] for i in rows], [got[i] for i in rows])
    measured = gate(measured) if gate is not None else measured
    if found is not None:
        measured["search"] = found.to_json() | {"chosen": options.to_json()}
    return where / ONNX_FILE, measured


def search_kept(
    graph: Path,
    options: Int8Options,
    maxima: dict[str, Any],
    groups: list[str],
    feeds: list[Feeds],
    want: list[Any],
    first_token: bool = False,
) -> Any:
    """The MatMul groups kept float32 so that the worst of `feeds` (every calibration batch) reaches options.target
    (infra.pack.int8_search), found on the float32 graph held in memory. `first_token`: a row per token (batches
    differ in length): each text's first row is what is measured."""
    import onnx

    from infra.pack.int8_search import search

    base = onnx.load(str(graph), load_external_data=True)

    def runner(chosen: Int8Options) -> Callable[[Sequence[str], Sequence[Feeds]], Any]:
        def run(keep: Sequence[str], feeds: Sequence[Feeds]) -> Any:
            return int8_answers(quantize_int8(base, chosen, maxima, keep, chosen.float_rows), feeds, first_token)

        return run

    want = [np.asarray(w, np.float32)[:, 0] if first_token else w for w in want]
    want_rows = np.concatenate([np.asarray(w, np.float32).reshape(len(w), -1) for w in want])
    options, whole, tried = choose_paths(runner, float_paths(options, base), feeds, want_rows)
    run = runner(options)

    def measured(keep: Sequence[str], some: Sequence[Feeds]) -> Any:
        return whole if not keep and some is feeds else run(keep, some)  # the all-int8 run is done already

    found, _ = search(measured, groups, feeds, want_rows, options.target)
    found.paths = tried
    return found, options


def float_paths(options: Int8Options, model: Any) -> list[Int8Options]:
    """The int8 graphs search_kept tries, cheapest first (the first to reach options.target is packed): all int8;
    the special tokens' rows in float in the first layer's groups; outlier channels in float32; both; then the
    special rows in the first half of the layers, and in every group, each without and with outlier channels.
    MiniLM: the special rows in layer 0 lift `[PAD] [SEP]` from 0.867 to 0.994 (every layer: 0.998) at 0.58x
    float32's CPU time at batch 1, against 1.07x with them in every layer (1 thread, 516 texts)."""
    plain = replace(options, outlier_channel=0.0, exact_tokens=())
    outliers = replace(plain, outlier_channel=options.outlier_channel)
    special = options.exact_tokens or options.float_rows
    out = [plain]
    for k, groups in enumerate([*layer_prefixes(model, options), -1]):
        for base in (plain, outliers):
            if special:
                out.append(replace(base, exact_tokens=special, exact_groups=groups))
            if k == 0 and base is plain:
                out.append(outliers)
    unique: list[Int8Options] = []
    for o in out:
        if o not in unique:
            unique.append(o)
    return unique


def layer_prefixes(model: Any, options: Int8Options) -> list[int]:
    """How many of the MatMul groups (graph order) the first encoder layer holds, and the first half of the
    layers (rounded up): their nodes' names say `layer.N` / `layers.N` (torch.onnx names nodes after the module
    path). [] when the first group's name says no layer."""
    layer = re.compile(r"/layers?[./_](\d+)/")
    found = [layer.search(nodes[0].name) for nodes in matmul_groups(model, options).values()]
    ids = [m.group(1) if m else None for m in found]
    if not ids or ids[0] is None:
        return []
    order = list(dict.fromkeys(i for i in ids if i is not None))
    ends = [max(k for k, i in enumerate(ids) if i == layer_id) + 1 for layer_id in order]
    return sorted({ends[0], ends[(len(order) + 1) // 2 - 1]})


def choose_paths(
    runner: Callable[[Int8Options], Callable[[Sequence[str], Sequence[Feeds]], Any]],
    plans: list[Int8Options],
    feeds: list[Feeds],
    want: Any,
) -> tuple[Int8Options, Any, list[dict[str, Any]]]:
    """The first of `plans` (cheapest first) whose int8 graph's worst cosine over every feed reaches its target,
    else the best; its answers; what was tried. A plan is run on every feed only once it reaches the target on
    the hard rows (the worst rows of the full runs so far, each run alone): a full run of mpnet's calibration is
    minutes, a hard-row run seconds."""
    from infra.pack.int8_search import HARD, cosines, single_rows

    best: tuple[float, Int8Options, Any] | None = None
    tried: list[dict[str, Any]] = []
    hard_rows: list[int] = []
    for plan in plans:
        run = runner(plan)
        if hard_rows:
            worst = float(cosines(want[hard_rows], run((), single_rows(feeds, hard_rows))).min())
            if worst < plan.target:
                tried.append(_path_record(plan) | {"hard_rows_min_cosine": round(worst, 6)})
                continue
        got = run((), feeds)
        each = cosines(want, got)
        tried.append(_path_record(plan) | {"min_cosine": round(float(each.min()), 6)})
        if best is None or each.min() > best[0]:
            best = (float(each.min()), plan, got)
        if each.min() >= plan.target:
            break
        hard_rows += [int(i) for i in np.argsort(each)[:HARD] if int(i) not in hard_rows]
    assert best is not None
    return best[1], best[2], tried


def _path_record(options: Int8Options) -> dict[str, Any]:
    return {
        "outlier_channels": bool(options.outlier_channel),
        "exact_token_groups": 0 if not options.exact_tokens else options.exact_groups,
    }


def _rows(feed: dict[str, Any]) -> int:
    return len(next(iter(feed.values())))


def _batch_texts(texts: list[str], feeds: list[dict[str, Any]], index: int) -> list[str]:
    start = sum(_rows(f) for f in feeds[:index])
    return texts[start : start + _rows(feeds[index])]


def int8_answers(model: Any, feeds: Sequence[Feeds], first_token: bool = False) -> Any:
    """The first output of the graph `model` (a ModelProto, written to a temporary folder a tensor at a time and
    run from there) on each feed, rows concatenated (`first_token`: each row's first token's)."""
    import tempfile

    from infra.pack.onnx_io import ONNX_FILE, save_onnx_file

    with tempfile.TemporaryDirectory(prefix="warmstart-int8-search-") as tmp:
        save_onnx_file(model, Path(tmp))
        run = _runner(Path(tmp) / ONNX_FILE)
        outputs = [np.asarray(run(f), np.float32) for f in feeds]
        return np.concatenate([o[:, 0] if first_token else o for o in outputs])


def _runner(model: Path) -> Any:
    """A feeds -> first output callable over an ONNX Runtime CPU session of the graph file `model` (its data
    beside it: never a whole graph serialized in memory)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}

    def run(feed: dict[str, Any]) -> Any:
        return session.run(None, {k: v for k, v in feed.items() if k in wanted})[0]

    return run
