"""Read a safetensors file into torch tensors that alias one private file mapping: no copy, no unpickling.

`torch.UntypedStorage.from_file(shared=False)` maps the file copy-on-write; each tensor is a view into that
mapping, so pages are read on first touch and the weights exist once in memory (the page cache).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import torch

from handler.core.errors import ModelLoadError
from handler.core.manifest import regular_path

_DTYPES = {
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_MAX_HEADER = 100 * 1024 * 1024


def mmap_safetensors(path: Path) -> dict[str, torch.Tensor]:
    # The header read and the mapping go through one checked descriptor (regular_path): a FIFO or device put at
    # the name is refused, never read, and the file mapped is the one whose header was read.
    with regular_path(path) as name:
        return _map(path, name)


def _map(path: Path, name: str) -> dict[str, torch.Tensor]:
    size = os.stat(name).st_size
    with open(name, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise ModelLoadError(f"{path}: too short to be safetensors ({size} bytes)")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(_MAX_HEADER, size - 8):
            raise ModelLoadError(f"{path}: header length {header_len} does not fit the {size}-byte file")
        try:
            header: Any = json.loads(f.read(header_len))
        except ValueError as e:
            raise ModelLoadError(f"{path}: safetensors header is not valid JSON ({e})") from None
        except RecursionError:  # `[[[[...` past the interpreter's recursion limit
            raise ModelLoadError(f"{path}: safetensors header is not valid JSON (nested too deeply)") from None
        if not isinstance(header, dict):
            raise ModelLoadError(f"{path}: safetensors header is not a JSON object (got {type(header).__name__})")
    storage = torch.UntypedStorage.from_file(name, shared=False, nbytes=size)
    whole = torch.empty(0, dtype=torch.uint8).set_(storage)  # type: ignore[arg-type]  # byte view of the mapping; slices stay views
    base = 8 + header_len
    tensors: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _DTYPES[info["dtype"]]
            start, end = (base + int(o) for o in info["data_offsets"])
            shape = [int(d) for d in info["shape"]]
        except (KeyError, TypeError, ValueError):
            raise ModelLoadError(f"{path}: tensor {name!r} has an unsupported or malformed entry {info}") from None
        if not base <= start <= end <= size:
            raise ModelLoadError(f"{path}: tensor {name!r} spans bytes {start}..{end}, outside the file")
        numel = 1
        for d in shape:
            numel *= d
        if end - start != numel * dtype.itemsize:
            raise ModelLoadError(
                f"{path}: tensor {name!r} has {end - start} bytes, shape {shape} of {info['dtype']} needs "
                f"{numel * dtype.itemsize}"
            )
        if start % dtype.itemsize:
            raise ModelLoadError(f"{path}: tensor {name!r} starts at byte {start}, not aligned for {info['dtype']}")
        tensors[name] = whole[start:end].view(dtype).view(shape)
    return tensors
