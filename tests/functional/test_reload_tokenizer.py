"""A reload to a version whose tokenizer file is unchanged (same SHA-256 in its manifest, same truncation and
pad id) reuses the loaded version's parsed tokenizer; a changed file or setting gets its own; the shared one
goes when the last version using it is freed."""

from __future__ import annotations

import gc
import json
import time
import weakref
from pathlib import Path

import pytest

from handler.core.config import Config
from handler.core.manifest import MANIFEST_NAME, sha256_file
from handler.runtime.invocation import Runtime
from handler.tasks.tokens import TextEncoder, shared_encoder
from tests.model_versions import write_version


def start(model_dir: Path) -> Runtime:
    env = {"WARMSTART_MODEL": str(model_dir), "WARMSTART_WARMUP": "0"}
    return Runtime.start(Config.from_environ(env), environ=env, emit=None)


def encoder_of(rt: Runtime) -> TextEncoder:
    encoder: TextEncoder = rt.registry.default.task.encoder  # type: ignore[attr-defined]
    return encoder


def edit_manifest(version: Path, **tokenizer: object) -> None:
    """Rewrite the manifest's tokenizer settings and the tokenizer file's listed size and SHA-256."""
    path = version / MANIFEST_NAME
    raw = json.loads(path.read_text())
    raw["tokenizer"].update(tokenizer)
    name = raw["tokenizer"]["file"]
    raw["files"][name] = {"size": (version / name).stat().st_size, "sha256": sha256_file(version / name)}
    path.write_text(json.dumps(raw, indent=2) + "\n")


def reload(rt: Runtime, version: Path) -> None:
    reply = rt.handle({"warmstart": "reload", "model": str(version), "wait": True})
    assert reply["ok"] and reply["changed"]


def test_a_reload_with_the_same_tokenizer_sha_reuses_the_parsed_tokenizer(model_dir: Path, tmp_path: Path) -> None:
    rt = start(model_dir)
    before = encoder_of(rt)
    same = write_version(model_dir, tmp_path / "same", "0.2.0")  # a copy: the same bytes, the same SHA-256
    reload(rt, same)
    assert rt.registry.default_key.endswith("@0.2.0")
    assert encoder_of(rt) is before
    assert rt.handle({"inputs": ["still tokenizes"]})["usage"]["tokens"] > 0


def test_a_different_tokenizer_sha_gets_its_own(model_dir: Path, tmp_path: Path) -> None:
    rt = start(model_dir)
    before = encoder_of(rt)
    changed = write_version(model_dir, tmp_path / "changed", "0.2.0")
    tok = changed / "tokenizer.json"
    tok.write_text(json.dumps(json.loads(tok.read_text()), indent=1))  # the same tokenizer, other bytes
    edit_manifest(changed)
    reload(rt, changed)
    assert encoder_of(rt) is not before
    assert rt.handle({"inputs": ["still tokenizes"]})["usage"]["tokens"] > 0


def test_other_truncation_gets_its_own(model_dir: Path, tmp_path: Path) -> None:
    rt = start(model_dir)
    before = encoder_of(rt)
    shorter = write_version(model_dir, tmp_path / "shorter", "0.2.0")
    edit_manifest(shorter, truncation=16)
    reload(rt, shorter)
    after = encoder_of(rt)
    assert after is not before and (after.max_length, before.max_length) == (16, 256)
    assert rt.handle({"inputs": ["word " * 100]})["usage"]["tokens"] == 16
    reload(rt, write_version(model_dir, tmp_path / "back", "0.3.0"))
    assert encoder_of(rt) is before  # the first one's runtime still holds it: shared again


def test_the_shared_encoder_goes_with_the_last_model_using_it(model_dir: Path, tmp_path: Path) -> None:
    manifest = json.loads((model_dir / MANIFEST_NAME).read_text())
    sha = manifest["files"]["tokenizer.json"]["sha256"]
    # A key no runtime in this session holds (truncation 7): only this test's references keep it.
    first = shared_encoder(model_dir / "tokenizer.json", 7, 0, sha)
    assert shared_encoder(model_dir / "tokenizer.json", 7, 0, sha) is first
    assert shared_encoder(model_dir / "tokenizer.json", 7, 0, None) is not first  # unlisted: never shared
    gone = weakref.ref(first)
    del first
    gc.collect()
    assert gone() is None
    assert shared_encoder(model_dir / "tokenizer.json", 7, 0, sha).max_length == 7  # parsed again


@pytest.mark.parametrize("rounds", [4])
def test_swaps_back_and_forth_free_every_old_session(model_dir: Path, tmp_path: Path, rounds: int) -> None:
    rt = start(model_dir)
    shared = encoder_of(rt)
    other = write_version(model_dir, tmp_path / "v2", "0.2.0")
    backends = []
    for i in range(rounds):
        backends.append(weakref.ref(rt.registry.default.backend))
        reload(rt, [other, model_dir][i % 2])
    deadline = time.monotonic() + 30
    while any(b() is not None for b in backends) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    assert all(b() is None for b in backends)  # the sessions are freed; only the tokenizer is shared
    assert encoder_of(rt) is shared
