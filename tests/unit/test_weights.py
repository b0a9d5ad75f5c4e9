"""mmap_safetensors: tensors that alias one private file mapping, and clear errors on broken files."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from handler.backends.weights import mmap_safetensors
from handler.core.errors import ModelLoadError


@pytest.fixture
def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "dense.weight": torch.randn(5, 7, generator=g),
        "dense.bias": torch.randn(7, generator=g).to(torch.float16),
        "ids": torch.arange(11, dtype=torch.int64),
        "scale": torch.tensor(0.5, dtype=torch.bfloat16),
        "mask": torch.tensor([True, False, True]),
    }


@pytest.fixture
def path(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    file = tmp_path / "w.safetensors"
    save_file(tensors, str(file), metadata={"format": "pt"})
    return file


def test_values_dtypes_and_shapes(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    loaded = mmap_safetensors(path)
    assert set(loaded) == set(tensors)  # __metadata__ skipped
    for name, expected in tensors.items():
        assert loaded[name].dtype == expected.dtype
        assert loaded[name].shape == expected.shape
        assert torch.equal(loaded[name], expected)


def test_all_tensors_alias_one_mapping(path: Path) -> None:
    loaded = mmap_safetensors(path)
    pointers = {t.untyped_storage().data_ptr() for t in loaded.values()}
    assert len(pointers) == 1
    assert all(t.untyped_storage().nbytes() == path.stat().st_size for t in loaded.values())


def test_mapping_is_private(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    before = path.read_bytes()
    loaded = mmap_safetensors(path)
    loaded["dense.weight"].zero_()  # copy-on-write: the file (and other instances' pages) stay intact
    assert path.read_bytes() == before
    assert torch.equal(mmap_safetensors(path)["dense.weight"], tensors["dense.weight"])


def write_raw(path: Path, header: bytes, data: bytes = b"") -> Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def test_too_short(tmp_path: Path) -> None:
    (tmp_path / "w.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(ModelLoadError, match="too short"):
        mmap_safetensors(tmp_path / "w.safetensors")


def test_truncated_file_header_does_not_fit(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ModelLoadError, match="does not fit") as info:
        mmap_safetensors(path)
    assert str(path) in str(info.value)


def test_garbled_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8:12] = b"\x00{{{"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="header is not valid JSON"):
        mmap_safetensors(path)


@pytest.mark.parametrize(
    ("header", "fragment"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "header is not valid JSON \\(nested"),  # was a raw RecursionError
        (b"[1, 2]", "header is not a JSON object"),  # was AttributeError: 'list' object has no attribute 'items'
        (b'"text"', "header is not a JSON object"),
    ],
)
def test_a_header_that_is_no_object_is_a_model_load_error(tmp_path: Path, header: bytes, fragment: str) -> None:
    path = write_raw(tmp_path / "w.safetensors", header, bytes(16))
    with pytest.raises(ModelLoadError, match=fragment):
        mmap_safetensors(path)


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ({"dtype": "F32", "shape": [2], "data_offsets": [0, 800]}, "outside the file"),
        ({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}, "needs 12"),
        ({"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}, "unsupported or malformed"),
        ({"dtype": "F32", "shape": [1]}, "unsupported or malformed"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}, "not aligned"),
    ],
)
def test_bad_tensor_entries(tmp_path: Path, entry: dict[str, object], fragment: str) -> None:
    header = json.dumps({"t": entry}).encode()
    header += b" " * (-len(header) % 8)
    path = write_raw(tmp_path / "w.safetensors", header, bytes(16))
    with pytest.raises(ModelLoadError, match=fragment) as info:
        mmap_safetensors(path)
    assert "'t'" in str(info.value)
