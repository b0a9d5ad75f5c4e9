"""int4 blocks with searched scales: after onnxruntime-genai's builder writes an int4 graph (MatMulNBits, 4 bits,
symmetric, blocks along K), each block is quantized again from the source's float weights with the scale that
minimizes the block's squared error, in place of the builder's round-to-nearest one.

The builder's quantizer (onnxruntime's MLAS `MlasQuantizeBlockwise`, symmetric) already takes llama.cpp Q4_0's
scale, d = (the block's value of largest magnitude) / -8, and rounds each weight to the nearest of (q - 8) * d.
That scale is right for the extreme value only; here each block tries the scales (max / -(8 + s)) and
(max / (7 + s)) for s in -1.0..1.0 by 0.1 (llama.cpp's make_qx_quants grid, both signs), takes for each the
least-squares scale of its codes and rounds once more with it, and keeps the candidate with the least squared
error (the builder's scale is one of the candidates, so no block gets worse). MatMulNBits without zero points
computes (q - 8) * scale whatever the scale, so the graph, its kernels and its speed are unchanged; only the
bytes of the weights and scales differ. A tied embedding (GatherBlockQuantized reading the LM head's blocks) gets
the same blocks, as it did from the builder.

The source tensors of each MatMulNBits node are proved, not guessed: a node's candidates are the source's tensors
its name points to (fused q/k/v rows in the checkpoint's order, the LM head or the tied embedding), and each
candidate's round-to-nearest quantization is checked against every block the builder wrote (the same scale, every
weight within half a step): a node whose blocks no candidate reproduces refuses the pack (RequantizeError).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.pack.hf_checks import SourceError

# The scale choices a pack may take (`--schemes scales=...` in bench/generate/peers.py; lm_pack.BUILDER_OPTIONS).
SCALES = ("rtn", "mse")
BITS, HALF = 4, 8
# Candidate scales per block: max / -(8 + s) and max / (7 + s), s in STEPS (llama.cpp make_qx_quants' grid).
STEPS = tuple(round(0.1 * i, 1) for i in range(-10, 11))
CHUNK_BLOCKS = 1 << 15  # blocks searched at once: ~40 MB of float64 work arrays
# The builder's node name -> the source tensors (suffixes under the layer's prefix) whose rows, concatenated, it
# quantized; "name#i/n" is the i-th of n equal row slices of a fused tensor (Phi-3's gate_up_proj, which the
# builder splits). Alternatives are tried in order; each is proved against the builder's blocks before use.
LAYER_NODE = re.compile(r"^/model/layers\.(\d+)/(attn|mlp)/(\w+)/MatMul_Q4$")
PROJECTIONS: dict[str, list[list[str]]] = {
    "attn/qkv_proj": [["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], ["self_attn.qkv_proj"]],
    "attn/q_proj": [["self_attn.q_proj"]],
    "attn/k_proj": [["self_attn.k_proj"]],
    "attn/v_proj": [["self_attn.v_proj"]],
    "attn/o_proj": [["self_attn.o_proj"]],
    "mlp/gate_proj": [["mlp.gate_proj"], ["mlp.gate_up_proj#0/2"]],
    "mlp/up_proj": [["mlp.up_proj"], ["mlp.gate_up_proj#1/2"]],
    "mlp/gate_up_proj": [["mlp.gate_up_proj"], ["mlp.gate_proj", "mlp.up_proj"]],
    "mlp/down_proj": [["mlp.down_proj"]],
}
HEAD_NODE = "/lm_head/MatMul_Q4"
HEAD_SOURCES = [["lm_head"], ["model.embed_tokens"]]


class RequantizeError(SourceError):
    """A MatMulNBits node of the builder's graph whose source tensors cannot be proved."""


@dataclass(frozen=True)
class Blocks:
    """One MatMulNBits weight: codes [N, blocks, block/2] (two 4-bit codes a byte, low nibble first) and scales
    [N, blocks] (float32), as the node's initializers hold them."""

    codes: Any
    scales: Any
    block: int
    k: int  # the weight's real K (the last block is padded with zeros)
    bits: int = BITS  # 8: one code a byte (an 8-bit LM head, infra.pack.lm_head)

    @property
    def half(self) -> int:
        """The code of zero: MatMulNBits without zero points computes (q - half) * scale."""
        return 1 << (self.bits - 1)


