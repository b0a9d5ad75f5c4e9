"""The start's file list (handler/runtime/startfiles.py): recorded from a real start, replayed by the prefetch
thread, and harmless when missing, stale or broken. Its effect on a cold start is measured in
bench/coldstart/run.py (--caches cold), not here."""

from __future__ import annotations

import json
import json.decoder
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from handler.runtime import prefetch, startfiles, startrecord
from tests.conftest import ROOT

PAGE = startrecord.PAGE


def test_resident_pages_become_merged_ranges_clipped_to_the_file() -> None:
    pages = [True, True, False, False, True] + [False] * 40 + [True]
    size = 45 * PAGE + 100  # the last page is partial
    assert startrecord.ranges_of(pages, size, gap=2 * PAGE) == [[0, 5 * PAGE], [45 * PAGE, 100]]
    assert startrecord.ranges_of(pages, size, gap=0) == [[0, 2 * PAGE], [4 * PAGE, PAGE], [45 * PAGE, 100]]
    assert startrecord.ranges_of([False, False], 2 * PAGE) == []


def test_a_packages_libraries_come_just_before_its_first_extension(tmp_path: Path) -> None:
    base = tmp_path / "site"
    files = ["handler/__init__.py", "numpy/__init__.pyc", "numpy/_core/umath.so", "tok/t.so", "numpy.libs/blas.so"]
    for f in files:
        (base / f).parent.mkdir(parents=True, exist_ok=True)
        (base / f).write_bytes(b"x")
    modules = [str(base / f) for f in files[:4]]
    maps = [str(base / "numpy.libs/blas.so"), str(base / "tok/t.so"), "/elsewhere/libc.so.6"]
    assert startrecord.order(modules, maps, [str(base)]) == [
        "handler/__init__.py",
        "numpy/__init__.pyc",
        "numpy.libs/blas.so",
        "numpy/_core/umath.so",
        "tok/t.so",
    ]


def write_list(path: Path, **fields: object) -> Path:
    doc = {"version": startfiles.VERSION, "cache_tag": sys.implementation.cache_tag, "backend": "onnx", "files": []}
    path.write_text(json.dumps({**doc, **fields}))
    return path


def test_load_resolves_against_sys_path_and_refuses_what_is_stale(tmp_path: Path) -> None:
    listed = [["json/decoder.py", None], ["handler/runtime/prefetch.py", [[0, 4096]]], ["gone_pkg/x.py", None]]
    items, why = startfiles.load("onnx", write_list(tmp_path / "ok.json", files=listed))
    assert why == "recorded" and items is not None
    assert [p for p, _ in items] == [Path(json.decoder.__file__), Path(prefetch.__file__)]  # found as imports find them
    assert items[1][1] == [[0, 4096]]
    assert startfiles.load("onnx", tmp_path / "missing.json") == (None, "none recorded")
    assert startfiles.load("torch", tmp_path / "ok.json") == (None, "stale: recorded for the onnx backend")
    other = write_list(tmp_path / "other.json", cache_tag="cpython-399")
    assert startfiles.load("onnx", other) == (None, "stale: recorded for cpython-399")
    (tmp_path / "bad.json").write_text("{not json")
    assert startfiles.load("onnx", tmp_path / "bad.json") == (None, "unreadable: JSONDecodeError")
    assert startfiles.load("onnx", write_list(tmp_path / "v0.json", version=0)) == (None, "stale: another format")


def test_a_warm_cache_probe_parses_only_the_header_line(tmp_path: Path) -> None:
    listed = [[f"json/{n}", None] for n in ("__init__.py", "decoder.py", "encoder.py", "scanner.py", "tool.py")]
    listed += [["handler/runtime/prefetch.py", [[0, 4096]]]] * 5
    head = {"version": startfiles.VERSION, "cache_tag": sys.implementation.cache_tag, "backend": "onnx"}
    probe = startfiles.sample(listed, startfiles.PROBE)
    text = json.dumps({**head, "probe": probe})[:-1] + ",\n" + '"files": ' + json.dumps(listed, indent=0) + "}\n"
    whole = tmp_path / "startfiles.json"
    whole.write_text(text)
    assert json.loads(text)["files"] == listed  # still one JSON document
    # The probe is the same read from the header alone as sampled from the whole list (a list without one).
    from_head = startfiles.load("onnx", whole, count=startfiles.PROBE)
    old_layout = write_list(tmp_path / "old.json", files=listed)
    assert from_head == startfiles.load("onnx", old_layout, count=startfiles.PROBE)
    assert from_head[0] is not None and len(from_head[0]) == startfiles.PROBE
    # Only the first line is parsed: a list cut short after it still gives the probe (the full load refuses it).
    cut = tmp_path / "cut.json"
    cut.write_text(text.split("\n", 1)[0] + "\n" + '"files": [[')
    assert startfiles.load("onnx", cut, count=startfiles.PROBE) == from_head
    assert startfiles.load("onnx", cut) == (None, "unreadable: JSONDecodeError")
    # The header's own checks still hold.
    assert startfiles.load("torch", whole, count=startfiles.PROBE) == (None, "stale: recorded for the onnx backend")


