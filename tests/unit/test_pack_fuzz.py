"""A fuzzing pass for `warmstart pack --from` (issue 24, item 12): malformed model directories, made by
mutating a valid tiny one (tests.tiny_models: random weights, nothing downloaded).

Property: the pack either succeeds, or exits 1 with exactly one `warmstart pack: ...` line on stderr, no
traceback, and nothing written at --out (nor a temporary sibling left next to it).

In process (the CLI's main() with argv, stderr captured), `--backends torch` (no ONNX export: a second or so
per example, so ~40 examples fit in well under a minute on 2 cores); the golden answers still load the packed
weights through the runtime's torch encoder.

What it found on its own, beyond the cases issue 24 listed (each now a typed, one-line refusal):
- a config.json field of the wrong type that transformers' strict config class rejects (e.g.
  `add_cross_attention: -1`): a StrictDataclassFieldValidationError traceback from inside the build
  (now infra.pack.hf_pack.check_transformers_config, before anything is written);
- a tokenizer_config.json transformers cannot build a tokenizer from (e.g. a special token that is a number):
  a TypeError traceback (now hf_pack.load_tokenizer, before anything is written).
In 400 random directories (a local run, not this bounded one): 53 packed, 347 refused in one line.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.cli import main
from tests.tiny_models import make_model_dir

FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
)
JSON_FILES = tuple(f for f in FILES if f.endswith(".json"))
DEEP = "[" * 50_000 + "]" * 50_000  # past the recursion limit of json's decoder
WRONG_VALUES = st.sampled_from(
    [-1, 0, -(10**9), 10**30, 2**63, 1.5, float("inf"), "x", "", None, True, [], {}, [1, 2], {"a": {"b": 1}}, [[[[]]]]]
)


@pytest.fixture(scope="module")
def valid_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("fuzz"), "bert", "sentence-transformers", normalize=True)


def _json_paths(value: Any, prefix: tuple[Any, ...] = (), depth: int = 0) -> list[tuple[Any, ...]]:
    """Key paths into a JSON document, two levels deep (where the settings a pack reads live)."""
    items: list[tuple[Any, Any]] = []
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value[:5]))
    paths = []
    for key, child in items:
        paths.append((*prefix, key))
        if depth < 1:
            paths += _json_paths(child, (*prefix, key), depth + 1)
    return paths


@st.composite
def mutation(draw: st.DrawFn) -> tuple[Any, ...]:
    kind = draw(st.sampled_from(["delete", "truncate", "corrupt", "json-value", "json-whole", "symlink-out"]))
    name = draw(st.sampled_from(JSON_FILES if kind in ("json-value", "json-whole") else FILES))
    if kind == "truncate":
        return (kind, name, draw(st.floats(0.0, 0.99)))
    if kind == "corrupt":
        return (kind, name, draw(st.floats(0.0, 1.0)), draw(st.binary(min_size=1, max_size=16)))
    if kind == "json-value":
        return (kind, name, draw(st.integers(0, 10_000)), draw(WRONG_VALUES))
    if kind == "json-whole":
        return (kind, name, draw(st.sampled_from(["[]", "{}", "1", '"s"', "null", DEEP, '{"a": ' * 50_000])))
    if kind == "symlink-out":
        return (kind, name, draw(st.sampled_from(["/", "/etc/hostname", "/nonexistent", "/dev/null"])))
    return (kind, name)


def apply(root: Path, change: tuple[Any, ...]) -> None:
    kind, name, *rest = change
    path = root / name
    if kind not in ("symlink-out", "delete") and (path.is_symlink() or not path.is_file()):
        return  # an earlier mutation deleted it or made it a link out: never write through one
    if kind == "delete":
        path.unlink(missing_ok=True)
    elif kind == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: int(len(data) * rest[0])])
    elif kind == "corrupt":
        data = bytearray(path.read_bytes())
        at = int(len(data) * rest[0])
        data[at : at + len(rest[1])] = rest[1]
        path.write_bytes(bytes(data))
    elif kind == "json-whole":
        path.write_text(rest[0])
    elif kind == "json-value":
        _replace_value(path, rest[0], rest[1])
    elif kind == "symlink-out":
        path.unlink(missing_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(rest[0])


def _replace_value(path: Path, index: int, value: Any) -> None:
    try:
        doc = json.loads(path.read_text())
    except (ValueError, RecursionError):
        return  # already not JSON
    paths = _json_paths(doc)
    if not paths:
        return
    *parents, last = paths[index % len(paths)]
    target = doc
    for key in parents:
        target = target[key]
    target[last] = value
    path.write_text(json.dumps(doc))  # inf is written as Infinity, which Python's json reads back


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,  # the same 40 directories each run: a CI failure reproduces locally
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(changes=st.lists(mutation(), min_size=1, max_size=3))
def test_pack_from_succeeds_or_refuses_in_one_line(valid_dir: Path, changes: list[tuple[Any, ...]]) -> None:
    work = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        src = work / "model"
        shutil.copytree(valid_dir, src, symlinks=True)
        for change in changes:
            apply(src, change)
        out = work / "models" / "packed"
        out.parent.mkdir()
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(["pack", "--from", str(src), "--out", str(out), "--backends", "torch"])
        if rc == 0:
            assert (out / "manifest.json").is_file()
            return
        lines = err.getvalue().splitlines()
        assert rc == 1, (changes, err.getvalue())
        assert len(lines) == 1 and lines[0].startswith("warmstart pack: "), (changes, err.getvalue())
        assert os.listdir(out.parent) == [], changes  # nothing at --out, no temporary sibling
    finally:
        shutil.rmtree(work, ignore_errors=True)
