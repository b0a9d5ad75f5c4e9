"""Other versions of the packed default model, for registry and reload tests and the reload benchmark.

`write_version(src, dst, "0.2.0")` copies the ONNX backend's files and the tokenizer under a new version
string (same answers); `negate=True` also appends a `Neg` to the graph, so that version answers exactly
`-v` for every vector `v` of the original: a response then proves by its numbers which version computed
it, not only by its `"model"` field. The manifest is rewritten with every file's size and SHA-256.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from handler.core.manifest import MANIFEST_NAME, sha256_file


def write_version(src: Path, dst: Path, version: str, *, negate: bool = False, model_id: str | None = None) -> Path:
    raw = json.loads((src / MANIFEST_NAME).read_text())
    onnx_spec = raw["backends"]["onnx"]
    names = [*onnx_spec["files"], raw["tokenizer"]["file"]]
    dst.mkdir(parents=True)
    for name in names:
        shutil.copyfile(src / name, dst / name)  # copies, not links: two versions really are two sets of pages
    if negate:
        _negate_output(dst / onnx_spec["model"], raw["outputs"][0]["name"])
    raw["version"] = version
    raw["id"] = model_id or raw["id"]
    raw["backends"] = {"onnx": onnx_spec}
    raw["default_backend"] = "onnx"
    raw["files"] = {n: {"size": (dst / n).stat().st_size, "sha256": sha256_file(dst / n)} for n in names}
    (dst / MANIFEST_NAME).write_text(json.dumps(raw, indent=2) + "\n")
    return dst


def _negate_output(model_path: Path, output: str) -> None:
    """The graph's output `output` becomes its negation (its weights stay in the external data file)."""
    import onnx
    from onnx import helper

    model = onnx.load(str(model_path), load_external_data=False)
    inner = f"{output}_before_neg"
    for node in model.graph.node:
        node.output[:] = [inner if o == output else o for o in node.output]
    model.graph.node.append(helper.make_node("Neg", [inner], [output], name="negate_for_tests"))
    onnx.save_model(model, str(model_path))


def flip_byte(path: Path, offset: int | None = None) -> None:
    """Corrupt one byte in place (size unchanged: only SHA-256 can tell)."""
    with path.open("r+b") as f:
        size = f.seek(0, 2)
        f.seek(size // 2 if offset is None else offset)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))


def truncate(path: Path, drop: int = 4096) -> None:
    with path.open("r+b") as f:
        f.truncate(max(0, f.seek(0, 2) - drop))
