"""Hot reload with small real models (two versions of a tiny ONNX graph, different weights): the swap and
its report, corrupt and truncated files refused with the old version still serving, one reload at a time,
the S3 pointer (a fake reader, then moto with part A's fetcher) and the timer thread's snapshot hooks."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.core.config import Config
from handler.core.errors import ModelLoadError
from handler.models.admin import ReloadInProgressError
from handler.models.origins import ModelSources
from handler.models.watcher import Watcher
from handler.runtime.invocation import Runtime
from tests.conftest import write_tiny_onnx
from tests.model_versions import flip_byte, truncate
from tests.unit.test_manifest import nest

X = [[1.0, 2.0, 3.0], [0.5, -1.0, 0.0]]
K = [1, 2]


class Version:
    def __init__(self, root: Path, version: str, seed: int) -> None:
        from infra.pack import pack_onnx

        root.mkdir(parents=True, exist_ok=True)
        self.w, self.b = write_tiny_onnx(root / f"tiny-{version}.onnx", 512, seed)  # W: 6 KB, external
        self.dir = pack_onnx(root / f"tiny-{version}.onnx", root / f"tiny-{version}", "tiny", version)
        self.key = f"tiny@{version}"

    def expected(self) -> Any:
        return np.asarray(X, np.float32) @ self.w + self.b

    def copy(self, dst: Path) -> Path:
        return Path(shutil.copytree(self.dir, dst))


def list_file(model: Path, name: str) -> None:
    """List one more file in the manifest, sized like what `model / name` is (the directory itself for "")."""
    raw = json.loads((model / "manifest.json").read_text())
    size = model.stat().st_size if name == "" else 0
    raw["files"][name] = {"size": size, "sha256": "0" * 64}
    (model / "manifest.json").write_text(json.dumps(raw))


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Version]:
    root = tmp_path_factory.mktemp("tiny-versions")
    return {v: Version(root, v, seed) for v, seed in (("1.0", 0), ("2.0", 1), ("3.0", 2))}


def start(model: Path, env: dict[str, str] | None = None, sources: ModelSources | None = None) -> Runtime:
    env = {"WARMSTART_MODEL": str(model), **(env or {})}
    return Runtime.start(Config.from_environ(env), environ=env, emit=None, sources=sources)


def infer(rt: Runtime, model: str | None = None) -> dict[str, Any]:
    payload: dict[str, Any] = {"inputs": {"x": X, "k": K}}
    if model:
        payload["model"] = model
    out: dict[str, Any] = rt.handle(payload)
    return out


def served_by(rt: Runtime, version: Version) -> None:
    reply = infer(rt)
    assert reply["model"] == version.key
    np.testing.assert_allclose(reply["outputs"]["y"], version.expected(), rtol=1e-6)


def test_a_reload_swaps_in_the_new_version_and_reports_it(versions: dict[str, Version]) -> None:
    v1, v2 = versions["1.0"], versions["2.0"]
    rt = start(v1.dir)
    served_by(rt, v1)
    reply = rt.handle({"warmstart": "reload", "model": str(v2.dir), "wait": True})
    assert (reply["ok"], reply["changed"], reply["old"], reply["new"], reply["default"]) == (
        True,
        True,
        v1.key,
        v2.key,
        v2.key,
    )
    assert reply["verified_files"] == 2  # model.onnx and model.onnx.data, whatever WARMSTART_VERIFY_SHA256 says
    assert {"fetch", "manifest", "sha256", "session", "warmup", "swap"} <= set(reply["phases_ms"])
    served_by(rt, v2)
    models = rt.handle({"warmstart": "models"})
    assert [m["key"] for m in models["loaded"]] == [v2.key] and models["retiring"] == []
    assert models["reload"]["last"]["new"] == v2.key
    assert rt.status()["model"] == v2.key and rt.ping({}, None, False, 1)["model"] == v2.key


def test_reloading_the_serving_version_changes_nothing(versions: dict[str, Version]) -> None:
    rt = start(versions["1.0"].dir)
    reply = rt.reloader.reload(str(versions["1.0"].dir))
    assert (reply["changed"], reply["old"], reply["new"]) == (False, "tiny@1.0", "tiny@1.0")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: flip_byte(d / "model.onnx.data"), "SHA-256 .* does not match"),
        (lambda d: flip_byte(d / "model.onnx", 10), "SHA-256 .* does not match"),
        (lambda d: truncate(d / "model.onnx.data", 8), "truncated or replaced"),
        (lambda d: (d / "model.onnx").unlink(), "listed in the manifest but missing"),
        (lambda d: (d / "manifest.json").write_text("{"), "not valid JSON"),
        (lambda d: list_file(d, ""), "files entry '': an empty file name"),
        (lambda d: list_file(d, "model\x00.onnx"), "files entry 'model\\\\x00.onnx': the name holds a NUL byte"),
        (lambda d: nest(d, 100_000), "not valid JSON \\(nested more than"),
    ],
    ids=[
        "flipped-data-byte",
        "flipped-graph-byte",
        "truncated",
        "missing-file",
        "bad-manifest",
        "empty-name",
        "nul",
        "nested-past-the-recursion-limit",
    ],
)
def test_a_damaged_version_is_refused_and_the_old_one_keeps_serving(
    versions: dict[str, Version], tmp_path: Path, damage: Any, message: str
) -> None:
    v1 = versions["1.0"]
    rt = start(v1.dir)
    bad = versions["2.0"].copy(tmp_path / "bad")
    damage(bad)
    with pytest.raises(ModelLoadError, match=message) as info:
        rt.handle({"warmstart": "reload", "model": str(bad)})
    assert f"{v1.key} keeps serving" in str(info.value)
    served_by(rt, v1)
    last = rt.status()["reload"]["last"]
    assert last["ok"] is False and last["error"]["type"] == "ModelLoadError" and last["serving"] == v1.key
    assert rt.registry.describe()["resident_mb"] == rt.registry.describe()["loaded"][0]["weights_mb"]


def test_a_bad_admin_event_is_an_invalid_input(versions: dict[str, Version]) -> None:
    from handler.core.errors import InvalidInputError

    rt = start(versions["1.0"].dir)
    with pytest.raises(InvalidInputError, match='needs "model"'):
        rt.handle({"warmstart": "reload"})
    with pytest.raises(InvalidInputError, match='"wait" must be'):
        rt.handle({"warmstart": "reload", "model": "/x", "wait": "yes"})


class GatedFetch:
    """A fetcher that maps s3 URIs to local dirs, and holds a URI until released."""

    def __init__(self, dirs: dict[str, Path]) -> None:
        self.dirs = dirs
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.calls: list[str] = []

    def __call__(self, uri: str, **kwargs: Any) -> Path:
        self.calls.append(uri)
        if "slow" in uri:
            self.entered.set()
            assert self.gate.wait(10)
        return self.dirs[uri]


def test_one_reload_at_a_time_and_wait_false_answers_at_once(versions: dict[str, Version]) -> None:
    fetch = GatedFetch({"s3://b/slow/": versions["2.0"].dir})
    rt = start(versions["1.0"].dir, sources=ModelSources(fetch=fetch))
    accepted = rt.handle({"warmstart": "reload", "model": "s3://b/slow/", "wait": False})
    assert accepted == {"warmstart": "reload", "accepted": True, "source": "s3://b/slow/", "serving": "tiny@1.0"}
    assert fetch.entered.wait(10)
    with pytest.raises(ReloadInProgressError, match="s3://b/slow/"):
        rt.handle({"warmstart": "reload", "model": str(versions["3.0"].dir)})
    assert rt.status()["reload"]["running"] == "s3://b/slow/"
    served_by(rt, versions["1.0"])  # requests go on meanwhile
    fetch.gate.set()
    deadline = time.monotonic() + 30
    while rt.reloader.last is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rt.reloader.last is not None and rt.reloader.last["new"] == "tiny@2.0"
    served_by(rt, versions["2.0"])


def test_an_expired_wait_answers_pending_and_the_reload_goes_on(versions: dict[str, Version]) -> None:
    fetch = GatedFetch({"s3://b/slow/": versions["2.0"].dir})
    rt = start(versions["1.0"].dir, sources=ModelSources(fetch=fetch))
    reply = rt.reloader.reload("s3://b/slow/", wait=True, timeout=0.05)
    assert reply["pending"] is True and reply["serving"] == "tiny@1.0"
    fetch.gate.set()
    deadline = time.monotonic() + 30
    while rt.registry.default_key != "tiny@2.0" and time.monotonic() < deadline:
        time.sleep(0.01)
    served_by(rt, versions["2.0"])


class FakePointer:
    def __init__(self, target: str) -> None:
        self.target, self.etag, self.reads = target, '"1"', 0

    def set(self, target: str) -> None:
        self.target, self.etag = target, f'"{int(self.etag.strip(chr(34))) + 1}"'

    def __call__(self, uri: str) -> tuple[str, str]:
        self.reads += 1
        return self.target, self.etag


@pytest.fixture
def pointed(versions: dict[str, Version], tmp_path: Path) -> Iterator[tuple[Runtime, FakePointer, GatedFetch]]:
    bad = versions["3.0"].copy(tmp_path / "bad")
    flip_byte(bad / "model.onnx.data")
    dirs = {f"s3://b/tiny/{v}/": versions[v].dir for v in versions} | {"s3://b/tiny/bad/": bad}
    fetch, pointer = GatedFetch(dirs), FakePointer("s3://b/tiny/1.0/")
    env = {"WARMSTART_MODEL_POINTER": "s3://b/tiny/CURRENT", "WARMSTART_POINTER_CHECK_S": "3600"}
    rt = Runtime.start(Config.from_environ(env), environ=env, emit=None, sources=ModelSources(fetch, pointer))
    assert rt.watcher is not None
    yield rt, pointer, fetch
    rt.watcher.stop()


def test_the_pointer_chooses_the_model_at_init_and_a_change_reloads(
    pointed: tuple[Runtime, FakePointer, GatedFetch], versions: dict[str, Version]
) -> None:
    rt, pointer, fetch = pointed
    assert rt.watcher is not None
    served_by(rt, versions["1.0"])
    assert rt.init_report["phases_ms"]["fetch"] >= 0 and fetch.calls == ["s3://b/tiny/1.0/"]
    rt.watcher.tick(check_pointer=True)  # unchanged ETag: nothing fetched
    assert fetch.calls == ["s3://b/tiny/1.0/"] and pointer.reads == 2
    pointer.set("s3://b/tiny/2.0/")
    rt.watcher.tick(check_pointer=True)
    served_by(rt, versions["2.0"])
    assert rt.status()["reload"]["pointer"]["etag"] == pointer.etag


def test_a_bad_pointer_target_is_refused_once_and_not_retried_until_the_pointer_moves(
    pointed: tuple[Runtime, FakePointer, GatedFetch], versions: dict[str, Version]
) -> None:
    rt, pointer, fetch = pointed
    assert rt.watcher is not None
    pointer.set("s3://b/tiny/bad/")
    rt.watcher.tick(check_pointer=True)
    assert rt.watcher.errors == 1 and rt.reloader.last is not None and rt.reloader.last["ok"] is False
    served_by(rt, versions["1.0"])
    rt.watcher.tick(check_pointer=True)
    assert fetch.calls.count("s3://b/tiny/bad/") == 1
    pointer.set("s3://b/tiny/3.0/")
    rt.watcher.tick(check_pointer=True)
    served_by(rt, versions["3.0"])


def test_the_watcher_stops_before_a_snapshot_and_checks_at_once_after_restore(
    pointed: tuple[Runtime, FakePointer, GatedFetch], versions: dict[str, Version]
) -> None:
    rt, pointer, _ = pointed
    watcher = rt.watcher
    assert watcher is not None
    names = {t.name for t in threading.enumerate()}
    assert "warmstart-models" in names
    assert watcher.before_snapshot() == ["models-watcher"]
    assert "warmstart-models" not in {t.name for t in threading.enumerate()}
    pointer.set("s3://b/tiny/2.0/")  # moved while the snapshot sat in storage
    assert watcher.after_restore() == ["models-watcher"]
    deadline = time.monotonic() + 30
    while rt.registry.default_key != "tiny@2.0" and time.monotonic() < deadline:
        time.sleep(0.01)
    served_by(rt, versions["2.0"])


def test_no_watcher_thread_without_pointer_or_idle_unload(versions: dict[str, Version]) -> None:
    rt = start(versions["1.0"].dir)
    assert rt.watcher is None
    assert not Watcher.wanted(rt.config)


def test_an_explicit_model_wins_over_the_pointer_which_is_then_watched(versions: dict[str, Version]) -> None:
    fetch = GatedFetch({"s3://b/tiny/2.0/": versions["2.0"].dir})
    pointer = FakePointer("s3://b/tiny/2.0/")
    env = {"WARMSTART_MODEL_POINTER": "s3://b/tiny/CURRENT", "WARMSTART_POINTER_CHECK_S": "3600"}
    rt = start(versions["1.0"].dir, env, ModelSources(fetch, pointer))
    assert rt.watcher is not None
    try:
        deadline = time.monotonic() + 30  # the first check runs on the thread at once: the pointer differs
        while rt.registry.default_key != "tiny@2.0" and time.monotonic() < deadline:
            time.sleep(0.01)
        served_by(rt, versions["2.0"])
    finally:
        rt.watcher.stop()


def test_idle_unload_runs_on_the_watcher(versions: dict[str, Version]) -> None:
    env = {"WARMSTART_MODELS": str(versions["2.0"].dir), "WARMSTART_IDLE_UNLOAD_S": "1"}
    rt = start(versions["1.0"].dir, env)
    assert rt.watcher is not None
    try:
        assert infer(rt, "tiny@2.0")["model"] == "tiny@2.0"
        deadline = time.monotonic() + 30
        while rt.registry.describe()["idle_unloads"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rt.registry.describe()["available"] == ["tiny@2.0"]
        assert infer(rt, "tiny@2.0")["model"] == "tiny@2.0"  # loaded again on demand
    finally:
        rt.watcher.stop()


# -- with moto and part A's fetcher -----------------------------------------------------------------------


def _upload(s3: Any, bucket: str, prefix: str, model: Path) -> None:
    for path in sorted(model.iterdir()):
        s3.put_object(Bucket=bucket, Key=f"{prefix}{path.name}", Body=path.read_bytes())


def test_s3_pointer_reload_with_moto(
    versions: dict[str, Version], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    from handler.models import s3fetch

    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    s3fetch.drop_clients()
    with moto.mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="models")
        for v in ("1.0", "2.0"):
            _upload(s3, "models", f"tiny/{v}/", versions[v].dir)
        s3.put_object(Bucket="models", Key="tiny/CURRENT", Body=b"1.0/")
        env = {
            "WARMSTART_MODEL_POINTER": "s3://models/tiny/CURRENT",
            "WARMSTART_POINTER_CHECK_S": "3600",
            "WARMSTART_CACHE_DIR": str(tmp_path / "cache"),
        }
        rt = Runtime.start(Config.from_environ(env), environ=env, emit=None)
        assert rt.watcher is not None
        try:
            served_by(rt, versions["1.0"])
            assert rt.registry.describe()["loaded"][0]["source"] == "s3://models/tiny/1.0/"
            s3.put_object(Bucket="models", Key="tiny/CURRENT", Body=b"2.0/")
            rt.watcher.tick(check_pointer=True)
            served_by(rt, versions["2.0"])
            last = rt.status()["reload"]["last"]
            assert (last["old"], last["new"], last["source"]) == ("tiny@1.0", "tiny@2.0", "s3://models/tiny/2.0/")
            # An admin reload straight from an s3:// URI, back to 1.0 (already in the cache).
            reply = rt.handle({"warmstart": "reload", "model": "s3://models/tiny/1.0/"})
            assert reply["new"] == "tiny@1.0" and reply["verified_files"] == 2
            served_by(rt, versions["1.0"])
        finally:
            rt.watcher.stop()
            s3fetch.drop_clients()


def test_s3_reloads_prune_the_cache_to_what_is_served(
    versions: dict[str, Version], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue: each reload from S3 left its version in the cache, so on a small /tmp the third fetch failed
    with InsufficientStorageError. Here /tmp holds two versions and a half (plus the fetch's margin): reloads
    go on indefinitely, the cache holds what is served, and status says so."""
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    from handler.models import s3fetch

    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    cache = tmp_path / "cache"
    size = sum(f.stat().st_size for f in versions["1.0"].dir.iterdir())
    capacity = s3fetch.SPACE_MARGIN + size * 5 // 2

    def disk_usage(path: Any) -> Any:
        used = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
        return shutil._ntuple_diskusage(capacity, used, capacity - used)  # type: ignore[attr-defined]

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    s3fetch.drop_clients()
    with moto.mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="models")
        for v in ("1.0", "2.0", "3.0"):
            _upload(s3, "models", f"tiny/{v}/", versions[v].dir)
        env = {"WARMSTART_MODEL": "s3://models/tiny/1.0/", "WARMSTART_CACHE_DIR": str(cache)}
        rt = Runtime.start(Config.from_environ(env), environ=env, emit=None)
        try:
            held = []
            for v in ("2.0", "3.0", "1.0", "2.0"):  # before: the second failed (2.5 versions fit)
                reply = rt.handle({"warmstart": "reload", "model": f"s3://models/tiny/{v}/"})
                assert reply["new"] == f"tiny@{v}"
                served_by(rt, versions[v])
                held.append(sorted(p.name.split("-")[0] for p in cache.iterdir() if not p.name.startswith(".")))
            assert held == [["tiny@2.0"], ["tiny@3.0"], ["tiny@1.0"], ["tiny@2.0"]]
            (report,) = rt.status()["cache"]
            assert [(m["source"], m["held"]) for m in report["models"]] == [("s3://models/tiny/2.0/", True)]
            assert report["pruned"] == 4 and report["dir"] == str(cache) and report["partial_mb"] == 0
        finally:
            s3fetch.drop_clients()