def rtn_blocks(x: Any, half: int = HALF) -> tuple[Any, Any]:
    """MLAS' symmetric round-to-nearest of blocks x [n, block] (float64): codes in [-half, half - 1] and scales,
    the scale the value of largest magnitude over -half (llama.cpp Q4_0's at 4 bits: half 8; 8 bits: 128)."""
    import numpy as np

    lo, hi = x.min(1), x.max(1)
    m = np.where(np.abs(hi) > np.abs(lo), hi, lo)  # MLAS' pick: the minimum where both ends have one magnitude
    d = m / -half
    q = np.clip(np.round(x * _inverse(d)[:, None]), -half, half - 1)
    return q, d


def _inverse(d: Any) -> Any:
    import numpy as np

    return np.where(d != 0, 1.0 / np.where(d == 0, 1.0, d), 0.0)


def _fit(x: Any, q: Any) -> Any:
    """The least-squares scale of codes q for blocks x."""
    import numpy as np

    den = (q * q).sum(1)
    return np.where(den > 0, (x * q).sum(1) / np.where(den == 0, 1.0, den), 0.0)


def mse_blocks(x: Any) -> tuple[Any, Any]:
    """Blocks x [n, block] (float64): the codes and scale of least squared error among the candidates (module
    docstring). The first candidate is round-to-nearest's own, so a block is never worse than rtn_blocks'."""
    import numpy as np

    best_q, best_d = rtn_blocks(x)
    best_err = ((x - best_q * best_d[:, None]) ** 2).sum(1)
    m = x[np.arange(len(x)), np.abs(x).argmax(1)]
    m = np.where(m == 0, 1.0, m)
    for s in STEPS:
        for iscale in (-(HALF + s) / m, (HALF - 1 + s) / m):
            q = np.clip(np.round(x * iscale[:, None]), -HALF, HALF - 1)
            d = _fit(x, q)
            q2 = np.clip(np.round(x * _inverse(d)[:, None]), -HALF, HALF - 1)
            for qq, dd in ((q, d), (q2, _fit(x, q2))):
                err = ((x - qq * dd[:, None]) ** 2).sum(1)
                better = err < best_err
                best_err = np.where(better, err, best_err)
                best_q[better] = qq[better]
                best_d = np.where(better, dd, best_d)
    return best_q, best_d


