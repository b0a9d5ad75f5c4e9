"""Packed model directories holding special files where a regular file belongs (issue 32, fault 9): a FIFO (a
SageMaker model.tar.gz can carry one; a plain `open` of it blocks until a writer comes, forever), a UNIX socket,
a character device with /dev/zero's numbers (endless reads), a symlink loop, a symlink out of the directory (to
/dev/zero, or to a regular file of the wrong size), a directory. Each is put at every file the default model's
manifest lists, and at manifest.json itself.

Property: init fails fast with one typed line (ModelLoadError), never hangs and never reads a device, with the
prefetch on or off, for each backend. The cases run in a child process (a hang would otherwise hang the suite)
on one copy of the default model, each case swapping one file out and back; the child prints one JSON line a
case, so a hang names the case that hung.

Also: each run-time open of a model file (the weights' mapping, the tokenizer, the vocabulary, the SHA-256 and
its paced variant, the S3 cache's records) refuses a special file on its own, as after a swap made between the
manifest's check and the open.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from handler.core import manifest
from handler.core.errors import ModelLoadError
from handler.runtime import startfiles

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "models" / "default"
KINDS = ("fifo", "socket", "zero-device", "symlink-loop", "symlink-to-zero", "symlink-out-regular", "directory")


def make_special(path: Path, kind: str) -> None:
    """Put a special file of `kind` at `path` (which must not exist)."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))  # the socket file stays after close; opening it gives ENXIO
    elif kind == "zero-device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o644, os.stat("/dev/zero").st_rdev)
        except PermissionError:  # no CAP_MKNOD (a rootless CI runner): the same device, through a link
            os.symlink("/dev/zero", path)
    elif kind == "symlink-loop":
        os.symlink(path.name, path)  # itself: ELOOP
    elif kind == "symlink-to-zero":
        os.symlink("/dev/zero", path)
    elif kind == "symlink-out-regular":
        os.symlink("/etc/hostname" if os.path.isfile("/etc/hostname") else sys.executable, path)
    elif kind == "directory":
        path.mkdir()
    else:
        raise AssertionError(kind)


_CHILD = r"""
import json, os, sys, threading, time
from pathlib import Path

sys.path.insert(0, sys.argv[1])
from tests.unit.test_model_special_files import make_special
from handler.core.errors import ModelLoadError
from handler.runtime import prefetch, startfiles
from handler.runtime.invocation import Runtime

model, prefetch_mode, backend = Path(sys.argv[2]), sys.argv[3], sys.argv[4]
names, kinds = json.loads(sys.argv[5]), json.loads(sys.argv[6])


def plan(env):
    try:
        return prefetch.plan(env)
    except Exception:  # as prefetch.start: an unreadable manifest is init's to report
        return []


def within(fn, seconds):
    # On a daemon thread joined with a deadline: a hang is reported as one, not waited out.
    out = {}
    def run():
        try:
            out["value"] = fn()
        except BaseException as e:
            out["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise TimeoutError(f"still running after {seconds} s")
    if "error" in out:
        raise out["error"]
    return out.get("value")


for name in names:
    for kind in kinds:
        path = model / name
        aside = path.with_name(path.name + ".aside")
        os.rename(path, aside)
        make_special(path, kind)
        env = {"WARMSTART_MODEL": str(model), "WARMSTART_PREFETCH": prefetch_mode, "WARMSTART_BACKEND": backend}
        t0 = time.perf_counter()
        line = {"name": name, "kind": kind}
        try:
            if prefetch_mode != "off":
                prefetch._started = None  # once per process otherwise
                within(lambda: prefetch.start(env), 5)
                # The thread's reads too, whether or not the page cache looked warm enough to skip them.
                within(lambda: startfiles.issue(plan(env)), 5)
            within(lambda: Runtime.start(environ=env, emit=None), 20)
            line["outcome"] = "started"
        except ModelLoadError as e:
            line.update(outcome="refused", type=type(e).__name__, message=str(e))
        except BaseException as e:
            line.update(outcome="other", type=type(e).__name__, message=str(e))
        line["s"] = round(time.perf_counter() - t0, 3)
        print(json.dumps(line), flush=True)
        if line["outcome"] == "other" and line["type"] == "TimeoutError":
            sys.exit(3)  # a thread is stuck on the special file: no restoring under it
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()
        os.rename(aside, path)
"""


