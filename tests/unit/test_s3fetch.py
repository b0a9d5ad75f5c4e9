"""Packed models from S3 (moto): ranged parallel GETs, verification, reuse, resume, space, pointers."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import boto3  # type: ignore[import-untyped]
import numpy as np
import pytest
from moto import mock_aws

from handler.core.errors import ConfigError, InsufficientStorageError, ModelFetchError, ModelLoadError
from handler.core.manifest import load_manifest, sha256_file
from handler.models import s3fetch
from handler.models.s3fetch import drop_clients, fetch_model, parse_s3_uri, read_pointer
from handler.runtime.invocation import Runtime
from tests.conftest import DEFAULT_MODEL, ROOT
from tests.unit.test_manifest import nest

BUCKET = "warmstart-models"
PREFIX = "models/tiny/1.0/"
URI = f"s3://{BUCKET}/{PREFIX}"
PART = 64 * 1024
SIZES = {"model.onnx": 3_000, "model.onnx.data": 16 * PART + 123, "model.safetensors": 5 * PART, "tokenizer.json": 999}


class Model(NamedTuple):
    dir: Path
    files: dict[str, bytes]


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client
    drop_clients()


@pytest.fixture(scope="module", autouse=True)
def forget_s3fetch_afterwards() -> Iterator[None]:
    """Leave no `handler.models.s3fetch` in sys.modules for the tests after these: the runtime's snapshot hook
    treats "imported" as "a model came from S3" (tests/unit/test_snapshot.py counts what it released)."""
    yield
    drop_clients()
    sys.modules.pop("handler.models.s3fetch", None)
    vars(sys.modules["handler"]).pop("s3fetch", None)


def build_model(root: Path, seed: int = 0, sizes: dict[str, int] | None = None) -> Model:
    """A tiny packed model: the default model's manifest structure over random files."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    files = {name: rng.bytes(size) for name, size in (sizes or SIZES).items()}
    raw = json.loads((DEFAULT_MODEL / "manifest.json").read_text())
    raw.update(id="tiny", version="1.0", files={})
    for name, data in files.items():
        (root / name).write_bytes(data)
        raw["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (root / "manifest.json").write_text(json.dumps(raw, indent=2))
    return Model(root, files)


def upload(client: Any, model_dir: Path, prefix: str = PREFIX, names: list[str] | None = None) -> None:
    for path in sorted(model_dir.iterdir()):
        if names is None or path.name in names:
            client.upload_file(str(path), BUCKET, prefix + path.name)


@pytest.fixture
def tiny(s3: Any, tmp_path: Path) -> Model:
    model = build_model(tmp_path / "src")
    upload(s3, model.dir)
    return model


def published(cache: Path) -> list[Path]:
    return [p for p in cache.iterdir() if not p.name.startswith(".")] if cache.exists() else []


class Recorder:
    """Wraps a client: records each call (op, key, range) and can fail or tamper with ranged GETs."""

    def __init__(self, client: Any, fail_at: int | None = None, on_range: Callable[[int, Any], Any] | None = None):
        self.client, self.fail_at, self.on_range = client, fail_at, on_range
        self.calls: list[tuple[str, str, str | None]] = []
        self.ok_ranges: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def get_object(self, **kw: Any) -> Any:
        with self.lock:
            self.calls.append(("get", kw["Key"], kw.get("Range")))
            n = sum(1 for c in self.calls if c[2])
        if kw.get("Range") and self.fail_at is not None and n >= self.fail_at:
            raise RuntimeError("connection lost (test)")
        response = self.client.get_object(**kw)
        if kw.get("Range"):
            if self.on_range is not None:
                response = self.on_range(n, response)
            with self.lock:
                self.ok_ranges.append((kw["Key"], kw["Range"]))
        return response

    def head_object(self, **kw: Any) -> Any:
        with self.lock:
            self.calls.append(("head", kw["Key"], None))
        return self.client.head_object(**kw)

    def ranged(self) -> list[tuple[str, str, str | None]]:
        return [c for c in self.calls if c[0] == "get" and c[2]]


def fetch(client: Any, cache: Path, uri: str = URI, **kw: Any) -> Path:
    kw.setdefault("part_size", PART)
    kw.setdefault("workers", 4)
    return fetch_model(uri, cache_dir=cache, client=client, environ={}, **kw)


def test_round_trip_equals_the_local_files(tiny: Model, s3: Any, tmp_path: Path) -> None:
    out = fetch(s3, tmp_path / "cache")
    assert out.parent == tmp_path / "cache" and out.name.startswith("tiny@1.0-")
    manifest = load_manifest(out)
    assert set(manifest.files) == set(tiny.files)
    for name in tiny.files:
        assert sha256_file(out / name) == sha256_file(tiny.dir / name)
    assert not list(out.rglob("*.part")) and not list(out.rglob("*.fetch.json"))
    assert (out / "manifest.json").read_bytes() == (tiny.dir / "manifest.json").read_bytes()


def test_ranged_gets_split_each_file_into_parts(tiny: Model, s3: Any, tmp_path: Path) -> None:
    rec = Recorder(s3)
    fetch(rec, tmp_path / "cache")
    by_key: dict[str, list[tuple[int, int]]] = {}
    for _, key, rng in rec.ranged():
        assert rng is not None
        start, end = rng.removeprefix("bytes=").split("-")
        by_key.setdefault(key.removeprefix(PREFIX), []).append((int(start), int(end)))
    assert set(by_key) == set(SIZES)
    for name, size in SIZES.items():
        spans = sorted(by_key[name])
        assert len(spans) == -(-size // PART)  # model.onnx.data: 17 GETs
        assert spans[0][0] == 0 and spans[-1][1] == size - 1
        assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(spans))  # no gap, no overlap
    # manifest.json is the one whole-object GET
    assert [c[1] for c in rec.calls if c[0] == "get" and not c[2]] == [PREFIX + "manifest.json"]


def test_a_second_fetch_reuses_the_directory_without_gets(tiny: Model, s3: Any, tmp_path: Path) -> None:
    first = fetch(s3, tmp_path / "cache")
    rec = Recorder(s3)
    assert fetch(rec, tmp_path / "cache") == first
    assert rec.calls == [("head", PREFIX + "manifest.json", None)]  # the ETag check, no GET
    rec = Recorder(s3)
    assert fetch(rec, tmp_path / "cache", reuse_check="none") == first
    assert rec.calls == []
    assert fetch(s3, tmp_path / "cache", reuse_check="sha256") == first


def test_a_damaged_cached_copy_is_fetched_again(tiny: Model, s3: Any, tmp_path: Path) -> None:
    first = fetch(s3, tmp_path / "cache")
    with (first / "model.onnx.data").open("r+b") as f:
        f.truncate(100)
    rec = Recorder(s3)
    again = fetch(rec, tmp_path / "cache")
    assert rec.ranged()
    assert sha256_file(again / "model.onnx.data") == sha256_file(tiny.dir / "model.onnx.data")
    # same size, other bytes: only the sha256 check sees it
    with (again / "tokenizer.json").open("r+b") as f:
        f.write(b"X")
    assert fetch(s3, tmp_path / "cache", reuse_check="none") == again  # trusted as published
    healed = fetch(s3, tmp_path / "cache", reuse_check="sha256")
    assert sha256_file(healed / "tokenizer.json") == sha256_file(tiny.dir / "tokenizer.json")


def test_a_manifest_replaced_in_place_is_fetched_again(tiny: Model, s3: Any, tmp_path: Path) -> None:
    fetch(s3, tmp_path / "cache")
    new = build_model(tmp_path / "v2", seed=1)
    upload(s3, new.dir)
    out = fetch(s3, tmp_path / "cache")
    assert sha256_file(out / "model.onnx.data") == sha256_file(new.dir / "model.onnx.data")
    assert sha256_file(out / "model.onnx.data") != sha256_file(tiny.dir / "model.onnx.data")


def test_a_corrupted_object_is_rejected_and_nothing_published(tiny: Model, s3: Any, tmp_path: Path) -> None:
    bad = bytearray(tiny.files["model.onnx.data"])
    bad[PART * 3 + 7] ^= 0xFF  # same size, one byte flipped
    s3.put_object(Bucket=BUCKET, Key=PREFIX + "model.onnx.data", Body=bytes(bad))
    with pytest.raises(ModelFetchError) as info:
        fetch(s3, tmp_path / "cache")
    message = str(info.value)
    assert isinstance(info.value, ModelLoadError)
    assert "model.onnx.data" in message
    assert hashlib.sha256(bad).hexdigest() in message  # both digests, in full
    assert hashlib.sha256(tiny.files["model.onnx.data"]).hexdigest() in message
    assert published(tmp_path / "cache") == []
    assert not list((tmp_path / "cache").rglob("model.onnx.data*"))  # the bad partial is gone too


def test_a_truncated_object_is_rejected(tiny: Model, s3: Any, tmp_path: Path) -> None:
    s3.put_object(Bucket=BUCKET, Key=PREFIX + "model.safetensors", Body=tiny.files["model.safetensors"][:-1])
    with pytest.raises(ModelFetchError, match=rf"model.safetensors: the object is {5 * PART - 1} bytes, .* {5 * PART}"):
        fetch(s3, tmp_path / "cache")
    assert published(tmp_path / "cache") == []


def test_a_short_ranged_response_is_rejected(tiny: Model, s3: Any, tmp_path: Path) -> None:
    def cut(n: int, response: Any) -> Any:
        if n == 3:
            data = response["Body"].read()
            return {**response, "Body": io.BytesIO(data[:-10])}
        return response

    with pytest.raises(ModelFetchError, match="the response ended at byte"):
        fetch(Recorder(s3, on_range=cut), tmp_path / "cache", workers=1)
    assert published(tmp_path / "cache") == []


class ResponseStreamingError(Exception):
    """Named like botocore's: a body that breaks off half-way."""


class BrokenBody:
    def __init__(self, body: Any) -> None:
        self.body, self.reads = body, 0

    def read(self, amt: int | None = None) -> bytes:
        self.reads += 1
        if self.reads > 1:
            raise ResponseStreamingError("connection reset mid-body (test)")
        data: bytes = self.body.read(min(amt or 4096, 4096))
        return data


def test_a_body_that_breaks_off_is_retried_once_for_that_part(tiny: Model, s3: Any, tmp_path: Path) -> None:
    def breaks(n: int, response: Any) -> Any:
        return {**response, "Body": BrokenBody(response["Body"])} if n == 2 else response

    rec = Recorder(s3, on_range=breaks)
    out = fetch(rec, tmp_path / "cache", workers=1)
    ranges = [(k, r) for _, k, r in rec.ranged()]
    assert len(ranges) == sum(-(-size // PART) for size in SIZES.values()) + 1
    assert ranges[1] == ranges[2]  # the broken part, asked again
    for name in SIZES:
        assert sha256_file(out / name) == sha256_file(tiny.dir / name)


def test_an_interrupted_download_resumes_with_only_the_missing_parts(tiny: Model, s3: Any, tmp_path: Path) -> None:
    total = sum(-(-size // PART) for size in SIZES.values())
    first = Recorder(s3, fail_at=10)
    with pytest.raises(ModelFetchError, match="connection lost"):
        fetch(first, tmp_path / "cache", workers=2)
    assert published(tmp_path / "cache") == []
    done = len(first.ok_ranges)
    assert 0 < done < total
    second = Recorder(s3)
    out = fetch(second, tmp_path / "cache", workers=2)
    assert len(second.ranged()) == total - done
    assert not {(k, r) for _, k, r in second.ranged()} & {(k, r) for k, r in first.ok_ranges}
    for name in SIZES:
        assert sha256_file(out / name) == sha256_file(tiny.dir / name)


def test_a_stale_partial_is_discarded_when_the_object_changed(tiny: Model, s3: Any, tmp_path: Path) -> None:
    first = Recorder(s3, fail_at=12)
    with pytest.raises(ModelFetchError):
        fetch(first, tmp_path / "cache", workers=1)  # one worker: parts in manifest order
    partial = {k.removeprefix(PREFIX) for k, _ in first.ok_ranges}
    assert "model.onnx.data" in partial
    new = build_model(tmp_path / "v2", seed=2)  # every object changes, so every ETag does
    upload(s3, new.dir)
    second = Recorder(s3)
    out = fetch(second, tmp_path / "cache")
    counts = Counter(k.removeprefix(PREFIX) for _, k, _ in second.ranged())
    assert counts == {name: -(-size // PART) for name, size in SIZES.items()}  # every part again
    for name in SIZES:
        assert sha256_file(out / name) == sha256_file(new.dir / name)


def test_a_partial_is_discarded_when_only_the_etag_changed(tiny: Model, s3: Any, tmp_path: Path) -> None:
    first = Recorder(s3, fail_at=12)
    with pytest.raises(ModelFetchError):
        fetch(first, tmp_path / "cache", workers=1)
    data_key = PREFIX + "model.onnx.data"
    assert 0 < sum(1 for k, _ in first.ok_ranges if k == data_key) < 17
    # the same bytes uploaded again as a one-part multipart upload: another ETag ("...-1"), same manifest entry
    old_etag = s3.head_object(Bucket=BUCKET, Key=data_key)["ETag"]
    upload_id = s3.create_multipart_upload(Bucket=BUCKET, Key=data_key)["UploadId"]
    part = s3.upload_part(
        Bucket=BUCKET, Key=data_key, UploadId=upload_id, PartNumber=1, Body=tiny.files["model.onnx.data"]
    )
    s3.complete_multipart_upload(
        Bucket=BUCKET,
        Key=data_key,
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
    )
    assert s3.head_object(Bucket=BUCKET, Key=data_key)["ETag"] != old_etag
    second = Recorder(s3)
    out = fetch(second, tmp_path / "cache")
    assert sum(1 for _, k, _ in second.ranged() if k == data_key) == 17  # none of the old parts kept
    assert sha256_file(out / "model.onnx.data") == sha256_file(tiny.dir / "model.onnx.data")


def test_an_object_changing_mid_download_fails_the_if_match(tiny: Model, s3: Any, tmp_path: Path) -> None:
    other = bytes(reversed(tiny.files["model.onnx.data"]))

    def replace(n: int, response: Any) -> Any:
        if n == 1:
            s3.put_object(Bucket=BUCKET, Key=PREFIX + "model.onnx.data", Body=other)
        return response

    with pytest.raises(ModelFetchError, match=r"model.onnx.data: the object changed during the download"):
        fetch(Recorder(s3, on_range=replace), tmp_path / "cache", workers=1, backend="onnx")
    assert published(tmp_path / "cache") == []
    assert not list((tmp_path / "cache").rglob("model.onnx.data.part"))


def test_not_enough_space_names_needed_free_and_the_setting(
    tiny: Model, s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(path: Any) -> Any:
        return SimpleNamespace(total=512 * 2**20, used=510 * 2**20, free=2 * 2**20)

    monkeypatch.setattr(shutil, "disk_usage", full)
    rec = Recorder(s3)
    with pytest.raises(InsufficientStorageError) as info:
        fetch(rec, tmp_path / "cache")
    message = str(info.value)
    assert "needs 18 MB" in message and "2 MB is free" in message
    assert "EphemeralStorage" in message and "512 MB" in message and "10240 MB" in message
    assert rec.ranged() == []
    assert published(tmp_path / "cache") == []


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "bucket/prefix/",
        "http://bucket/prefix/",
        "s3://",
        "s3:///prefix/",
        "s3://Bad_Bucket/prefix/",
        "s3://ab/prefix/",
        "s3://bucket//prefix/",
        "s3://bucket/prefix/\n",
    ],
)
def test_bad_uris_are_config_errors(uri: str) -> None:
    with pytest.raises(ConfigError, match=r"s3://bucket/prefix/|key must not"):
        parse_s3_uri(uri)
    with pytest.raises(ConfigError):
        fetch_model(uri, client=object(), environ={})


def test_parse_and_prefix_forms(tiny: Model, s3: Any, tmp_path: Path) -> None:
    assert parse_s3_uri("s3://my.bucket-1/a/b/") == ("my.bucket-1", "a/b/")
    assert parse_s3_uri("s3://bucket") == ("bucket", "")
    a = fetch(s3, tmp_path / "cache", uri=URI)
    assert fetch(s3, tmp_path / "cache", uri=URI.rstrip("/")) == a
    assert fetch(s3, tmp_path / "cache", uri=URI + "manifest.json") == a


def test_a_prefix_without_manifest_is_a_fetch_error(s3: Any, tmp_path: Path) -> None:
    with pytest.raises(ModelFetchError, match=r"manifest.json: missing; s3://warmstart-models/nothing/ is not"):
        fetch(s3, tmp_path / "cache", uri=f"s3://{BUCKET}/nothing/")
    s3.put_object(Bucket=BUCKET, Key="junk/manifest.json", Body=b'{"format": "other"}')
    with pytest.raises(ModelFetchError, match="invalid manifest"):
        fetch(s3, tmp_path / "cache", uri=f"s3://{BUCKET}/junk/")


def test_one_backend_fetches_only_its_files(tiny: Model, s3: Any, tmp_path: Path) -> None:
    rec = Recorder(s3)
    out = fetch(rec, tmp_path / "cache", backend="onnx")
    assert {k.removeprefix(PREFIX) for _, k, _ in rec.ranged()} == {"model.onnx", "model.onnx.data", "tokenizer.json"}
    manifest = load_manifest(out)
    assert set(manifest.files) == {"model.onnx", "model.onnx.data", "tokenizer.json"}
    assert set(manifest.backends) == {"onnx"} and manifest.default_backend == "onnx"
    assert not (out / "model.safetensors").exists()
    assert fetch(s3, tmp_path / "cache") != out  # all files: another directory
    assert fetch(s3, tmp_path / "cache", backend="default") != out  # its own directory, the same files
    assert set(load_manifest(fetch(s3, tmp_path / "cache", backend="default")).files) == set(manifest.files)
    with pytest.raises(ConfigError, match="valid: default, onnx, torch"):
        fetch(s3, tmp_path / "cache", backend="tensorflow")


def test_concurrent_fetches_of_one_uri_download_once(tiny: Model, s3: Any, tmp_path: Path) -> None:
    rec = Recorder(s3)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(fetch(rec, tmp_path / "cache"))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and len(set(results)) == 1
    assert len(rec.ranged()) == sum(-(-size // PART) for size in SIZES.values())


def test_an_empty_file_is_fetched(s3: Any, tmp_path: Path) -> None:
    model = build_model(tmp_path / "src", sizes={**SIZES, "tokenizer.json": 0})
    upload(s3, model.dir)
    out = fetch(s3, tmp_path / "cache")
    assert (out / "tokenizer.json").read_bytes() == b""


def test_settings_from_the_environment(tiny: Model, s3: Any, tmp_path: Path) -> None:
    env = {"WARMSTART_CACHE_DIR": str(tmp_path / "envcache"), "WARMSTART_S3_PART_MB": "1", "WARMSTART_S3_WORKERS": "3"}
    rec = Recorder(s3)
    out = fetch_model(URI, client=rec, environ=env)
    assert out.parent == tmp_path / "envcache"
    assert len(rec.ranged()) == len(SIZES) + 1  # 1 MiB parts: only model.onnx.data (1 MiB + 123) has two
    for bad in ({"WARMSTART_S3_WORKERS": "0"}, {"WARMSTART_S3_PART_MB": "x"}, {"WARMSTART_S3_REUSE_CHECK": "md5"}):
        with pytest.raises(ConfigError):
            fetch_model(URI, client=rec, environ={**env, **bad})


def test_the_client_is_built_lazily_cached_and_dropped(tiny: Model, tmp_path: Path) -> None:
    drop_clients()
    out = fetch_model(URI, cache_dir=tmp_path / "cache", environ={}, part_size=PART)
    assert load_manifest(out).key == "tiny@1.0"
    client = s3fetch._client({}, s3fetch.DEFAULT_WORKERS)
    assert s3fetch._client({}, s3fetch.DEFAULT_WORKERS) is client
    assert client.meta.config.max_pool_connections >= s3fetch.DEFAULT_WORKERS
    assert client.meta.config.retries["mode"] == "adaptive"
    drop_clients()
    assert s3fetch._client({}, s3fetch.DEFAULT_WORKERS) is not client


def test_importing_s3fetch_does_not_import_boto3() -> None:
    probe = "import sys, handler.models.s3fetch; print(sorted(m for m in ('boto3', 'botocore') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- pointers --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "body", "expected"),
    [
        ("models/tiny/CURRENT", b"s3://other-bucket/x/1.0/\n", "s3://other-bucket/x/1.0/"),
        ("models/tiny/CURRENT", b"1.0/", f"s3://{BUCKET}/models/tiny/1.0/"),
        ("models/tiny/CURRENT", b"  1.0\n", f"s3://{BUCKET}/models/tiny/1.0/"),
        ("CURRENT", b"models/tiny/1.0", f"s3://{BUCKET}/models/tiny/1.0/"),
    ],
)
def test_a_pointer_resolves(s3: Any, key: str, body: bytes, expected: str) -> None:
    put = s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    assert read_pointer(f"s3://{BUCKET}/{key}", client=s3) == (expected, put["ETag"])


def test_a_changed_pointer_has_another_etag_and_the_model_follows(tiny: Model, s3: Any, tmp_path: Path) -> None:
    pointer = f"s3://{BUCKET}/models/tiny/CURRENT"
    s3.put_object(Bucket=BUCKET, Key="models/tiny/CURRENT", Body=b"1.0/")
    uri, etag = read_pointer(pointer, client=s3)
    assert load_manifest(fetch(s3, tmp_path / "cache", uri=uri)).key == "tiny@1.0"
    new = build_model(tmp_path / "v2", seed=3)
    upload(s3, new.dir, prefix="models/tiny/2.0/")
    s3.put_object(Bucket=BUCKET, Key="models/tiny/CURRENT", Body=b"2.0/")
    uri2, etag2 = read_pointer(pointer, client=s3)
    assert (uri2, etag2 != etag) == (f"s3://{BUCKET}/models/tiny/2.0/", True)
    out = fetch(s3, tmp_path / "cache", uri=uri2)
    assert sha256_file(out / "model.onnx.data") == sha256_file(new.dir / "model.onnx.data")


@pytest.mark.parametrize(
    "body", [b"", b"\n", b"../1.0/", b"/abs/1.0/", b"https://x/y", b"a b", b"\xff\xfe", b"x" * 5000]
)
def test_a_bad_pointer_body_is_a_config_error(s3: Any, body: bytes) -> None:
    s3.put_object(Bucket=BUCKET, Key="models/tiny/CURRENT", Body=body)
    with pytest.raises(ConfigError, match="pointer s3://"):
        read_pointer(f"s3://{BUCKET}/models/tiny/CURRENT", client=s3)


def test_a_missing_pointer_or_a_prefix_is_refused(s3: Any) -> None:
    with pytest.raises(ModelFetchError, match="no such object"):
        read_pointer(f"s3://{BUCKET}/models/tiny/CURRENT", client=s3)
    with pytest.raises(ConfigError, match="not a prefix"):
        read_pointer(f"s3://{BUCKET}/models/tiny/", client=s3)


# --- end to end ------------------------------------------------------------------------------------------


def test_the_default_model_from_s3_serves_the_same_embeddings(
    s3: Any, tmp_path: Path, model_dir: Path, onnx_runtime: Runtime
) -> None:
    upload(s3, model_dir, prefix="models/default/")
    out = fetch_model(f"s3://{BUCKET}/models/default/", cache_dir=tmp_path / "cache", client=s3, environ={})
    for name in load_manifest(model_dir).files:
        assert os.path.getsize(out / name) == os.path.getsize(model_dir / name)
    runtime = Runtime.start(environ={"WARMSTART_MODEL": str(out), "WARMSTART_WARMUP": "0"}, emit=None)
    texts = {"inputs": ["weights from S3", "a second sentence"]}
    got, want = runtime.infer(texts), onnx_runtime.infer(texts)
    assert got["model"] == want["model"] == "all-minilm-l6-v2@0.1.0"
    np.testing.assert_array_equal(np.asarray(got["embeddings"]), np.asarray(want["embeddings"]))


@pytest.mark.parametrize("name", ["", "a\x00b", "../escape"])
def test_odd_file_names_in_a_remote_manifest_fetch_nothing(s3: Any, tmp_path: Path, name: str) -> None:
    model = build_model(tmp_path / "src")
    raw = json.loads((model.dir / "manifest.json").read_text())
    raw["files"][name] = {"size": 1, "sha256": "0" * 64}
    (model.dir / "manifest.json").write_text(json.dumps(raw))
    upload(s3, model.dir)
    rec = Recorder(s3)
    with pytest.raises(ModelFetchError, match=rf"invalid manifest: files entry {re.escape(repr(name))}"):
        fetch(rec, tmp_path / "cache")
    assert rec.ranged() == [] and published(tmp_path / "cache") == []


def test_a_fetch_tidies_what_dead_processes_left_in_the_cache(tiny: Model, s3: Any, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (cache / f".keep-{int(done.stdout)}.json").write_text("[]")  # a process that exited
    (cache / ".0123456789abcdef.lock").touch()  # a source long gone
    out = fetch(s3, cache)
    assert sorted(p.name for p in cache.iterdir() if p.name != out.name) == sorted(
        [f".keep-{os.getpid()}.json", f".{out.name.rsplit('-', 1)[1]}.lock"]
    )


def test_a_remote_manifest_nested_too_deeply_is_a_fetch_error(s3: Any, tmp_path: Path) -> None:
    """It escaped as a raw RecursionError; now ModelFetchError naming the object, nothing fetched or published."""
    model = build_model(tmp_path / "src")
    nest(model.dir, 100_000)
    upload(s3, model.dir)
    rec = Recorder(s3)
    with pytest.raises(ModelFetchError, match=rf"{URI}manifest\.json: invalid manifest: nested more than"):
        fetch(rec, tmp_path / "cache")
    assert rec.ranged() == [] and published(tmp_path / "cache") == []


def test_a_download_that_would_not_fit_prunes_what_nothing_holds_first(
    tiny: Model, s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    old = build_model(tmp_path / "old", seed=1)
    upload(s3, old.dir, prefix="models/tiny/0.9/")
    stale = fetch(s3, cache, "s3://warmstart-models/models/tiny/0.9/")  # a version a reload left behind
    size = sum(SIZES.values())

    def disk_usage(path: Any) -> Any:
        used = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
        capacity = s3fetch.SPACE_MARGIN + size * 3 // 2  # room for one version and a half
        return SimpleNamespace(total=capacity, used=used, free=capacity - used)

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    with pytest.raises(InsufficientStorageError):
        fetch(s3, cache)  # without `keep`, nothing is pruned
    out = fetch(s3, cache, keep=lambda: [])
    assert not stale.exists() and published(cache) == [out]
    assert fetch(s3, cache, keep=lambda: [out]) == out  # reused, and what is held stays


def test_a_long_fetch_says_how_far_it_is(
    tiny: Model, s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 37 item 11: a big model's fetch was silent until it ended. Parts slowed so the fetch outlasts the
    # progress interval: init log lines with the bytes so far, never more than the total, ending below it.
    import logging
    import time

    from handler.models import s3fetch

    monkeypatch.setattr(s3fetch, "PROGRESS_S", 0.05)

    def slow(n: int, response: Any) -> Any:
        time.sleep(0.03)
        return response

    with caplog.at_level(logging.INFO, logger="warmstart"):
        fetch(Recorder(s3, on_range=slow), tmp_path / "cache", workers=1)
    lines = [r for r in caplog.records if r.getMessage().startswith("fetching s3://")]
    assert len(lines) >= 2
    done = [r.fields["fetched_bytes"] for r in lines]  # type: ignore[attr-defined]
    total = lines[0].fields["total_bytes"]  # type: ignore[attr-defined]
    assert done == sorted(done) and 0 < done[-1] <= total == sum(SIZES.values())
    assert " MB (" in lines[0].getMessage() and "%) in " in lines[0].getMessage()