def test_a_reload_that_cannot_fit_the_budget_is_refused(tmp_path: Path) -> None:
    from handler.models.registry import ModelBudgetError
    from infra.pack import pack_onnx

    dirs = []
    for version, seed in (("1.0", 0), ("2.0", 1)):
        write_tiny_onnx(tmp_path / f"big-{version}.onnx", 60_000, seed)  # ~0.96 MB of weights: one fits 1 MB
        dirs.append(pack_onnx(tmp_path / f"big-{version}.onnx", tmp_path / f"big-{version}", "big", version))
    rt = start(dirs[0], {"WARMSTART_MODEL_BUDGET_MB": "1"})
    with pytest.raises(ModelBudgetError, match=r"big@2\.0 needs 0\.9 MB.*big@1\.0 0\.9 MB \(0 in use\)") as info:
        rt.handle({"warmstart": "reload", "model": str(dirs[1])})
    assert "big@1.0 keeps serving" in str(info.value)
    assert rt.handle({"inputs": {"x": X, "k": K}})["model"] == "big@1.0"
    assert rt.registry.describe()["resident_mb"] == 0.9  # the refused reservation was given back


def test_a_paced_hash_steps_aside_while_requests_run_and_still_catches_corruption(
    versions: dict[str, Version], tmp_path: Path
) -> None:
    from handler.core.manifest import load_manifest
    from handler.models.loader import verify_paced

    bad = versions["2.0"].copy(tmp_path / "bad")
    manifest = load_manifest(bad)
    checks: list[bool] = []

    def busy() -> bool:
        checks.append(True)
        return True

    t0 = time.perf_counter()
    verify_paced(manifest, list(manifest.files), busy, chunk=1024, pause_s=0.002)
    assert len(checks) >= 6 and time.perf_counter() - t0 >= 0.002 * len(checks)  # paused after each chunk
    flip_byte(bad / "model.onnx.data")
    with pytest.raises(ModelLoadError, match=r"model\.onnx\.data: SHA-256 .* does not match"):
        verify_paced(load_manifest(bad), ["model.onnx.data"], lambda: False)


def test_a_fork_snapshot_template_loads_extra_models_only_on_first_use(
    versions: dict[str, Version], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # what fork mode sets; undone after the test
    env = {
        "WARMSTART_MODELS": str(versions["2.0"].dir),
        "AWS_LAMBDA_INITIALIZATION_TYPE": "snap-start",
        "WARMSTART_SNAPSHOT": "fork",
    }
    rt = start(versions["1.0"].dir, env)
    assert rt.registry.describe()["available"] == ["tiny@2.0"]  # no second session (thread pool) in the template
    assert infer(rt, "tiny@2.0")["model"] == "tiny@2.0"