def test_a_start_loads_the_replay_but_not_the_recorder(model_dir: Path) -> None:
    # The prefetch imports startfiles at every start; the recorder (build time) is a module of its own.
    code = (
        "import json, sys, handler.app\n"
        "replay = sys.modules.get('handler.runtime.startfiles')\n"
        "recorder = 'handler.runtime.startrecord' in sys.modules\n"
        "print(json.dumps([replay is not None, hasattr(replay, 'record'), recorder]))"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("WARMSTART_")}
    env = {**base, "WARMSTART_MODEL": str(model_dir), "WARMSTART_WARMUP": "0", "WARMSTART_PREFETCH": "all"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [True, False, False]


@pytest.mark.parametrize("content", ["{not json", json.dumps({"version": 1, "files": 7})])
def test_a_broken_list_falls_back_to_the_libraries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str
) -> None:
    broken = tmp_path / "startfiles.json"
    broken.write_text(content)
    monkeypatch.setattr(startfiles, "LIST", broken)
    job = prefetch.Prefetch([], "all", "onnx")
    code = job._code()
    assert job.code_source.startswith("libraries (start list: ")
    assert code and any("onnxruntime" in str(p) for p, _ in code)  # the whole libraries, as before lists


def test_a_recorded_start_lists_the_pages_it_read_and_the_prefetch_replays_them(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "startfiles.json"
    summary = startrecord.record(out, model_dir)
    doc = json.loads(out.read_text())
    assert summary["files"] == len(doc["files"]) > 50 and doc["backend"] == "onnx"
    assert doc["probe"] == startfiles.sample(doc["files"], startfiles.PROBE)  # the header line's warm-cache probe
    assert startfiles._head(out.read_bytes()) == {k: v for k, v in doc.items() if k != "files"}
    names = [rel for rel, _ in doc["files"]]
    # in import order: Lambda mode's runtime client first (what the .pth hook gets ahead of), then ours
    tops = [n.split("/", 1)[0] for n in names]
    assert tops[0] == "awslambdaric" and tops.index("awslambdaric") < tops.index("handler") < tops.index("tokenizers")
    assert any(n.startswith("onnxruntime/") for n in names)
    # an on-demand start of the default model is lean (handler.core.numpy_gate): numpy is read after its answer
    assert not [n for n in names if n.split("/", 1)[0] in ("numpy", "numpy.libs")]
    assert not [n for n in names if n.startswith("models/")]  # the model's files are the manifest's to plan
    items, why = startfiles.load("onnx", out)
    assert why == "recorded" and items is not None and len(items) == len(names)
    for path, ranges in items:
        size = os.path.getsize(path)
        assert ranges is None or all(o >= 0 and o + n <= size and n > 0 for o, n in ranges), (path, ranges)
    # the extension modules are in it, not only the .pyc files (the pages they read: the whole file when other
    # processes on the host map it and its pages could not be evicted before the recording start)
    # (on the CPU ONNX Runtime's C library: the Python binding's module, its own copy of the runtime, is not loaded)
    assert any(p.name.startswith("libonnxruntime.so") for p, _ in items)
    assert not any("onnxruntime_pybind11_state" in p.name for p, _ in items)
    monkeypatch.setattr(startfiles, "LIST", out)
    job = prefetch.Prefetch([], "all", "onnx")
    job._run()
    assert job.code_source == f"recorded ({len(names)} files)" and job.error is None
    assert job.report()["files"] == len(names)


def hooked_start(site_dir: Path, argv: list[str], pythonpath: str) -> tuple[str, str]:
    """A Python that processes `site_dir`'s .pth files, as site.py does at start; what the hook left on sys."""
    code = f"import site, sys; site.addsitedir({str(site_dir)!r}); print(getattr(sys, {startfiles.ISSUED!r}, False))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": pythonpath}
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=site_dir, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip(), proc.stderr


