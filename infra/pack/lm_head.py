"""The LM head's bits in an int4 pack: 4 (the body's) or 8, through onnxruntime-genai's own builder option
(`matmul_mixed_precision=last_matmul:int8`: the head's MatMulNBits at bits=8, the int4 body unchanged, the same
MLAS symmetric round-to-nearest at 8 bits).

Why 8: the LM head is where an int4 pack loses most of its quality. On real SmolLM2-135M, fake quantization in
float32 (an int4 body in every case) gave perplexity 62.95 with a float32 head, 63.01 with an 8-bit head, 68.02
with an int4 head; llama.cpp's Q4_0 keeps the tied output matrix at Q6_K (docs/benchmarks.md).

A tied embedding (the token embedding and the head one matrix) reads the head's blocks through
GatherBlockQuantized (bits=8 is accepted by ONNX Runtime 1.31). onnxruntime-genai 0.18's builder names that node's
inputs after its `rtn` quantizer (`lm_head.MatMul.weight_Q8G32`, `lm_head.MatMul.weight_scale`) while its default
quantizer (the one our int4 body comes from: Q4_0's scale) writes `lm_head.MatMul.weight_Q8` and
`..._scales`: the graph it saves does not load ("not a graph input, initializer, or output"). `mend_tied` points
the gather at the head's own initializers, only where the dangling names are exactly the builder's for the
head's bits and block size, and proves the result before the pack goes on: the head's blocks are the 8-bit
round-to-nearest of the source's tied tensor (infra.pack.lm_int4.is_rtn_of), and ONNX Runtime's gather of sampled
rows returns exactly those blocks dequantized as MatMulNBits reads them ((q - 128) * scale). Else HeadError.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.pack.hf_checks import SourceError
from infra.pack.precision import PrecisionError

HEAD_BITS = (4, 8)
# The builder option that puts the head at 8 bits on an int4 body (onnxruntime-genai 0.18's
# `matmul_mixed_precision` selector and quant type).
BUILDER_EIGHT = {"matmul_mixed_precision": "last_matmul:int8"}
HEAD_SOURCES = ("lm_head.weight", "model.embed_tokens.weight")
CHUNK_VALUES = 1 << 22  # weights proved at once: ~32 MB per float64 work array
SAMPLED_ROWS = 257  # rows of the tied table gathered by ONNX Runtime in the proof (spread over the vocabulary)


class HeadError(SourceError):
    """A head or tied embedding of the builder's graph that cannot be proved to read the source's blocks."""


def check(target: str, options: dict[str, str | int | bool]) -> int:
    """The `head_bits` option (ours), refused before anything is built where it does not apply: int4 takes 4 or
    8, int8 only 8 (its head is the body's), float32 none."""
    raw = options.get("head_bits")
    if target == "fp32":
        if raw is not None:
            raise PrecisionError(f"head_bits={raw!r} for float32; the head's bits apply to --quantize int4 / int8")
        return 32
    valid = HEAD_BITS if target == "int4" else (8,)
    bits = raw if raw is not None else (8 if target == "int8" else 4)
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in valid:
        raise PrecisionError(f"head_bits={raw!r} for {target}; valid: {', '.join(map(str, valid))}")
    return bits


def builder_extra(target: str, bits: int) -> dict[str, str]:
    """What the builder is passed for the head's bits: the mixed-precision option where they differ from the
    body's (int4 body, 8-bit head), nothing otherwise."""
    return dict(BUILDER_EIGHT) if target == "int4" and bits == 8 else {}


def head_node(model: Any) -> Any:
    """The graph's LM head MatMulNBits node (the builder names it /lm_head/MatMul_Q<bits>), or None."""
    for node in model.graph.node:
        if node.op_type == "MatMulNBits" and node.name.startswith("/lm_head/MatMul"):
            return node
    return None


def head_bits(model_dir: Path) -> int | None:
    """The bits of the head's MatMulNBits in `model_dir`'s graph (None: a float head)."""
    import onnx  # pack time only

    from infra.pack.lm_int4 import node_attrs

    node = head_node(onnx.load(str(model_dir / "model.onnx"), load_external_data=False))
    return None if node is None else int(node_attrs(node).get("bits", 4))


def mend_tied(model_dir: Path, read_tensor: Callable[[str], Any]) -> dict[str, Any] | None:
    """Point a tied embedding's GatherBlockQuantized at the head's initializers where the builder left its inputs
    dangling (module docstring), then prove it. The record for the manifest's scheme, or None where the graph
    needed nothing (an untied model, or a head at the body's bits)."""
    import onnx

    from infra.pack.lm_int4 import node_attrs

    path = model_dir / "model.onnx"
    model = onnx.load(str(path), load_external_data=False)
    head = head_node(model)
    gather = next((n for n in model.graph.node if n.op_type == "GatherBlockQuantized"), None)
    if head is None or gather is None:
        return None
    defined = {t.name for t in model.graph.initializer} | {i.name for i in model.graph.input}
    defined |= {o for n in model.graph.node for o in n.output}
    reshape = next((n for n in model.graph.node if gather.input[0] in n.output and n.op_type == "Reshape"), None)
    data = reshape.input[0] if reshape is not None else gather.input[0]
    if data in defined and gather.input[2] in defined:
        return None
    h, g = node_attrs(head), node_attrs(gather)
    bits, block = int(h.get("bits", 4)), int(h["block_size"])
    want = (f"lm_head.MatMul.weight_Q{bits}G{block}", "lm_head.MatMul.weight_scale")
    if reshape is None or (data, gather.input[2]) != want or len(gather.input) > 3:
        raise HeadError(
            f"{gather.name}: reads {data!r} and {gather.input[2]!r}, not in the graph, and not the builder's names "
            f"for the head's {bits}-bit blocks ({want[0]!r}, {want[1]!r}, no zero points); refused rather than "
            "guessed"
        )
    if (int(g.get("bits", 4)), int(g["block_size"])) != (bits, block):
        raise HeadError(
            f"{gather.name}: bits={g.get('bits', 4)} block_size={g['block_size']} where the head has bits={bits} "
            f"block_size={block}"
        )
    reshape.input[0], gather.input[2] = head.input[1], head.input[2]
    record = prove(model, model_dir, head, reshape, gather, read_tensor)
    onnx.save(model, str(path))  # the weights stay where they are: only the graph's names changed
    return record


def prove(
    model: Any, model_dir: Path, head: Any, reshape: Any, gather: Any, read_tensor: Callable[[str], Any]
) -> dict[str, Any]:
    """The mended gather proved (module docstring); HeadError otherwise. Returns {"tied": the source tensor,
    "rows_checked": n}."""
    import numpy as np

    from infra.pack import lm_int4

    blocks = lm_int4.node_blocks(head, {t.name: t for t in model.graph.initializer}, model_dir)
    codes, n, bits, block = blocks.codes, blocks.scales.shape[0], blocks.bits, blocks.block
    tied = None
    for name in HEAD_SOURCES:
        weight = read_tensor(name)
        if weight is not None and _is_rtn_of(blocks, weight):
            tied = name
            break
    if tied is None:
        raise HeadError(
            f"{head.name}: its {bits}-bit blocks are not the round-to-nearest of the source's "
            f"{' or '.join(HEAD_SOURCES)}; the tied embedding is refused"
        )
    shape = _constant(model, model_dir, reshape.input[1])
    if shape is None or [int(v) for v in shape] != [n, codes.size // n]:
        want_shape = [n, codes.size // n]
        raise HeadError(f"{reshape.name}: reshapes the head's {codes.shape} blocks to {shape}, not {want_shape}")
    rows = np.unique(np.linspace(0, n - 1, SAMPLED_ROWS).astype(np.int64))
    # The sampled rows alone in the proof's table (a 0.6B model's head is 155 MB at 8 bits), gathered in reverse.
    ids = np.arange(len(rows) - 1, -1, -1, dtype=np.int64)
    got = _gather(codes.reshape(n, -1)[rows], blocks.scales[rows], ids, bits, block)
    want = lm_int4.dequantize(_rows(blocks, rows))[ids]
    if got.shape[1] < want.shape[1] or not np.array_equal(got[:, : want.shape[1]], want):
        raise HeadError(f"{gather.name}: ONNX Runtime's rows are not the head's blocks dequantized")
    return {"tied": tied, "rows_checked": len(rows)}


def _constant(model: Any, model_dir: Path, name: str) -> Any:
    """The value of `name`: an initializer or a Constant node's (the builder writes shapes as Constant nodes)."""
    import onnx

    from infra.pack import lm_int4

    for t in model.graph.initializer:
        if t.name == name:
            return lm_int4._read(t, model_dir)
    for node in model.graph.node:
        if node.op_type == "Constant" and list(node.output) == [name]:
            value = lm_int4.node_attrs(node).get("value")
            return None if value is None else onnx.numpy_helper.to_array(value)
    return None


def _rows(blocks: Any, rows: Any) -> Any:
    from infra.pack import lm_int4

    return lm_int4.Blocks(blocks.codes[rows], blocks.scales[rows], blocks.block, blocks.k, blocks.bits)


def _is_rtn_of(blocks: Any, weight: Any) -> bool:
    """lm_int4.is_rtn_of over row chunks (its float64 work arrays of a 0.6B model's whole head: ~1.2 GB each)."""
    import numpy as np

    from infra.pack import lm_int4

    n = blocks.scales.shape[0]
    if tuple(weight.shape) != (n, blocks.k):
        return False
    step = max(1, CHUNK_VALUES // max(blocks.k, 1))
    for start in range(0, n, step):
        rows = slice(start, min(n, start + step))
        if not lm_int4.is_rtn_of(_rows(blocks, rows), np.asarray(weight[rows], dtype=np.float32)):
            return False
    return True


def _gather(data: Any, scales: Any, ids: Any, bits: int, block: int) -> Any:
    """ONNX Runtime's GatherBlockQuantized of `ids` over the head's blocks, alone in a graph of its own."""
    import numpy as np
    import onnxruntime as ort  # pack time only
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [
            helper.make_node(
                "GatherBlockQuantized",
                ["data", "ids", "scales"],
                ["rows"],
                domain="com.microsoft",
                bits=bits,
                block_size=block,
                gather_axis=0,
                quantize_axis=1,
            )
        ],
        "head-rows",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [None])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ascontiguousarray(data), "data"), numpy_helper.from_array(scales, "scales")],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)  # ORT 1.31 reads IR <= 13
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"ids": ids})[0])
