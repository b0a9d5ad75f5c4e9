"""The default model's encoder as a hand-folded ONNX graph (pack time only)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from infra.pack.onnx_io import OPSET


def build_bert_graph(weights: Mapping[str, npt.NDArray[Any]], config: Mapping[str, Any], normalize: bool) -> Any:
    """The MiniLM/BERT encoder + mean pooling (+ L2 normalize) as a standard-opset ONNX graph.

    Folded at pack time so the function does less per call: Q/K/V merged into one MatMul, the 1/sqrt(d)
    attention scale folded into the query weights, token-type-0 embeddings folded into the position table,
    weights stored pre-transposed for MatMul.
    """
    from onnx import TensorProto, helper, numpy_helper

    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    eps = float(config["layer_norm_eps"])
    head_dim = hidden // heads
    nodes: list[Any] = []
    inits: list[Any] = []

    def init(name: str, array: npt.NDArray[Any]) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(op: str, inputs: list[str], name: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def w(key: str) -> npt.NDArray[np.float32]:
        return np.asarray(weights[key], dtype=np.float32)

    def layer_norm(x: str, prefix: str, out: str) -> str:
        return node(
            "LayerNormalization",
            [x, init(f"{prefix}.weight", w(f"{prefix}.weight")), init(f"{prefix}.bias", w(f"{prefix}.bias"))],
            out,
            axis=-1,
            epsilon=eps,
        )

    def linear(
        x: str, prefix: str, out: str, weight: npt.NDArray[Any] | None = None, bias: npt.NDArray[Any] | None = None
    ) -> str:
        wt = (w(f"{prefix}.weight") if weight is None else weight).T
        b = w(f"{prefix}.bias") if bias is None else bias
        mm = node("MatMul", [x, init(f"{prefix}.weight_t", wt)], f"{out}.mm")
        return node("Add", [mm, init(f"{prefix}.bias", b)], out)

    def const(name: str, value: npt.NDArray[Any]) -> str:
        return init(name, value)

    one = const("const.one", np.array(1.0, np.float32))
    half = const("const.half", np.array(0.5, np.float32))
    sqrt2 = const("const.sqrt2", np.array(math.sqrt(2.0), np.float32))
    fmin = const("const.fmin", np.array(np.finfo(np.float32).min, np.float32))
    ax1, ax2, ax12 = (
        const("const.ax1", np.array([1])),
        const("const.ax2", np.array([2])),
        const("const.ax12", np.array([1, 2])),
    )
    zero1 = const("const.zero1", np.array([0]))
    heads_shape = const("const.heads_shape", np.array([0, 0, heads, head_dim]))
    hidden_shape = const("const.hidden_shape", np.array([0, 0, hidden]))
    qkv_split = const("const.qkv_split", np.array([hidden] * 3))

    word = node(
        "Gather",
        [init("embeddings.word_embeddings.weight", w("embeddings.word_embeddings.weight")), "input_ids"],
        "emb.word",
    )
    pos_type = w("embeddings.position_embeddings.weight") + w("embeddings.token_type_embeddings.weight")[0]
    seq_len = node("Shape", ["input_ids"], "emb.seq_len", start=1, end=2)
    pos = node("Slice", [init("embeddings.position_type0", pos_type), zero1, seq_len, zero1], "emb.pos")
    x = layer_norm(node("Add", [word, pos], "emb.sum"), "embeddings.LayerNorm", "emb.out")

    maskf = node("Cast", ["attention_mask"], "mask.f", to=TensorProto.FLOAT)
    bias = node(
        "Unsqueeze", [node("Mul", [node("Sub", [one, maskf], "mask.inv"), fmin], "mask.bias2"), ax12], "mask.bias"
    )

    scale = 1.0 / math.sqrt(head_dim)
    for i in range(int(config["num_hidden_layers"])):
        p = f"encoder.layer.{i}"
        a = f"{p}.attention.self"
        qkv_w = np.concatenate([w(f"{a}.query.weight") * scale, w(f"{a}.key.weight"), w(f"{a}.value.weight")])
        qkv_b = np.concatenate([w(f"{a}.query.bias") * scale, w(f"{a}.key.bias"), w(f"{a}.value.bias")])
        qkv = linear(x, f"{a}.qkv", f"{p}.qkv", qkv_w, qkv_b)
        nodes.append(
            helper.make_node("Split", [qkv, qkv_split], [f"{p}.q", f"{p}.k", f"{p}.v"], name=f"{p}.split", axis=2)
        )
        q = node("Transpose", [node("Reshape", [f"{p}.q", heads_shape], f"{p}.q4")], f"{p}.qt", perm=[0, 2, 1, 3])
        k = node("Transpose", [node("Reshape", [f"{p}.k", heads_shape], f"{p}.k4")], f"{p}.kt", perm=[0, 2, 3, 1])
        v = node("Transpose", [node("Reshape", [f"{p}.v", heads_shape], f"{p}.v4")], f"{p}.vt", perm=[0, 2, 1, 3])
        scores = node("Add", [node("MatMul", [q, k], f"{p}.qk"), bias], f"{p}.scores")
        ctx = node("MatMul", [node("Softmax", [scores], f"{p}.probs", axis=-1), v], f"{p}.ctx4")
        ctx = node("Reshape", [node("Transpose", [ctx], f"{p}.ctxt", perm=[0, 2, 1, 3]), hidden_shape], f"{p}.ctx")
        attn = linear(ctx, f"{p}.attention.output.dense", f"{p}.attn")
        a_out = layer_norm(node("Add", [attn, x], f"{p}.attn_res"), f"{p}.attention.output.LayerNorm", f"{p}.attn_out")
        inter = linear(a_out, f"{p}.intermediate.dense", f"{p}.inter")
        erf = node("Erf", [node("Div", [inter, sqrt2], f"{p}.gelu.div")], f"{p}.gelu.erf")
        gelu = node(
            "Mul", [node("Mul", [inter, half], f"{p}.gelu.half"), node("Add", [erf, one], f"{p}.gelu.add")], f"{p}.gelu"
        )
        out = linear(gelu, f"{p}.output.dense", f"{p}.out")
        x = layer_norm(node("Add", [out, a_out], f"{p}.out_res"), f"{p}.output.LayerNorm", f"{p}.hidden")

    summed = node(
        "ReduceSum",
        [node("Mul", [x, node("Unsqueeze", [maskf, ax2], "pool.mask3")], "pool.masked"), ax1],
        "pool.sum",
        keepdims=0,
    )
    count = node(
        "Max",
        [
            node("ReduceSum", [maskf, ax1], "pool.count0", keepdims=1),
            const("const.min_count", np.array(1e-9, np.float32)),
        ],
        "pool.count",
    )
    pooled = node("Div", [summed, count], "pool.mean" if normalize else "sentence_embedding")
    if normalize:
        norm = node(
            "Max",
            [
                node("ReduceL2", [pooled, ax1], "norm.l2", keepdims=1),
                const("const.min_norm", np.array(1e-12, np.float32)),
            ],
            "norm.denom",
        )
        node("Div", [pooled, norm], "sentence_embedding")

    graph = helper.make_graph(
        nodes,
        "bert_mean_pooled",
        [
            helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
            for n in ("input_ids", "attention_mask")
        ],
        [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", hidden])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="warmstart")
    model.ir_version = 9
    return model
