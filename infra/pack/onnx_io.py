"""Writing ONNX graphs so the function maps their weights instead of reading them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

OPSET = 18
PAGE = 4096  # ONNX Runtime maps external data in place only when an offset is aligned to the page size
INLINE_BELOW = 4096  # small tensors stay in the graph file: padding them to a page would waste more than it saves
ONNX_FILE, ONNX_DATA = "model.onnx", "model.onnx.data"


def write_aligned_external_data(model: Any, data_path: Path, base_dir: Path | None = None) -> None:
    """Move every large initializer of `model` (an onnx.ModelProto) into `data_path`, page-aligned, one tensor
    at a time (each inline tensor's bytes are cleared from the proto as they are written). An initializer that
    is already external is read from its file under `base_dir` (where torch.onnx writes a graph past 2 GB: a file
    per tensor); without `base_dir` it is refused."""
    from onnx import TensorProto, numpy_helper

    offset = 0
    with data_path.open("wb") as out:
        for tensor in model.graph.initializer:
            if tensor.HasField("data_location") and tensor.data_location == TensorProto.EXTERNAL:
                if base_dir is None:
                    raise ValueError(f"initializer {tensor.name!r} is already external; load the model with its data")
                raw = _external_bytes(tensor, base_dir)
            else:
                raw = tensor.raw_data or numpy_helper.to_array(tensor).tobytes()
            if len(raw) < INLINE_BELOW:
                if tensor.data_location == TensorProto.EXTERNAL:  # back inline, as a small tensor always is
                    del tensor.external_data[:]
                    tensor.data_location = TensorProto.DEFAULT
                    tensor.raw_data = raw
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


def _external_bytes(tensor: Any, base_dir: Path) -> bytes:
    info = {e.key: e.value for e in tensor.external_data}
    path = (base_dir / info["location"]).resolve()
    if not path.is_relative_to(base_dir.resolve()):
        raise ValueError(f"initializer {tensor.name!r}: external data {info['location']!r} outside {base_dir}")
    with path.open("rb") as f:
        f.seek(int(info.get("offset", 0)))
        data: bytes = f.read(int(info["length"])) if "length" in info else f.read()
    return data


def save_onnx_file(model: Any, where: Path) -> None:
    """`model` (an onnx.ModelProto, or the path of a model.onnx whose external data lies beside it) written as
    `where`/model.onnx + page-aligned model.onnx.data, one tensor at a time, then checked from the file (the
    checker reads the graph, not the weights: pack memory stays the size of one tensor here)."""
    import onnx

    base = None
    if isinstance(model, Path):
        base = model.parent
        model = onnx.load(str(model), load_external_data=False)
    where.mkdir(parents=True, exist_ok=True)
    write_aligned_external_data(model, where / ONNX_DATA, base)
    onnx.save_model(model, str(where / ONNX_FILE))
    onnx.checker.check_model(str(where / ONNX_FILE))


def save_onnx(model: Any, root: Path) -> None:
    import onnx

    onnx.checker.check_model(model)
    write_aligned_external_data(model, root / ONNX_DATA)
    onnx.save_model(model, str(root / ONNX_FILE))


def onnx_dtype_name(elem_type: int) -> str:
    from onnx import helper

    return str(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)))