def blocks_of(weight: Any, block: int) -> Any:
    """A [N, K] weight as float64 blocks [N * blocks, block] along K, the last padded with zeros (as MLAS does)."""
    import numpy as np

    n, k = weight.shape
    pad = (-k) % block
    w = np.asarray(weight, dtype=np.float64)
    if pad:
        w = np.pad(w, ((0, 0), (0, pad)))
    return w.reshape(n * ((k + pad) // block), block)


def quantize(weight: Any, block: int, method: str = "mse") -> Blocks:
    """`weight` [N, K] as MatMulNBits' symmetric int4 blocks, scales chosen by `method` (of SCALES)."""
    import numpy as np

    if method not in SCALES:
        raise ValueError(f"scales {method!r}; valid: {', '.join(SCALES)}")
    fn = mse_blocks if method == "mse" else rtn_blocks
    n, k = weight.shape
    x = blocks_of(weight, block)
    qs, ds = [], []
    for i in range(0, len(x), CHUNK_BLOCKS):
        q, d = fn(x[i : i + CHUNK_BLOCKS])
        qs.append(q)
        ds.append(d)
    codes = (np.concatenate(qs) + HALF).astype(np.uint8).reshape(n, -1, block)
    codes.reshape(n, -1)[:, k:] = 0  # the padding past K as MLAS leaves it (never read: K is the node's)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return Blocks(packed, np.concatenate(ds).astype(np.float32).reshape(n, -1), block, k)


def dequantize(blocks: Blocks) -> Any:
    """The [N, K] float32 weight MatMulNBits computes with: (q - 8) * scale."""
    import numpy as np

    w = (codes_of(blocks).astype(np.float32) - blocks.half) * blocks.scales[..., None]
    return w.reshape(w.shape[0], -1)[:, : blocks.k]


def is_rtn_of(blocks: Blocks, weight: Any) -> bool:
    """Whether `blocks` are MLAS' round-to-nearest of `weight`: every block's scale the source block's (to float32
    rounding) and every code the source weight's rounded (clamped to [-half, half - 1]), a code one off allowed only
    where the weight lies on a rounding tie (float32 arithmetic against ours)."""
    import numpy as np

    if tuple(weight.shape) != (blocks.scales.shape[0], blocks.k):
        return False
    x = blocks_of(weight, blocks.block)
    _, d = rtn_blocks(x, blocks.half)
    if not np.allclose(blocks.scales.reshape(-1), d.astype(np.float32), rtol=1e-6, atol=0.0):
        return False
    scaled = x * _inverse(blocks.scales.reshape(-1).astype(np.float64))[:, None]
    n = blocks.scales.shape[0]
    scaled = scaled.reshape(n, -1)[:, : blocks.k]  # the padding past K is not the weight's
    want = np.clip(np.round(scaled), -blocks.half, blocks.half - 1)
    got = codes_of(blocks).reshape(n, -1)[:, : blocks.k].astype(np.float64) - blocks.half
    off = got != want
    tie = np.abs(np.abs(scaled - np.floor(scaled)) - 0.5) < 1e-3
    return bool(np.all(~off | (tie & (np.abs(got - want) == 1))))


def codes_of(blocks: Blocks) -> Any:
    """The unsigned codes [N, blocks, block] of `blocks` (4 bits: two a byte, low nibble first)."""
    import numpy as np

    if blocks.bits == 8:
        return blocks.codes
    return np.stack([blocks.codes & 15, blocks.codes >> 4], axis=-1).reshape(*blocks.codes.shape[:2], blocks.block)


def candidates(node: str, layer_prefix: str = "model.layers") -> list[list[str]]:
    """The source tensor names (`...weight`) a builder node may have quantized, each a list concatenated by rows."""
    if node == HEAD_NODE:
        return [[f"{name}.weight" for name in group] for group in HEAD_SOURCES]
    found = LAYER_NODE.match(node)
    if found is None:
        return []
    layer, kind, proj = found.groups()
    groups = PROJECTIONS.get(f"{kind}/{proj}", [])
    return [[_weight_name(f"{layer_prefix}.{layer}.{name}") for name in group] for group in groups]


def _weight_name(name: str) -> str:
    base, sep, part = name.partition("#")
    return f"{base}.weight{sep}{part}"


def _rows(read_tensor: Callable[[str], Any], name: str) -> Any:
    """A source tensor, or its "#i/n" row slice; None where the source has no such tensor (or rows to split)."""
    base, _, part = name.partition("#")
    tensor = read_tensor(base)
    if tensor is None or not part:
        return tensor
    i, n = (int(v) for v in part.split("/"))
    if tensor.shape[0] % n:
        return None
    size = tensor.shape[0] // n
    return tensor[i * size : (i + 1) * size]


def requantize(model_dir: Path, read_tensor: Callable[[str], Any], method: str = "mse") -> dict[str, Any]:
    """Rewrite every int4 MatMulNBits weight of `model_dir`'s model.onnx (+ model.onnx.data) with blocks from
    the source (`read_tensor(name)` -> float32 numpy array, or None where the source has no such tensor), scales by
    `method`. Returns the manifest's record: the method, the nodes rewritten and the squared error of the builder's
    blocks and of ours against the source. Refuses (RequantizeError) a node with no proved source."""
    import onnx  # pack time only

    path = model_dir / "model.onnx"
    model = onnx.load(str(path), load_external_data=False)
    total_before = total_after = 0.0
    nodes, inline = 0, False
    for node, built, weight_init, scale_init in _nodes_with_blocks(model, model_dir):
        source = _proved_source(node.name, built, read_tensor)
        ours = quantize(source, built.block, method)
        total_before += float(((dequantize(built) - source) ** 2).sum())
        total_after += float(((dequantize(ours) - source) ** 2).sum())
        inline |= not _write(weight_init, model_dir, ours.codes)
        inline |= not _write(scale_init, model_dir, ours.scales)
        nodes += 1
    if inline:
        onnx.save(model, str(path))  # inline weights (the tiniest graphs) changed in the proto itself
    return {
        "scales": method,
        "nodes": nodes,
        "squared_error": {"builder": total_before, "packed": total_after},
    }


def read_blocks(model_dir: Path) -> dict[str, Blocks]:
    """Every int4 MatMulNBits node of `model_dir`'s graph: its name -> its blocks."""
    import onnx

    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    return {node.name: built for node, built, _, _ in _nodes_with_blocks(model, model_dir)}


def _nodes_with_blocks(model: Any, model_dir: Path) -> Iterator[tuple[Any, Blocks, Any, Any]]:
    import onnx

    inits = {t.name: t for t in model.graph.initializer}
    for node in _int4_nodes(model):
        weight_init, scale_init = inits[node.input[1]], inits[node.input[2]]
        if scale_init.data_type != onnx.TensorProto.FLOAT:
            raise RequantizeError(f"{node.name}: scales of ONNX type {scale_init.data_type}; float32 expected")
        yield node, node_blocks(node, inits, model_dir), weight_init, scale_init


def node_attrs(node: Any) -> dict[str, Any]:
    """An ONNX node's attributes by name."""
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def node_blocks(node: Any, inits: dict[str, Any], model_dir: Path) -> Blocks:
    """A MatMulNBits node's weight as its initializers hold it, at the node's bits."""
    attrs = node_attrs(node)
    n, block, bits = int(attrs["N"]), int(attrs["block_size"]), int(attrs.get("bits", BITS))
    return Blocks(
        _read(inits[node.input[1]], model_dir).reshape(n, -1, block * bits // 8),
        _read(inits[node.input[2]], model_dir).reshape(n, -1),
        block,
        int(attrs["K"]),
        bits,
    )


def _int4_nodes(model: Any) -> Iterator[Any]:

    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        if int(node_attrs(node).get("bits", 4)) != BITS:
            continue
        if len(node.input) > 3 and node.input[3]:
            raise RequantizeError(f"{node.name}: asymmetric int4 (zero points); searched scales are symmetric only")
        yield node


def _proved_source(node: str, built: Blocks, read_tensor: Callable[[str], Any]) -> Any:
    import numpy as np

    tried = []
    for group in candidates(node):
        parts = [_rows(read_tensor, name) for name in group]
        if any(p is None for p in parts):
            continue
        weight = np.concatenate([np.asarray(p, dtype=np.float32) for p in parts], axis=0)
        tried.append("+".join(group))
        if is_rtn_of(built, weight):
            return weight
    what = f"tried {', '.join(tried)}" if tried else "no source tensor of that name"
    raise RequantizeError(
        f"{node}: its int4 blocks are not the round-to-nearest of a source tensor ({what}); refused rather than "
        "rewritten from a guessed source"
    )


def _external(tensor: Any) -> dict[str, str] | None:
    if tensor.data_location != 1:  # onnx.TensorProto.EXTERNAL
        return None
    return {e.key: e.value for e in tensor.external_data}


def _read(tensor: Any, model_dir: Path) -> Any:
    import numpy as np
    import onnx

    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    info = _external(tensor)
    if info is None:
        return onnx.numpy_helper.to_array(tensor)
    with open(model_dir / info["location"], "rb") as f:
        f.seek(int(info.get("offset", 0)))
        raw = f.read(int(info["length"]))
    return np.frombuffer(raw, dtype=dtype).reshape(tuple(tensor.dims))


def _write(tensor: Any, model_dir: Path, array: Any) -> bool:
    """The tensor's values replaced, same shape and type: in place at its offset of the data file (True), or in
    the proto for an inline tensor (False: the graph file must be saved)."""
    import numpy as np
    import onnx

    array = np.ascontiguousarray(array.reshape(tuple(tensor.dims)))
    if array.dtype != onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type):
        raise RequantizeError(f"{tensor.name}: {array.dtype} where the graph holds ONNX type {tensor.data_type}")
    info = _external(tensor)
    if info is None:
        tensor.CopyFrom(onnx.numpy_helper.from_array(array, tensor.name))
        return False
    raw = array.tobytes()
    if len(raw) != int(info["length"]):
        raise RequantizeError(f"{tensor.name}: {len(raw)} bytes where the graph holds {info['length']}")
    with open(model_dir / info["location"], "r+b") as f:
        f.seek(int(info.get("offset", 0)))
        f.write(raw)
    return True


def source_reader(weights: tuple[Path, ...]) -> Callable[[str], Any]:
    """read_tensor for requantize: a tensor of the checkpoint's safetensors files as float32 numpy (bfloat16 and
    float16 widened by torch), None where no file holds it."""
    from safetensors import safe_open

    where: dict[str, Path] = {}
    for path in weights:
        with safe_open(str(path), framework="pt") as f:
            where.update(dict.fromkeys(f.keys(), path))

    def read(name: str) -> Any:
        if name not in where:
            return None
        with safe_open(str(where[name]), framework="pt") as f:
            return f.get_tensor(name).float().numpy()

    return read
