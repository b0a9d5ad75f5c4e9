"""`--quantize int8` / `int8-dynamic`: the exported float32 graph's weights stored as int8, in ONNX Runtime's
quantized operators.

"int8" (the default): each MatMul by a constant weight becomes ORT's MatMulNBits with 8-bit weights, symmetric,
one scale per block of 32 along K, accuracy level 4 (the activations quantized to int8 per block of 32 of each
row at run time, integer dot products). "int8-dynamic": ORT's dynamic quantization (`quantize_dynamic`,
per-channel weights, MatMul and the fused Attention), whose activations get one scale per tensor per call: faster,
but a batch's largest activation sets the step for every row. On all-MiniLM-L6-v2, 400 built-in texts: blockwise
min cosine 0.998, dynamic 0.970 (every layer contributes about equally: no single node kept in float lifts it,
measured node by node; docs/models.md).

Both: embedding tables (a Gather of a large 2-D initializer by token ids: the word table alone is half of
MiniLM's bytes) stored int8 with one float32 scale per row, looked up as Gather(int8) -> Cast -> Mul(Gather(scales)):
standard operators, each row's error bounded by its own largest value. Kept in float: the task's head after the
encoder (sentence-transformers Dense modules, a classifier, a pooler: few weights, and their error lands in the
answer unaveraged) and anything named in `exclude`.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

METHODS = ("int8", "int8-dynamic")
# Node names (torch.onnx names nodes after the module path) kept in float: the head after the encoder.
HEAD = re.compile(r"^/(dense|model/classifier|model/pooler|classifier|pooler)/")
MIN_TABLE_ROWS = 1000  # smaller tables (positions, token types) stay float: a few KB, read for every token
BLOCK = 32  # MatMulNBits' block along K: 128 measured min cosine 0.997 vs 0.999 at 32 on MiniLM, no faster
ACCURACY_LEVEL = 4  # int8 activations (per block), integer dot products: MLAS's fast path


@dataclass(frozen=True)
class Int8Options:
    """What `quantize_int8` does; the defaults are what `--quantize int8` packs."""

    method: str = "int8"
    per_channel: bool = True  # int8-dynamic
    reduce_range: bool = False  # int8-dynamic
    tables: bool = True  # embedding tables per-row int8
    exclude: tuple[str, ...] = ()  # regexes on node names, kept in float (besides the head)
    block_size: int = BLOCK  # int8

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"--quantize {self.method!r}; valid: {', '.join(METHODS)}")

    @property
    def fuse_attention(self) -> bool:
        """Whether the graph quantized may have ORT's fused Attention: MatMulNBits needs q, k and v as MatMuls
        (a fused Attention's weights would stay float: 0.36x the size instead of 0.27x on MiniLM)."""
        return self.method == "int8-dynamic"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "weights": "int8"}
        if self.method == "int8":
            out.update(
                operator="MatMulNBits", block_size=self.block_size, symmetric=True, accuracy_level=ACCURACY_LEVEL
            )
        else:
            out.update(
                operator="onnxruntime quantize_dynamic (MatMulInteger, QAttention)",
                per_channel=self.per_channel,
                reduce_range=self.reduce_range,
            )
        out["embedding_tables"] = "int8, a scale per row" if self.tables else "float32"
        out["kept_float"] = ["head after the encoder", *self.exclude]
        return out


def excluded(name: str, options: Int8Options) -> bool:
    return bool(HEAD.match(name)) or any(re.search(p, name) for p in options.exclude)


def quantize_int8(model: Any, options: Int8Options | None = None) -> Any:
    """The int8 graph of the float32 `model` (an onnx.ModelProto with its initializers loaded, or the path of
    one saved with its data beside it). `model` is left as it was."""
    import onnx

    options = options or Int8Options()
    if options.method == "int8":
        if isinstance(model, str | Path):
            out = onnx.load(str(model), load_external_data=True)
        else:
            out = onnx.ModelProto()
            out.CopyFrom(model)
        quantize_matmuls_blockwise(out, options)
    else:
        out = _dynamic(model, options)
    if options.tables:
        quantize_tables(out)
    return out


