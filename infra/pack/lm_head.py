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

The 8-bit head's block size (`head_block`, ours): the builder writes every MatMulNBits at the body's block size
(32). `reblock` quantizes the head again from the source's tensor in blocks of `head_block` (MLAS' symmetric
round-to-nearest at 8 bits, what the builder writes), after proving the builder's blocks are that tensor's; a tied
gather reads the same new blocks, proved as above. Why larger blocks: MLAS' prepacked layout for int8 compute
(accuracy_level 4) keeps a float scale and a float block sum per block resident beside the codes, 37 MB at blocks of
32 on a 0.6B Qwen3's head (151,936 x 1,024); blocks of 128 are a quarter of that (docs/benchmarks.md, "The 8-bit
head in blocks of 128"). The block must divide the hidden size: a padded last block would widen the tied gather's
rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.pack.hf_checks import SourceError
from infra.pack.precision import PrecisionError

HEAD_BITS = (4, 8)
# The 8-bit head's block sizes (MatMulNBits and GatherBlockQuantized take powers of 2 from 16 to 256) and the
# default: the largest of them up to HEAD_BLOCK that divides the model's hidden size (SmolLM2's 576: 64).
HEAD_BLOCKS = (16, 32, 64, 128, 256)
HEAD_BLOCK = 128
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


def check_block(target: str, options: dict[str, str | int | bool], hidden: int) -> int:
    """The `head_block` option (ours), refused before anything is built where it does not apply: an int4 pack's
    8-bit head takes HEAD_BLOCKS' sizes that divide `hidden` (default: the largest up to HEAD_BLOCK); a head at the
    body's bits has the body's block (int8: 128, int4 with `head_bits: 4`: `block_size`), float32 none."""
    raw = options.get("head_block")
    bits = check(target, options)
    body = int(options.get("block_size", 32))
    if target == "fp32":
        if raw is not None:
            raise PrecisionError(f"head_block={raw!r} for float32; the head's block applies to --quantize int4 / int8")
        return 0
    if target != "int4" or bits != 8:
        if raw is not None and raw != body:
            raise PrecisionError(
                f"head_block={raw!r} for {target} with head_bits={bits}; its head has the body's block_size: "
                f"valid: {body} (the head's own block applies to an int4 pack's 8-bit head)"
            )
        return body
    valid = [b for b in HEAD_BLOCKS if hidden % b == 0]
    if raw is None:
        return max((b for b in valid if b <= HEAD_BLOCK), default=body)
    if isinstance(raw, bool) or not isinstance(raw, int) or raw not in valid:
        raise PrecisionError(
            f"head_block={raw!r} for an 8-bit head over hidden size {hidden}; valid: {', '.join(map(str, valid))} "
            f"(of {', '.join(map(str, HEAD_BLOCKS))}: the block must divide the hidden size)"
        )
    return raw


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


def reblock(model_dir: Path, read_tensor: Callable[[str], Any], block: int) -> dict[str, Any] | None:
    """The 8-bit head's blocks (and a tied gather's, the same initializers) quantized again in blocks of `block`
    from the source's tensor (module docstring), after the builder's are proved its round-to-nearest; then proved
    as mend_tied's (the gather's sampled rows through ONNX Runtime). Run after mend_tied. The new bytes are
    appended to the data file and the graph saved last, so a refusal leaves the graph as it was (the pack's
    align drops the old bytes). The record for the manifest's scheme, or None where the head already has
    `block` (or there is no quantized head)."""
    import onnx

    from infra.pack import lm_int4

    path = model_dir / "model.onnx"
    model = onnx.load(str(path), load_external_data=False)
    head = head_node(model)
    if head is None:
        return None
    attrs = lm_int4.node_attrs(head)
    bits, was, k = int(attrs.get("bits", 4)), int(attrs["block_size"]), int(attrs["K"])
    if block == was:
        return None
    if bits != 8 or (len(head.input) > 3 and head.input[3]):
        raise HeadError(
            f"{head.name}: bits={bits}{' with zero points' if len(head.input) > 3 else ''}; only a "
            "symmetric 8-bit head is re-blocked"
        )
    if block not in HEAD_BLOCKS or k % block:
        raise HeadError(f"{head.name}: block {block} for K={k}; valid: sizes of {HEAD_BLOCKS} that divide K")
    inits = {t.name: t for t in model.graph.initializer}
    built = lm_int4.node_blocks(head, inits, model_dir)
    name, weight = _head_source(head, built, read_tensor)
    gather = next(
        (g for g in model.graph.node if g.op_type == "GatherBlockQuantized" and g.input[2] == head.input[2]), None
    )
    reshape = None
    if gather is not None:
        reshape = next((r for r in model.graph.node if gather.input[0] in r.output and r.op_type == "Reshape"), None)
        if reshape is None or reshape.input[0] != head.input[1]:
            raise HeadError(f"{gather.name}: reads the head's scales but not its blocks through a Reshape; refused")
    codes, scales = rtn8(weight, block)
    _append(inits[head.input[1]], model_dir, codes.reshape(_dims(inits[head.input[1]], codes.shape)))
    _append(inits[head.input[2]], model_dir, scales.reshape(_dims(inits[head.input[2]], scales.shape)))
    for node in (head, gather):
        for attr in node.attribute if node is not None else ():
            if attr.name == "block_size":
                attr.i = block
    record: dict[str, Any] = {"from": was, "block": block, "source": name}
    if gather is not None:
        record["rows_checked"] = prove(model, model_dir, head, reshape, gather, read_tensor)["rows_checked"]
    elif not _is_rtn_of(lm_int4.node_blocks(head, inits, model_dir), weight):
        raise HeadError(f"{head.name}: its {block}-blocks are not the round-to-nearest of {name}")
    onnx.save(model, str(path))  # the graph last: the new offsets, dims and block sizes
    return record


