"""Hot reload of the embedding model through `Runtime.handle`: the admin event, damaged versions refused
while the old one serves, and swaps under load (threads hammering requests while versions swap back and
forth: no request fails, and each one's vectors are those of the version its `"model"` field names)."""

from __future__ import annotations

import gc
import itertools
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.core.config import Config
from handler.core.errors import ModelLoadError
from handler.runtime.invocation import Runtime
from tests.conftest import MODEL_KEY, invoke
from tests.model_versions import flip_byte, truncate, write_version

NEG_KEY = "all-minilm-l6-v2@0.2.0-neg"
TEXTS = [f"sentence {i}: " + "more words " * (i % 7) for i in range(12)]


@pytest.fixture(scope="module")
def negated(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_version(model_dir, tmp_path_factory.mktemp("versions") / "neg", "0.2.0-neg", negate=True)


@pytest.fixture
def runtime(model_dir: Path) -> Iterator[Runtime]:
    env = {"WARMSTART_MODEL": str(model_dir), "WARMSTART_WARMUP": "0"}
    yield Runtime.start(Config.from_environ(env), environ=env, emit=None)


def test_the_admin_event_swaps_the_default(runtime: Runtime, negated: Path) -> None:
    before = runtime.handle({"inputs": TEXTS[:2]})
    old_backend = weakref.ref(runtime.backend)
    reply = runtime.handle({"warmstart": "reload", "model": str(negated), "wait": True})
    gc.collect()
    assert old_backend() is None  # really unloaded: nothing keeps the replaced version's session alive
    assert (reply["old"], reply["new"], reply["default"], reply["verified_files"]) == (MODEL_KEY, NEG_KEY, NEG_KEY, 3)
    assert reply["phases_ms"]["sha256"] > 0 and reply["phases_ms"]["warmup"] > 0
    after = runtime.handle({"inputs": TEXTS[:2]})
    assert after["model"] == NEG_KEY
    np.testing.assert_allclose(after["embeddings"], np.negative(before["embeddings"]), atol=1e-5)
    assert runtime.handle({"warmer": True})["model"] == NEG_KEY


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_weights_file_is_refused_and_the_old_version_serves(
    runtime: Runtime, negated: Path, tmp_path: Path, damage: str
) -> None:
    bad = write_version(negated, tmp_path / "bad", "0.3.0")
    if damage == "flip":
        flip_byte(bad / "model.onnx.data")
    else:
        truncate(bad / "model.onnx.data")
    with pytest.raises(ModelLoadError, match="SHA-256" if damage == "flip" else "truncated") as info:
        runtime.handle({"warmstart": "reload", "model": str(bad)})
    assert "model.onnx.data" in str(info.value) and f"{MODEL_KEY} keeps serving" in str(info.value)
    assert runtime.handle({"inputs": ["still here"]})["model"] == MODEL_KEY
    status = runtime.handle({"warmstart": "status"})
    assert status["reload"]["last"]["ok"] is False and status["reload"]["last"]["error"]["type"] == "ModelLoadError"
    assert [m["key"] for m in status["models"]["loaded"]] == [MODEL_KEY] and status["models"]["retiring"] == []


def test_swaps_under_load_never_fail_or_mix_versions(runtime: Runtime, model_dir: Path, negated: Path) -> None:
    reference = {t: np.asarray(runtime.handle({"inputs": [t]})["embeddings"][0]) for t in TEXTS}
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: list[list[str]] = [[] for _ in range(6)]

    def client(n: int) -> None:
        i = n
        while not stop.is_set():
            text = TEXTS[i % len(TEXTS)]
            i += 1
            try:
                reply = runtime.handle({"inputs": [text]})
                key, vector = reply["model"], np.asarray(reply["embeddings"][0])
                assert key in (MODEL_KEY, NEG_KEY), key
                expected = -reference[text] if key == NEG_KEY else reference[text]
                np.testing.assert_allclose(vector, expected, atol=1e-5)  # computed by the version it names
                seen[n].append(key)
            except BaseException as e:
                errors.append(e)
                return

    threads = [threading.Thread(target=client, args=(n,)) for n in range(len(seen))]
    for t in threads:
        t.start()
    try:
        for target, key in ((negated, NEG_KEY), (model_dir, MODEL_KEY), (negated, NEG_KEY)):
            time.sleep(0.2)
            reply = runtime.handle({"warmstart": "reload", "model": str(target), "wait": True})
            assert reply["new"] == key and reply["changed"]
        time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors[:3]
    for keys in seen:
        assert keys, "every client got answers"
        # Each client's requests are sequential: the versions it saw change only at the swaps, never back.
        changes = sum(1 for a, b in itertools.pairwise(keys) if a != b)
        assert changes <= 3
    assert sum(len(k) for k in seen) > 30
    described = runtime.registry.describe()
    assert described["default"] == NEG_KEY and described["retiring"] == []
    assert [m["key"] for m in described["loaded"]] == [NEG_KEY] and described["retired"] == 3


def test_an_in_flight_request_finishes_on_the_old_version(runtime: Runtime, negated: Path) -> None:
    expected = invoke(runtime, {"inputs": ["in flight"]})["embeddings"]
    old_backend = runtime.backend
    real = {"run": old_backend.run}
    entered, release = threading.Event(), threading.Event()

    def slow_run(feeds: Any) -> Any:
        entered.set()
        assert release.wait(30)
        return real["run"](feeds)

    old_backend.run = slow_run  # type: ignore[method-assign]
    replies: list[Any] = []
    request = threading.Thread(target=lambda: replies.append(invoke(runtime, {"inputs": ["in flight"]})))
    request.start()
    assert entered.wait(30)
    reply = runtime.handle({"warmstart": "reload", "model": str(negated)})
    assert reply["new"] == NEG_KEY
    retiring = runtime.handle({"warmstart": "models"})["retiring"]
    assert [(m["key"], m["refs"]) for m in retiring] == [(MODEL_KEY, 1)]  # still resident: a request holds it
    assert runtime.handle({"inputs": ["in flight"]})["model"] == NEG_KEY  # new requests get the new one
    release.set()
    request.join(30)
    assert replies[0]["model"] == MODEL_KEY and replies[0]["embeddings"] == expected
    models = runtime.handle({"warmstart": "models"})
    assert models["retiring"] == [] and any(f"unloaded {MODEL_KEY}" in e for e in models["events"])
    gone = weakref.ref(old_backend)
    real.clear()
    del old_backend, slow_run
    deadline = time.monotonic() + 30  # freed by the reloader's helper thread, not by the request's thread
    while gone() is not None and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    assert gone() is None
