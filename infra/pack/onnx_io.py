"""Writing ONNX graphs so the function maps their weights instead of reading them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

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


def save_onnx(model: Any, root: Path) -> None:
    import onnx

    onnx.checker.check_model(model)
    write_aligned_external_data(model, root / ONNX_DATA)
    onnx.save_model(model, str(root / ONNX_FILE))


def onnx_dtype_name(elem_type: int) -> str:
    from onnx import helper

    return str(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)))
