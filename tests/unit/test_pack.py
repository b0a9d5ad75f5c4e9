"""pack_onnx: page-aligned external data, a model ONNX Runtime runs, and an all-or-nothing publish."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from handler.core.manifest import load_manifest, sha256_file
from infra.pack import PAGE, pack_onnx
from tests.conftest import write_tiny_onnx


def external_offsets(model_path: Path) -> dict[str, int]:
    model = onnx.load(str(model_path), load_external_data=False)
    return {
        t.name: int({e.key: e.value for e in t.external_data}.get("offset", "0"))
        for t in model.graph.initializer
        if t.data_location == onnx.TensorProto.EXTERNAL
    }


def test_external_data_is_page_aligned_and_runs(tmp_path: Path) -> None:
    w, b = write_tiny_onnx(tmp_path / "src.onnx", out_dim=1100)  # W: 13,200 bytes, b: 4,400 bytes
    out = pack_onnx(tmp_path / "src.onnx", tmp_path / "packed", "tiny", "1")
    offsets = external_offsets(out / "model.onnx")
    assert set(offsets) == {"W", "b"}  # "two" (8 bytes) stays inline
    assert offsets["b"] > 0
    assert all(o % PAGE == 0 for o in offsets.values())
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    k = np.array([4, 5], np.int64)
    y, z = session.run(["y", "z"], {"x": x, "k": k})
    np.testing.assert_allclose(y, x @ w + b, rtol=1e-5, atol=1e-5)
    assert z.tolist() == [8, 10]


def test_default_model_external_data_is_page_aligned(model_dir: Path) -> None:
    offsets = external_offsets(model_dir / "model.onnx")
    assert len(offsets) > 20
    assert all(o % PAGE == 0 for o in offsets.values())


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path: Path) -> None:
    write_tiny_onnx(tmp_path / "src.onnx", out_dim=1100)
    out = pack_onnx(tmp_path / "src.onnx", tmp_path / "packed", "tiny", "1")
    files = json.loads((out / "manifest.json").read_text())["files"]
    assert set(files) == {"model.onnx", "model.onnx.data"}
    for name, entry in files.items():
        assert entry == {"size": (out / name).stat().st_size, "sha256": sha256_file(out / name)}


def test_failing_pack_leaves_nothing_behind(tmp_path: Path) -> None:
    bad = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Add", ["x", "undefined"], ["y"])],
            "bad",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        ),
        opset_imports=[onnx.helper.make_opsetid("", 18)],
    )
    onnx.save_model(bad, str(tmp_path / "bad.onnx"))
    parent = tmp_path / "models"
    with pytest.raises(onnx.checker.ValidationError):
        pack_onnx(tmp_path / "bad.onnx", parent / "packed", "bad", "1")
    assert parent.is_dir()
    assert list(parent.iterdir()) == []  # neither the output nor the temporary build directory


def test_existing_output_needs_force(tmp_path: Path) -> None:
    write_tiny_onnx(tmp_path / "src.onnx")
    out = pack_onnx(tmp_path / "src.onnx", tmp_path / "packed", "tiny", "1")
    with pytest.raises(FileExistsError, match="force"):
        pack_onnx(tmp_path / "src.onnx", out, "tiny", "2")
    assert load_manifest(out).version == "1"
    pack_onnx(tmp_path / "src.onnx", out, "tiny", "2", force=True)
    assert load_manifest(out).version == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["packed", "src.onnx"]  # no .old or temp left


def test_packed_directory_is_readable_by_others(tmp_path: Path) -> None:
    # Lambda runs the function as a different user than the one who built the image.
    write_tiny_onnx(tmp_path / "src.onnx")
    out = pack_onnx(tmp_path / "src.onnx", tmp_path / "packed", "tiny", "1")
    assert out.stat().st_mode & 0o005 == 0o005


def test_cli_refuses_what_is_not_one_onnx_file_without_a_traceback(tmp_path: Path) -> None:
    """`warmstart pack --onnx` on a directory, a Hugging Face directory, garbage, a graph the checker refuses,
    or a missing file: exit 1, a message naming the file and the reason, nothing written."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    (tmp_path / "dir").mkdir()
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    (tmp_path / "garbage.onnx").write_bytes(b"not a protobuf")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Add", ["x", "undefined"], ["y"])],
        "bad",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    onnx.save_model(onnx.helper.make_model(graph), str(tmp_path / "invalid.onnx"))
    cases = {
        "dir": "a directory; --onnx takes one .onnx file",
        "hf": "use `warmstart pack --from DIR`",
        "garbage.onnx": "not a readable ONNX model",
        "invalid.onnx": "not a valid ONNX graph",
        "missing.onnx": "no such file",
    }
    for name, message in cases.items():
        out = tmp_path / "out" / name
        cmd = [
            sys.executable,
            "-m",
            "infra.cli",
            "pack",
            "--onnx",
            str(tmp_path / name),
            "--id",
            "m",
            "--out",
            str(out),
        ]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 1, (name, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, (name, done.stderr)
        assert done.stderr.startswith(f"warmstart pack: {tmp_path / name}"), done.stderr
        assert not out.exists()