def test_the_interpreter_start_hook_replays_only_for_this_functions_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = str(Path(startfiles.__file__).resolve().parents[2])
    extra = tmp_path / "extra"  # a sys.path entry whose file the list names, kept out of the page cache
    cold = on_disk(extra / "coldpkg" / "data.bin")
    evict(cold)
    root = f"{code}:{extra}"
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    listing = write_list(tmp_path / "startfiles.json", files=[["coldpkg/data.bin", None]])
    pth = startfiles.install_pth(site_dir, listing)
    assert pth.read_text().startswith("import ") and len(pth.read_text().splitlines()) == 1
    assert hooked_start(site_dir, ["handler.app.lambda_handler"], root) == ("True", "")
    cold.read_bytes()  # the page cache holds the list: nothing to issue
    assert hooked_start(site_dir, ["handler.app.lambda_handler"], root) == ("False", "")
    evict(cold)
    assert hooked_start(site_dir, ["serve"], root) == ("False", "")  # argv names no `handler`: not our start
    monkeypatch.setenv("WARMSTART_PREFETCH", "model")  # the code prefetch switched off
    assert hooked_start(site_dir, ["handler.app.lambda_handler"], root) == ("False", "")
    monkeypatch.delenv("WARMSTART_PREFETCH")
    other = tmp_path / "other"
    (other / "handler").mkdir(parents=True)
    assert hooked_start(site_dir, ["handler.app.lambda_handler"], f"{other}:{root}") == ("False", "")  # not this code
    write_list(listing, cache_tag="cpython-399")  # stale: nothing issued, the prefetch falls back and says so
    assert hooked_start(site_dir, ["handler.app.lambda_handler"], root) == ("False", "")
    listing.write_text("{broken")
    assert hooked_start(site_dir, ["handler.app.lambda_handler"], root) == ("False", "")
    listing.unlink()  # gone: the line does nothing, prints nothing
    assert hooked_start(site_dir, ["handler.app.lambda_handler"], root) == ("False", "")


def on_disk(path: Path, size: int = 1 << 20) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())  # clean pages: DONTNEED drops them
    return path


def evict(path: Path) -> None:
    startrecord.evict([str(path)])


@pytest.mark.skipif(not hasattr(os, "RWF_NOWAIT"), reason="the probe needs preadv's RWF_NOWAIT (Linux)")
def test_the_warm_probe_sees_which_pages_the_cache_holds(tmp_path: Path) -> None:
    a, b = on_disk(tmp_path / "a.bin"), on_disk(tmp_path / "b.bin")
    a.read_bytes(), b.read_bytes()
    assert startfiles.warm([(a, None), (b, [[0, 4096], [512 * 1024, 4096]])]) is True
    evict(b)
    assert startfiles.warm([(a, None), (b, None)]) is False
    b.read_bytes()
    fd = os.open(b, os.O_RDONLY)
    os.posix_fadvise(fd, 512 * 1024, 0, os.POSIX_FADV_DONTNEED)  # the second half (the last range) gone
    os.close(fd)
    assert startfiles.warm([(b, [[0, 4096], [512 * 1024, 4096]])]) is False
    assert startfiles.warm([(tmp_path / "gone.bin", None), (a, None)]) is True  # a missing file reads nothing
    assert startfiles.warm([]) is False
    items = [(tmp_path / f"{i}", None) for i in range(20)]
    picked = startfiles.sample(items)
    assert len(picked) == 6 and picked[0] == items[0] and picked[-1] == items[-1]


@pytest.mark.skipif(not hasattr(os, "RWF_NOWAIT"), reason="the probe needs preadv's RWF_NOWAIT (Linux)")
def test_the_prefetch_issues_nothing_on_a_warm_page_cache_and_everything_on_a_cold_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = on_disk(tmp_path / "model.onnx.data")
    (tmp_path / "manifest.json").write_text(
        json.dumps(
            {"default_backend": "onnx", "backends": {"onnx": {"files": [weights.name]}}, "files": {weights.name: {}}}
        )
    )
    env = {"WARMSTART_MODEL": str(tmp_path), "WARMSTART_PREFETCH": "model"}
    monkeypatch.setattr(prefetch, "_started", None)
    weights.read_bytes()
    job = prefetch.start(env)
    assert job is not None and not job._thread.is_alive() and job._thread.ident is None  # no thread at all
    assert job.report()["skipped"].startswith("page cache warm") and job.report()["mb"] == 0
    for _ in range(50):  # DONTNEED is the kernel's best effort (once, in a full CI run, it kept the pages)
        evict(weights)
        if not any(startrecord.resident(str(weights))):
            break
        time.sleep(0.02)
    else:
        pytest.fail(f"the kernel kept {weights}'s pages through 50 DONTNEEDs: the cold case cannot be set up")
    monkeypatch.setattr(prefetch, "_started", None)
    job = prefetch.start(env)
    assert job is not None
    job._thread.join(10)
    assert "skipped" not in job.report() and job.report()["mb"] == 1.0


def test_the_prefetch_thread_skips_what_the_hook_issued(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, startfiles.ISSUED, True, raising=False)
    job = prefetch.Prefetch([], "all", "onnx")
    assert job._code() == [] and job.code_source == "recorded, issued at interpreter start"