def _dynamic(model: Any, options: Int8Options) -> Any:
    import logging

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    op_types = ("MatMul", "Attention")
    with tempfile.TemporaryDirectory(prefix="warmstart-int8-") as tmp:
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "int8.onnx"
        if isinstance(model, str | Path):
            src = Path(model)
            graph = onnx.load(str(src), load_external_data=False)
        else:
            # save_model with external data rewrites the proto it is given: a copy is saved.
            graph = onnx.ModelProto()
            graph.CopyFrom(model)
            onnx.save_model(graph, str(src), save_as_external_data=True, location="float.onnx.data")
        exclude = [n.name for n in graph.graph.node if n.op_type in op_types and excluded(n.name, options)]
        logging.disable(logging.WARNING)  # the quantizer logs every node it leaves alone
        try:
            quantize_dynamic(
                src,
                dst,
                op_types_to_quantize=list(op_types),
                per_channel=options.per_channel,
                reduce_range=options.reduce_range,
                weight_type=QuantType.QInt8,
                nodes_to_exclude=exclude,
                use_external_data_format=True,
                # Fused contrib nodes (com.microsoft) defeat ONNX shape inference: their outputs are float.
                extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
            )
        finally:
            logging.disable(logging.NOTSET)
        return onnx.load(str(dst), load_external_data=True)


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


def quantize_tables(model: Any) -> list[str]:
    """Rewrite each Gather of a large 2-D float32 initializer used by nothing else (an embedding table) into a
    per-row int8 lookup, in place; the tables rewritten."""
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
        name, out, ids = table.name, node.output[0], node.input[1]
        graph.initializer.remove(table)
        graph.initializer.extend(
            [numpy_helper.from_array(q, f"{name}_int8"), numpy_helper.from_array(scale.reshape(-1, 1), f"{name}_scale")]
        )
        index = list(graph.node).index(node)
        graph.node.remove(node)
        lookup = [
            helper.make_node("Gather", [f"{name}_int8", ids], [f"{out}_int8"], name=f"{node.name}_int8", axis=0),
            helper.make_node("Cast", [f"{out}_int8"], [f"{out}_wide"], name=f"{node.name}_cast", to=TensorProto.FLOAT),
            helper.make_node("Gather", [f"{name}_scale", ids], [f"{out}_scale"], name=f"{node.name}_scale", axis=0),
            helper.make_node("Mul", [f"{out}_wide", f"{out}_scale"], [out], name=f"{node.name}_dequantize"),
        ]
        for k, n in enumerate(lookup):
            graph.node.insert(index + k, n)
        done.append(name)
    return done


def _drop_unused(graph: Any) -> None:
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for tensor in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(tensor)


def pack_int8(
    source: Any, exported: Any, staged: Path, tmp: Path, precision: Any, calibration: list[dict[str, Any]]
) -> dict[str, Any]:
    """`pack --from --quantize`: quantize the exported, checked float32 graph (`exported`, hf_export.Exported: its
    fusions chosen by `Int8Options.fuse_attention`), gate it (QualityError below the threshold, before anything
    is published) and write it into `tmp`; the onnx backend's manifest entry, the gate's figures under
    "quality" (the caller moves them to the manifest's `precision`). The float32 graph is held in memory whole
    while it is quantized; nothing is serialized whole (a 0.6B model's float32 graph is past protobuf's 2 GB)."""
    from infra.pack.onnx_io import ONNX_DATA, ONNX_FILE, save_onnx_file
    from infra.pack.quality import check

    options = Int8Options(method=precision.quantize)
    quantized, figures = quantize_checked(source, exported.where / ONNX_FILE, calibration, options, staged)
    quality = check(source.task, figures, precision.min_quality, f"--quantize {precision.quantize}")
    save_onnx_file(quantized, tmp)
    return {
        "model": ONNX_FILE,
        "files": [ONNX_FILE, ONNX_DATA],
        "fused": exported.fused,
        "quantization": options.to_json(),
        "quality": quality,
    }


def quantize_checked(
    source: Any, graph: Path, calibration: list[dict[str, Any]], options: Int8Options, staging: Path
) -> tuple[Path, dict[str, Any]]:
    """The int8 graph of the float32 `graph` (a model.onnx with its data beside it), written to `staging`/int8 a
    tensor at a time, and its agreement with the float32 graph on the `calibration` batches
    (infra.pack.quality.measure; the caller gates on it). Both run from their files, the int8 one opened after
    the quantized proto is gone: the peak is the quantization's (the float32 graph loaded) or the two sessions'."""
    from infra.pack.onnx_io import ONNX_FILE, save_onnx_file
    from infra.pack.quality import compare

    where = staging / "int8"
    save_onnx_file(quantize_int8(graph, options), where)  # the proto's tensors are cleared as they are written
    reference = _runner(graph)
    candidate = _runner(where / ONNX_FILE)
    figures = compare(source.task, calibration, reference, candidate, source.problem_type)
    return where / ONNX_FILE, figures


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