def rtn8(weight: Any, block: int) -> tuple[Any, Any]:
    """MLAS' symmetric 8-bit round-to-nearest of `weight` [N, K] in blocks of `block` along K (K a multiple):
    codes [N, K / block, block] (uint8, q + 128) and scales [N, K / block] (float32; the codes rounded with the
    float32 scale MatMulNBits multiplies by). Row chunks: float64 work arrays of a 0.6B model's head are ~1.2 GB."""
    import numpy as np

    from infra.pack import lm_int4

    n, k = weight.shape
    codes = np.empty((n, k // block, block), dtype=np.uint8)
    scales = np.empty((n, k // block), dtype=np.float32)
    step = max(1, CHUNK_VALUES // max(k, 1))
    for start in range(0, n, step):
        rows = slice(start, min(n, start + step))
        x = lm_int4.blocks_of(np.asarray(weight[rows], dtype=np.float32), block)
        _, d = lm_int4.rtn_blocks(x, 128)
        d32 = d.astype(np.float32)
        q = np.clip(np.round(x * lm_int4._inverse(d32.astype(np.float64))[:, None]), -128, 127)
        codes[rows] = (q + 128).astype(np.uint8).reshape(-1, k // block, block)
        scales[rows] = d32.reshape(-1, k // block)
    return codes, scales


def _head_source(head: Any, blocks: Any, read_tensor: Callable[[str], Any]) -> tuple[str, Any]:
    for name in HEAD_SOURCES:
        weight = read_tensor(name)
        if weight is not None and _is_rtn_of(blocks, weight):
            return name, weight
    raise HeadError(
        f"{head.name}: its {blocks.bits}-bit blocks are not the round-to-nearest of the source's "
        f"{' or '.join(HEAD_SOURCES)}; not re-blocked"
    )


def _dims(tensor: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    """`shape` at the rank the builder gave `tensor` (its leading N kept, the rest flattened or as given)."""
    if len(tensor.dims) == len(shape):
        return shape
    if len(tensor.dims) == 1:
        return (int(math.prod(shape)),)
    return (shape[0], int(math.prod(shape[1:])))


def _append(tensor: Any, model_dir: Path, array: Any) -> None:
    """`tensor` set to `array` (new dims): appended at the end of its data file (a page-aligned offset), or in the
    proto for an inline tensor. The old bytes stay until the pack's align copies only what the graph names."""
    import numpy as np
    import onnx

    array = np.ascontiguousarray(array)
    info = {e.key: e.value for e in tensor.external_data} if tensor.data_location == 1 else None
    if info is None:
        tensor.CopyFrom(onnx.numpy_helper.from_array(array, tensor.name))
        return
    with open(model_dir / info["location"], "r+b") as f:
        at = -(-f.seek(0, 2) // 4096) * 4096
        f.seek(at)
        f.write(array.tobytes())
    del tensor.dims[:]
    tensor.dims.extend(array.shape)
    for entry in tensor.external_data:
        if entry.key == "offset":
            entry.value = str(at)
        elif entry.key == "length":
            entry.value = str(array.nbytes)


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
