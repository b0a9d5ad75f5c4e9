"""`warmstart pack --from` on hostile input (issue 32): configs transformers accepts but cannot build a model from,
calibration text that is not valid Unicode (fault 11), and source directories holding special files where a
regular file belongs (a FIFO, /dev/zero's device, a socket, a symlink loop or out of the directory, a directory).

Property: exit 1 with exactly one `warmstart pack: ...` line, no traceback, nothing at --out (and no temporary
sibling); the special files never hang the pack nor read a device forever (a child process with a timeout,
printing one JSON line a case, so a hang names its case).
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infra.cli import main
from tests.tiny_models import make_model_dir

ROOT = Path(__file__).resolve().parents[2]


def _pack(src: Path, out: Path, *extra: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["pack", "--from", str(src), "--out", str(out), *extra])
    return rc, err.getvalue()


def _edit_config(src: Path, edit: dict[str, Any]) -> None:
    config = json.loads((src / "config.json").read_text())
    config.update(edit)
    (src / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("family", "edit", "field", "error"),
    [
        ("qwen3", {"hidden_act": "evil"}, "hidden_act", "KeyError: 'evil'"),
        ("qwen3", {"rope_scaling": {"rope_type": "garbage"}}, "rope_scaling.rope_type", "KeyError: 'garbage'"),
        ("gemma3_text", {"query_pre_attn_scalar": 0}, "query_pre_attn_scalar", "ZeroDivisionError"),
    ],
)
def test_a_config_transformers_cannot_build_is_one_line_naming_the_field(
    tmp_path: Path, family: str, edit: dict[str, Any], field: str, error: str
) -> None:
    """transformers' config class takes these; building the model raises (KeyError: no such activation or rope
    type; ZeroDivisionError: 0 ** -0.5). Before: the exception's traceback out of `warmstart pack`."""
    src = make_model_dir(tmp_path, family, "sentence-transformers")
    _edit_config(src, edit)
    out = tmp_path / "models" / "packed"
    out.parent.mkdir()
    rc, err = _pack(src, out, "--backends", "torch")
    lines = err.splitlines()
    assert rc == 1 and len(lines) == 1, err
    assert lines[0].startswith(f"warmstart pack: {src / 'config.json'}: transformers cannot build the model"), err
    assert f"(check {field})" in lines[0] and error in lines[0], err
    assert list(out.parent.iterdir()) == []


def test_calibration_text_with_a_lone_surrogate_is_refused_with_its_line(tmp_path: Path) -> None:
    """A JSON line `"\\ud800"` decodes to a str no tokenizer takes. Before: a TypeError traceback from the
    tokenizer, after the model was loaded."""
    src = make_model_dir(tmp_path, "bert", "sentence-transformers")
    calibration = tmp_path / "texts.txt"
    calibration.write_text('a plain line\n"a JSON line"\n"\\ud800"\n')
    out = tmp_path / "models" / "packed"
    out.parent.mkdir()
    rc, err = _pack(src, out, "--backends", "onnx", "--quantize", "int8", "--calibration", str(calibration))
    assert rc == 1, err
    assert err == f"warmstart pack: --calibration {calibration}: line 3 holds a lone surrogate, not valid Unicode\n"
    assert list(out.parent.iterdir()) == []


# -- special files in the source directory --------------------------------------------------------------------

SOURCE_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "modules.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
)
SOURCE_KINDS = ("fifo", "zero-device", "socket", "symlink-loop", "symlink-to-zero", "directory")

