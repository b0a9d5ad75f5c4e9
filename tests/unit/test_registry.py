"""The registry: keys, leases, LRU eviction under the memory budget, idle unload, the atomic swap.

Models here are stand-ins (a manifest on disk whose weight files are sparse, a task that echoes its key), so
every policy is tested without ONNX Runtime, and with a clock the test moves.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from handler.backends.pool import BufferPool
from handler.core.errors import ConfigError, InvalidInputError
from handler.core.manifest import load_manifest
from handler.models.loader import Loaded
from handler.models.registry import MB, ModelBudgetError, Registry, UnknownModelError, requested_model, weights_bytes


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class EchoTask:
    name = "tensor"

    def __init__(self, key: str) -> None:
        self.model = key

    def __call__(self, payload: Any) -> dict[str, Any]:
        return {"model": self.model}

    def warmup(self) -> None:
        pass


class StubBackend:
    name = "onnx"


def fake_model(root: Path, model_id: str, version: str, mb: int) -> Path:
    """A packed-model directory that load_manifest accepts: one sparse weights file of `mb` MB."""
    path = root / f"{model_id}-{version}"
    path.mkdir()
    with (path / "w.bin").open("wb") as f:
        f.truncate(mb * MB)
    manifest = {
        "format": "warmstart-packed-model",
        "format_version": 1,
        "id": model_id,
        "version": version,
        "task": "tensor",
        "default_backend": "onnx",
        "backends": {"onnx": {"model": "w.bin", "files": ["w.bin"]}},
        "files": {"w.bin": {"size": mb * MB, "sha256": "0" * 64}},
        "inputs": [],
        "outputs": [],
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def fake_load(path: Path) -> Loaded:
    manifest = load_manifest(path)
    return Loaded(manifest, StubBackend(), EchoTask(manifest.key), BufferPool(), 1, {}, weights_bytes(manifest, None))


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make(tmp_path: Path, clock: Clock, budget_mb: int = 0, idle_s: int = 0) -> tuple[Registry, list[str]]:
    loads: list[str] = []

    def load(path: Path) -> Loaded:
        loads.append(path.name)
        return fake_load(path)

    default = fake_load(fake_model(tmp_path, "base", "1", 10))
    registry = Registry(default, "base-dir", load=load, budget_mb=budget_mb, idle_unload_s=idle_s, clock=clock)
    return registry, loads


def test_default_and_named_leases_count_references(tmp_path: Path, clock: Clock) -> None:
    registry, _ = make(tmp_path, clock)
    registry.add("extra", fake_model(tmp_path, "extra", "2", 5))
    with registry.lease() as a, registry.lease("extra@2") as b, registry.lease("extra") as c:
        assert (a.key, b.key, c.key) == ("base@1", "extra@2", "extra@2")
        refs = {m["key"]: m["refs"] for m in registry.describe()["loaded"]}
        assert refs == {"base@1": 1, "extra@2": 2} and registry.in_flight == 3
    refs = {m["key"]: (m["refs"], m["served"]) for m in registry.describe()["loaded"]}
    assert refs == {"base@1": (0, 1), "extra@2": (0, 2)}


def test_a_lease_is_released_when_the_request_fails(tmp_path: Path, clock: Clock) -> None:
    registry, _ = make(tmp_path, clock)
    with pytest.raises(ZeroDivisionError), registry.lease():
        _ = 1 / 0
    assert registry.describe()["loaded"][0]["refs"] == 0


def test_unknown_model_is_a_404_listing_what_is_served(tmp_path: Path, clock: Clock) -> None:
    registry, _ = make(tmp_path, clock, budget_mb=12)
    registry.add("extra", fake_model(tmp_path, "extra", "2", 5))  # over budget: catalogued, not loaded
    with pytest.raises(UnknownModelError) as info, registry.lease("nope@1"):
        pass
    assert info.value.status == 404
    assert "loaded: base@1" in str(info.value) and "loaded on demand: extra@2" in str(info.value)
    assert info.value.to_body()["error"]["type"] == "UnknownModelError"


def test_an_id_with_two_versions_is_ambiguous(tmp_path: Path, clock: Clock) -> None:
    registry, _ = make(tmp_path, clock)
    registry.add("a", fake_model(tmp_path, "x", "1", 1))
    registry.add("b", fake_model(tmp_path, "x", "2", 1))
    with pytest.raises(UnknownModelError, match=r"ambiguous.*x@1, x@2"), registry.lease("x"):
        pass


def test_the_same_key_twice_is_a_config_error(tmp_path: Path, clock: Clock) -> None:
    registry, _ = make(tmp_path, clock)
    with pytest.raises(ConfigError, match="configured twice"):
        registry.add("again", tmp_path / "base-1")


@pytest.mark.parametrize("value", [3, "", ["a@1"], {"id": "a"}])
def test_model_field_must_be_a_non_empty_string(value: Any) -> None:
    with pytest.raises(InvalidInputError, match='"model" must be'):
        requested_model({"inputs": ["x"], "model": value})
    assert requested_model({"inputs": ["x"]}) is None
    assert requested_model({"inputs": ["x"], "model": None}) is None
    assert requested_model(["not", "a", "dict"]) is None


def test_lru_eviction_under_the_budget_never_evicts_leased_or_default(tmp_path: Path, clock: Clock) -> None:
    registry, loads = make(tmp_path, clock, budget_mb=30)
    for name in ("a", "b"):
        registry.add(name, fake_model(tmp_path, name, "1", 10))  # base 10 + a 10 + b 10 = 30: all fit
    registry.add("c", fake_model(tmp_path, "c", "1", 10))  # does not fit without evicting: on demand
    assert registry.describe()["available"] == ["c@1"]
    clock.now += 1
    with registry.lease("a@1"):
        pass  # a used more recently than b
    clock.now += 1
    with registry.lease("c@1") as c:  # b is the least recently used idle non-default: evicted
        assert c.key == "c@1"
    described = registry.describe()
    assert [m["key"] for m in described["loaded"]] == ["a@1", "base@1", "c@1"]
    assert described["evictions"] == 1 and "evicted b@1" in described["events"][-1]
    # Everything but the default leased: no room for b, and a typed error says who holds what.
    with registry.lease("a@1"), registry.lease("c@1"):
        with pytest.raises(ModelBudgetError) as info, registry.lease("b@1"):
            pass
        assert info.value.status == 503 and "a@1 10.0 MB (1 in use)" in str(info.value)
    assert loads.count("b-1") == 1  # the refused load never started
    with registry.lease("b@1") as b:  # once they are idle, the LRU one makes room
        assert b.key == "b@1"
    assert registry.describe()["resident_mb"] <= 30


def test_a_model_bigger_than_the_budget_is_refused(tmp_path: Path, clock: Clock) -> None:
    registry, _ = make(tmp_path, clock, budget_mb=20)
    registry.add("big", fake_model(tmp_path, "big", "1", 50))
    with pytest.raises(ModelBudgetError, match=r"big@1 needs 50\.0 MB"), registry.lease("big@1"):
        pass
    assert registry.describe()["resident_mb"] == 10.0  # the reservation was given back


def test_idle_models_are_unloaded_and_come_back_on_demand(tmp_path: Path, clock: Clock) -> None:
    registry, loads = make(tmp_path, clock, idle_s=60)
    registry.add("extra", fake_model(tmp_path, "extra", "1", 5))
    clock.now += 59
    assert registry.sweep_idle() == []
    with registry.lease("extra@1"):
        clock.now += 120
        assert registry.sweep_idle() == []  # in use: never unloaded
    clock.now += 60
    assert registry.sweep_idle() == ["extra@1"]  # the default is idle too, but never unloaded
    assert registry.describe()["available"] == ["extra@1"]
    with registry.lease("extra@1") as m:
        assert m.key == "extra@1"
    assert loads == ["extra-1", "extra-1"]


def test_install_swaps_atomically_and_the_old_version_outlives_its_leases(tmp_path: Path, clock: Clock) -> None:
    registry, _ = make(tmp_path, clock)
    new = fake_load(fake_model(tmp_path, "base", "2", 10))
    with registry.lease() as old:
        assert registry.install(new, "v2-dir", "base@1", make_default=False) == "base@1"
        assert registry.default_key == "base@2"  # replacing the default makes the new one the default
        with registry.lease() as after:
            assert (old.key, after.key) == ("base@1", "base@2")
        described = registry.describe()
        assert [(m["key"], m["refs"]) for m in described["retiring"]] == [("base@1", 1)]
        assert described["resident_mb"] == 20.0  # both resident during the overlap
        with pytest.raises(UnknownModelError), registry.lease("base@1"):
            pass  # retired: no new request gets it
    described = registry.describe()
    assert described["retiring"] == [] and described["resident_mb"] == 10.0
    assert "unloaded base@1" in described["events"][-1]


def test_concurrent_leases_balance(tmp_path: Path, clock: Clock) -> None:
    registry, _ = make(tmp_path, clock)
    registry.add("extra", fake_model(tmp_path, "extra", "1", 1))

    def hammer(name: str | None) -> None:
        for _ in range(2000):
            with registry.lease(name):
                pass

    threads = [threading.Thread(target=hammer, args=(n,)) for n in (None, "extra@1") * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    loaded = {m["key"]: (m["refs"], m["served"]) for m in registry.describe()["loaded"]}
    assert loaded == {"base@1": (0, 8000), "extra@1": (0, 8000)}
    assert registry.in_flight == 0


@pytest.mark.parametrize("name", ["m", "m@1"])
def test_a_load_that_loses_the_race_with_a_reload_is_not_published(tmp_path: Path, clock: Clock, name: str) -> None:
    """A request starts loading m@1 on demand; a reload installs m@2 in its place before the load ends. The
    request is answered by m@2, m@1 never becomes resident, and the id stays unambiguous."""
    started, finish = threading.Event(), threading.Event()
    v1, v2 = fake_model(tmp_path, "m", "1", 1), fake_model(tmp_path, "m", "2", 1)

    def slow_load(path: Path) -> Loaded:
        if path == v1:
            started.set()
            assert finish.wait(5)
        return fake_load(path)

    registry = Registry(fake_load(fake_model(tmp_path, "base", "1", 1)), "base", load=slow_load, clock=clock)
    registry.add("m-dir", v1, load_now=False)
    answers: list[str] = []

    def request() -> None:
        with registry.lease(name) as model:
            answers.append(model.key)

    thread = threading.Thread(target=request)
    thread.start()
    assert started.wait(5)
    assert registry.install(fake_load(v2), "m2-dir", replaces="m@1", make_default=False) == "m@1"
    finish.set()
    thread.join(5)
    assert answers == ["m@2"]
    described = registry.describe()
    assert [m["key"] for m in described["loaded"]] == ["base@1", "m@2"]
    assert described["available"] == [] and described["in_flight"] == 0
    assert "dropped m@1 loaded on demand" in described["events"][-1]
    with registry.lease("m") as model:
        assert model.key == "m@2"


def test_every_served_model_has_its_task_loaded_or_on_demand(tmp_path: Path, clock: Clock) -> None:
    """`GET /v1/models` and `POST /` name each served model's task, one not loaded yet too (from its manifest)."""
    registry, loads = make(tmp_path, clock, budget_mb=10)
    registry.add("later", fake_model(tmp_path, "later", "1", 10))  # over the budget: on demand
    assert registry.describe()["available"] == ["later@1"] and "later-1" not in loads
    tasks = registry.tasks()
    assert set(tasks) == {"base@1", "later@1"} and tasks["later@1"] == tasks["base@1"] and tasks["later@1"]