@pytest.fixture(scope="module")
def model_copy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if not (DEFAULT / "manifest.json").is_file():
        pytest.skip("no packed default model (run `warmstart pack --default`)")
    # One copy for the whole module (the shared default must never change): each case swaps a file out and back.
    root = tmp_path_factory.mktemp("special") / "m"
    shutil.copytree(DEFAULT, root)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _listed(model: Path) -> list[str]:
    return ["manifest.json", *json.loads((model / "manifest.json").read_text())["files"]]


@pytest.mark.parametrize("prefetch_mode", ["all", "off"])
@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_init_refuses_a_special_file_at_every_listed_name_in_one_line(
    model_copy: Path, prefetch_mode: str, backend: str
) -> None:
    names = _listed(model_copy)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    env = {k: v for k, v in env.items() if not k.startswith("WARMSTART_")}
    cmd = [sys.executable, "-c", _CHILD, str(ROOT), str(model_copy), prefetch_mode, backend]
    cmd += [json.dumps(names), json.dumps(KINDS)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"init hung; the cases that finished:\n{out[-3000:]}")
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert len(lines) == len(names) * len(KINDS), proc.stdout[-2000:]
    for line in lines:
        assert line["outcome"] == "refused", line
        assert line["type"] == "ModelLoadError" and "\n" not in line["message"], line
        assert line["name"] in line["message"], line  # the message names the file
        assert line["s"] < 3, line  # fast: no read of a device, no wait on a FIFO


# -- each open on its own (as if the file were swapped after the manifest's check) -----------------------------


def _within(fn: Callable[[], Any], path: Path, seconds: float = 5) -> BaseException | None:
    """Run `fn` on a daemon thread; a hang fails the test (and a writer-side open then frees a FIFO's reader)."""
    out: dict[str, BaseException] = {}

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # reported to the test thread
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        if stat.S_ISFIFO(os.lstat(path).st_mode):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # wake the blocked reader: it sees EOF
        pytest.fail(f"{fn} did not return within {seconds} s on {path}")
    return out.get("error")


OPENS: dict[str, Callable[[Path], Any]] = {
    "manifest": lambda p: manifest.load_manifest(p.parent),
    "read_regular": lambda p: manifest.read_regular(p),
    "sha256_file": lambda p: manifest.sha256_file(p),
}


def _opens() -> dict[str, Callable[[Path], Any]]:
    from handler.backends.weights import mmap_safetensors
    from handler.models import s3cache
    from handler.tasks.tokens import TextEncoder, bert_wordpiece

    settings = json.loads((DEFAULT / "manifest.json").read_text())["tokenizer"]["shortcut"]["settings"]

    def s3_record(p: Path) -> None:
        assert s3cache.read_json(p) is None  # refused reads as absent, as a torn record does
        raise ModelLoadError("read as absent")

    return {
        **OPENS,
        "weights": mmap_safetensors,
        "tokenizer": lambda p: TextEncoder(p, 128),
        "vocabulary": lambda p: bert_wordpiece(p, settings),
        "s3 record": s3_record,
    }


@pytest.mark.parametrize("kind", ["fifo", "zero-device", "symlink-to-zero", "directory", "symlink-loop"])
def test_each_model_file_open_refuses_a_special_file(tmp_path: Path, kind: str) -> None:
    if not (DEFAULT / "manifest.json").is_file():
        pytest.skip("no packed default model")
    for what, fn in _opens().items():
        path = tmp_path / "manifest.json"
        make_special(path, kind)
        error = _within(lambda: fn(path), path)  # noqa: B023 (called before the loop moves on)
        assert isinstance(error, ModelLoadError), (what, kind, error)
        assert "\n" not in str(error), (what, str(error))
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()


@pytest.mark.parametrize("kind", ["fifo", "zero-device", "socket", "directory", "symlink-loop"])
def test_the_prefetch_skips_special_files_in_a_start_list(tmp_path: Path, kind: str) -> None:
    """A start list (or a model's plan) naming a special file: warm() and issue() skip it and go on."""
    special, regular = tmp_path / "special", tmp_path / "regular.so"
    make_special(special, kind)
    regular.write_bytes(b"x" * 10_000)
    items: list[startfiles.Item] = [(special, None), (special, [[0, 4096]]), (regular, None)]
    result: dict[str, Any] = {}
    assert _within(lambda: result.update(warm=startfiles.warm(items), issue=startfiles.issue(items)), special) is None
    assert result["issue"] == (10_000, None)  # the regular file asked for; the special one skipped silently
    listing = tmp_path / "startfiles.json"
    make_special(listing, kind)
    loaded: dict[str, Any] = {}
    assert _within(lambda: loaded.update(load=startfiles.load("onnx", listing)), listing) is None
    assert loaded["load"][0] is None  # an unreadable list: the libraries instead