_CHILD = r"""
import contextlib, io, json, os, shutil, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, sys.argv[1])
from infra.cli import main
from tests.unit.test_model_special_files import make_special

for valid, name in json.loads(sys.argv[2]):
    valid = Path(valid)
    for kind in json.loads(sys.argv[3]):
        work = Path(tempfile.mkdtemp(prefix="special-pack-"))
        src = work / "src"
        shutil.copytree(valid, src, symlinks=True)
        (src / name).unlink(missing_ok=True)
        make_special(src / name, kind)
        out = work / "models" / "packed"
        out.parent.mkdir()
        err = io.StringIO()
        t0 = time.perf_counter()
        line = {"name": name, "kind": kind}
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                line["rc"] = main(["pack", "--from", str(src), "--out", str(out), "--backends", "torch"])
        except BaseException as e:
            line["raised"] = f"{type(e).__name__}: {e}"
        line.update(s=round(time.perf_counter() - t0, 3), stderr=err.getvalue(), left=os.listdir(out.parent))
        print(json.dumps(line), flush=True)
        shutil.rmtree(work, ignore_errors=True)
"""


def test_special_files_in_a_source_directory_are_refused_in_one_line(tmp_path: Path) -> None:
    # Two sources: the tokenizer as tokenizer.json, and as vocab.txt (a directory without tokenizer.json).
    with_json = make_model_dir(tmp_path, "bert", "sentence-transformers")
    with_vocab = make_model_dir(tmp_path, "bert", "sentence-transformers", tokenizer_files="vocab", name="vocab")
    cases = [(str(with_json), n) for n in SOURCE_FILES if (with_json / n).exists()]
    cases += [(str(with_vocab), n) for n in ("vocab.txt", "tokenizer_config.json") if (with_vocab / n).exists()]
    names = {n for _, n in cases}
    assert {"config.json", "vocab.txt", "tokenizer.json", "model.safetensors"} <= names, cases
    cmd = [sys.executable, "-c", _CHILD, str(ROOT), json.dumps(cases), json.dumps(SOURCE_KINDS)]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"the pack hung; the cases that finished:\n{out[-3000:]}")
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    assert done.returncode == 0 and len(lines) == len(cases) * len(SOURCE_KINDS), done.stderr[-3000:]
    for line in lines:
        assert "raised" not in line, line
        stderr = line["stderr"].splitlines()
        assert line["rc"] == 1 and len(stderr) == 1 and stderr[0].startswith("warmstart pack: "), line
        assert line["name"].rsplit("/", 1)[-1] in stderr[0], line  # names the file
        assert line["left"] == [], line  # nothing at --out, no temporary sibling
        assert line["s"] < 10, line


def _add_token_past_the_table(src: Path) -> int:
    """An added special token at id = the config's vocab_size (one past the embedding table's last row): what
    the tiny SigLIP2 fixture once had (`<eos>` at 130 of 130 rows)."""
    config = json.loads((src / "config.json").read_text())
    rows = int((config.get("text_config") or config)["vocab_size"])
    tokenizer = json.loads((src / "tokenizer.json").read_text())
    tokenizer["added_tokens"].append(
        {"id": rows, "content": "<past>", "single_word": False, "lstrip": False, "rstrip": False}
        | {"normalized": False, "special": True}
    )
    (src / "tokenizer.json").write_text(json.dumps(tokenizer))
    return rows


@pytest.mark.parametrize("kind", ["encoder", "generate", "image-text"])
def test_a_token_id_past_the_embedding_table_is_refused_in_one_line(tmp_path: Path, kind: str) -> None:
    """Before: it packed, and every request holding the token failed at run time (a Gather out of range)."""
    if kind == "encoder":
        src = make_model_dir(tmp_path, "bert", "sentence-transformers")
    elif kind == "generate":
        from tests.lm_models import make_lm_dir

        src = make_lm_dir(tmp_path, "qwen3")
    else:
        from tests.image_models import make_image_text_dir

        src = make_image_text_dir(tmp_path, "clip")
    rows = _add_token_past_the_table(src)
    out = tmp_path / "models" / "packed"
    out.parent.mkdir()
    rc, err = _pack(src, out)
    assert rc == 1 and len(err.splitlines()) == 1, err
    assert f"past the model's {rows} embedding rows" in err and f"'<past>' = {rows}" in err
    assert list(out.parent.iterdir()) == []
