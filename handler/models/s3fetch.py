"""Packed models from S3: fetched into `/tmp` with parallel ranged GETs, verified, resumed, reused.

`fetch_model("s3://bucket/models/minilm/0.2.0/")` downloads `manifest.json`, then every file it lists (or one
backend's), and returns a local packed-model directory for `load_manifest`. The rules:

- every file is written to `<name>.part` (pwrite at each part's offset), then its size and SHA-256 are checked
  against the manifest, then fsync and rename; the model directory is published by one rename of the staging
  directory, so a reader sees the whole model or none of it;
- a `.part` has a sidecar recording its object's ETag and the parts done: a later call resumes it only while
  the ETag still matches (every ranged GET carries `IfMatch`), otherwise it is discarded;
- a published directory is reused across invocations and processes of the instance (see `REUSE_CHECKS`);
- the space still needed is checked against the cache directory's free space before any part is fetched.

About one thing (the fetch and its crash-safety rules, which only make sense read together), hence its length.

boto3 is imported only inside `_client`: it costs ~300 ms of import, and a model on local disk (the default)
must not pay that at every cold start.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handler.core.config import env_int
from handler.core.errors import ConfigError, InsufficientStorageError, ModelFetchError, WarmstartError
from handler.core.manifest import MANIFEST_NAME, Manifest, _parse, parse_json, replace_dir, sha256_file
from handler.models.s3cache import MARKER, STAGING, flock, hold, prune, read_json, tidy, write_json
from handler.tasks.catalog import load_manifest, task_fields

DEFAULT_CACHE_DIR = Path("/tmp/warmstart/models")
DEFAULT_PART_MB = 8
DEFAULT_WORKERS = 8
# Headroom over the bytes still to download: the manifest, sidecars, the filesystem's own blocks.
SPACE_MARGIN = 16 * 2**20
# How a published directory is checked before reuse:
#   etag    one HEAD of manifest.json (no GET): reuse while its ETag is the one fetched, and every file has
#           its size. The manifest holds every file's SHA-256, so an unchanged manifest means unchanged
#           files; the files themselves were hashed before the directory was published. The default.
#   none    no request at all: for prefixes that are never overwritten (versioned, behind a pointer).
#   sha256  re-hash every file (~0.5 s per 180 MB): for when /tmp itself is not trusted.
REUSE_CHECKS = ("etag", "none", "sha256")
_CHUNK = 1 << 20
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# Failures while streaming a part that are worth one more try of that part (botocore retries the request
# itself, not a body that breaks off half-way). Matched by name: botocore is not imported here.
_TRANSIENT = {"ResponseStreamingError", "IncompleteReadError", "ReadTimeoutError", "ConnectionClosedError"}
_PART_ATTEMPTS = 3
# A fetch that takes longer says how far it is, every this many seconds (an init log line): a user watching a big
# model's cold start in CloudWatch sees bytes move, not silence. Log lines, not a bar: the fetch runs in init.
PROGRESS_S = 5.0
log = logging.getLogger("warmstart")


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/prefix/` → ("bucket", "prefix/"); a `ConfigError` saying what is expected otherwise."""
    if not isinstance(uri, str) or not uri.startswith("s3://"):
        raise ConfigError(f"{uri!r} is not an S3 URI; expected s3://bucket/prefix/")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise ConfigError(
            f"{uri!r}: {bucket!r} is not an S3 bucket name (3-63 characters of a-z, 0-9, '.', '-'); "
            "expected s3://bucket/prefix/"
        )
    if key.startswith("/") or key != key.strip() or any(ord(c) < 32 for c in key):
        raise ConfigError(f"{uri!r}: the key must not start with '/' or hold whitespace or control characters")
    return bucket, key


def _model_prefix(key: str) -> str:
    """A model's key prefix: `p/` from `p`, `p/` or `p/manifest.json`."""
    if key == MANIFEST_NAME or key.endswith("/" + MANIFEST_NAME):
        return key[: -len(MANIFEST_NAME)]
    return key if key == "" or key.endswith("/") else key + "/"


# --- clients ---------------------------------------------------------------------------------------------

_clients: dict[tuple[str | None, int], Any] = {}
_clients_lock = threading.Lock()


def _client(environ: Mapping[str, str], pool: int) -> Any:
    endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL") or None
    with _clients_lock:
        client = _clients.get((endpoint, pool))
        if client is None:
            # Deferred: boto3 + botocore take ~300 ms to import; a model on local disk must not pay it.
            import boto3  # type: ignore[import-untyped]
            from botocore.config import Config  # type: ignore[import-untyped]

            config = Config(
                retries={"mode": "adaptive", "max_attempts": 5},
                max_pool_connections=max(pool, 10),
                connect_timeout=5,
                read_timeout=30,
                tcp_keepalive=True,
            )
            # A session per client: boto3's default session is not thread-safe to create clients from.
            client = boto3.session.Session().client("s3", endpoint_url=endpoint, config=config)
            _clients[(endpoint, pool)] = client
        return client


def drop_clients() -> int:
    """Discard the cached S3 clients (SnapStart's before-snapshot hook: no connection may outlive a snapshot);
    returns how many there were. The next fetch makes a new one."""
    with _clients_lock:
        clients = list(_clients.values())
        _clients.clear()
    for client in clients:
        with contextlib.suppress(Exception):
            client.close()
    return len(clients)


def _error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", "")) or None
    return None


def _fetch_error(what: str, exc: Exception) -> ModelFetchError:
    code = _error_code(exc)
    if code in ("NoSuchKey", "404", "NotFound"):
        return ModelFetchError(f"{what}: no such object")
    if code in ("NoSuchBucket", "AccessDenied", "403"):
        return ModelFetchError(f"{what}: {code} (check the bucket name and the function role's s3:GetObject)")
    return ModelFetchError(f"{what}: {type(exc).__name__}: {exc}")


# --- settings --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Settings:
    cache_dir: Path
    part_size: int
    workers: int
    reuse_check: str


def _settings(
    env: Mapping[str, str],
    cache_dir: Path | None,
    part_size: int | None,
    workers: int | None,
    reuse_check: str | None,
) -> _Settings:
    check = reuse_check or env.get("WARMSTART_S3_REUSE_CHECK", "").strip() or "etag"
    if check not in REUSE_CHECKS:
        raise ConfigError(f"reuse check {check!r}; valid: {', '.join(REUSE_CHECKS)}")
    part = part_size if part_size is not None else env_int(env, "WARMSTART_S3_PART_MB", DEFAULT_PART_MB, 1, 1024) << 20
    count = workers if workers is not None else env_int(env, "WARMSTART_S3_WORKERS", DEFAULT_WORKERS, 1, 64)
    if part < 1024 or count < 1:
        raise ConfigError(f"part_size={part} (at least 1024) and workers={count} (at least 1)")
    root = cache_dir or Path(env.get("WARMSTART_CACHE_DIR", "").strip() or DEFAULT_CACHE_DIR)
    return _Settings(root, part, count, check)


# --- the public calls ------------------------------------------------------------------------------------


def fetch_model(
    uri: str,
    *,
    cache_dir: Path | None = None,
    client: Any = None,
    environ: Mapping[str, str] | None = None,
    backend: str | None = None,
    part_size: int | None = None,
    workers: int | None = None,
    reuse_check: str | None = None,
    keep: Callable[[], Iterable[Path]] | None = None,
) -> Path:
    """Fetch the packed model under `uri` and return its local directory: every file, or only what
    `backend` needs (`"default"`: the manifest's default backend), its local manifest then listing just those.

    Settings not passed come from `WARMSTART_CACHE_DIR` (`/tmp/warmstart/models`), `WARMSTART_S3_PART_MB` (8),
    `WARMSTART_S3_WORKERS` (8) and `WARMSTART_S3_REUSE_CHECK` (etag). `keep`: the model directories the
    caller serves or is about to; when given and the download would not fit, what the cache holds beyond
    them (and beyond what other processes hold) is pruned first (`handler.models.s3cache`). Raises `ModelFetchError` (a
    `ModelLoadError`), `InsufficientStorageError` or `ConfigError`.
    """
    env = os.environ if environ is None else environ
    bucket, key = parse_s3_uri(uri)
    prefix = _model_prefix(key)
    settings = _settings(env, cache_dir, part_size, workers, reuse_check)
    s3 = client if client is not None else _client(env, settings.workers)
    source = f"s3://{bucket}/{prefix}"
    ident = hashlib.sha256(f"{source}\0{backend or ''}".encode()).hexdigest()[:16]
    fetch = _Fetch(s3, bucket, prefix, source, backend, settings, ident, keep)
    try:
        settings.cache_dir.mkdir(parents=True, exist_ok=True)
        # One fetch of a URI at a time per instance: Managed Instances run a process per concurrency slot.
        with flock(settings.cache_dir / f".{ident}.lock"):
            out = fetch.reuse() or fetch.download()
            hold(settings.cache_dir, [out], add=True)  # before the lock goes: no other process's prune takes it
        tidy(settings.cache_dir)  # dead processes' keep files, locks of sources gone (one listing)
        return out
    except WarmstartError:
        raise
    except OSError as e:
        raise ModelFetchError(f"{source} → {settings.cache_dir}: {e}") from e


def read_pointer(uri: str, *, client: Any = None, environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """Read a pointer object (its body names a model prefix, absolute `s3://...` or relative to the pointer's
    own prefix) and return (the model's URI, the pointer's ETag)."""
    bucket, key = parse_s3_uri(uri)
    if not key or key.endswith("/"):
        raise ConfigError(f"{uri!r}: a pointer is an object (s3://bucket/models/name/CURRENT), not a prefix")
    s3 = client if client is not None else _client(os.environ if environ is None else environ, DEFAULT_WORKERS)
    try:
        response = s3.get_object(Bucket=bucket, Key=key)
        body = response["Body"].read(4097)
    except Exception as e:
        raise _fetch_error(f"pointer {uri}", e) from e
    try:
        target = body.decode().strip()
    except UnicodeDecodeError:
        target = ""
    if not target or len(body) > 4096 or any(c.isspace() for c in target):
        raise ConfigError(f"pointer {uri}: the body must be one S3 URI or relative prefix, got {body[:80]!r}")
    if target.startswith("s3://"):
        parse_s3_uri(target)
        resolved = target
    elif "://" in target or target.startswith("/") or ".." in target.split("/"):
        raise ConfigError(f"pointer {uri}: {target!r} is neither s3://bucket/prefix/ nor a prefix relative to it")
    else:
        base = key.rpartition("/")[0]
        resolved = f"s3://{bucket}/{base}/{target}" if base else f"s3://{bucket}/{target}"
    bucket2, key2 = parse_s3_uri(resolved)
    return f"s3://{bucket2}/{_model_prefix(key2)}", str(response["ETag"])


# --- one fetch -------------------------------------------------------------------------------------------


@dataclass
class _File:
    """One object being fetched into `<staging>/<name>.part`; `done` is the set of part indexes written."""

    name: str
    url: str  # s3://bucket/key, for messages
    key: str
    size: int
    sha256: str
    etag: str
    part_size: int
    path: Path  # the final name inside the staging directory
    done: set[int] = field(default_factory=set)
    fd: int = -1
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def part(self) -> Path:
        return self.path.with_name(self.path.name + ".part")

    @property
    def sidecar(self) -> Path:
        return self.path.with_name(self.path.name + ".fetch.json")

    @property
    def nparts(self) -> int:
        return -(-self.size // self.part_size)  # 0 for an empty file: nothing to GET, only to verify

    def span(self, index: int) -> tuple[int, int]:
        return index * self.part_size, min(self.size, (index + 1) * self.part_size)

    def state(self, complete: bool = False) -> dict[str, Any]:
        return {
            "etag": self.etag,
            "size": self.size,
            "sha256": self.sha256,
            "part_size": self.part_size,
            "done": sorted(self.done),
            "complete": complete,
        }

    def resume(self) -> bool:
        """Pick up what an earlier attempt left: True when the file is already complete and verified."""
        saved = read_json(self.sidecar)
        same = isinstance(saved, dict) and all(
            saved.get(k) == v for k, v in self.state().items() if k not in ("done", "complete")
        )
        if same and saved.get("complete") is True and _size(self.path) == self.size:
            return True
        if same and saved.get("complete") is False and _size(self.part) == self.size:
            self.done = {int(i) for i in saved.get("done", []) if 0 <= int(i) < self.nparts}
            return False
        self.discard()  # another object (ETag), another manifest entry, or no record: start over
        return False

    def discard(self) -> None:
        self.done = set()
        for path in (self.part, self.sidecar, self.path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def remaining(self) -> int:
        return sum(self.span(i)[1] - self.span(i)[0] for i in range(self.nparts) if i not in self.done)

    def mark(self, index: int) -> bool:
        """Record part `index` as written; True when it was the last one. Not fsynced per part: a resumed
        file is hashed in full before use, so a part lost with the OS only costs a discarded download."""
        with self.lock:
            self.done.add(index)
            write_json(self.sidecar, self.state())
            return len(self.done) == self.nparts


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return -1


class _Fetch:
    def __init__(
        self,
        s3: Any,
        bucket: str,
        prefix: str,
        source: str,
        backend: str | None,
        settings: _Settings,
        ident: str,
        keep: Callable[[], Iterable[Path]] | None = None,
    ) -> None:
        self.s3, self.bucket, self.prefix, self.source = s3, bucket, prefix, source
        self.backend, self.settings, self.ident, self.keep = backend, settings, ident, keep
        self.manifest_key = prefix + MANIFEST_NAME

    def _head(self, key: str) -> dict[str, Any]:
        try:
            return dict(self.s3.head_object(Bucket=self.bucket, Key=key))
        except Exception as e:
            raise _fetch_error(f"s3://{self.bucket}/{key}", e) from e

    # reuse

    def reuse(self) -> Path | None:
        found = []
        for path in self.settings.cache_dir.glob(f"*-{self.ident}"):
            marker = read_json(path / MARKER)
            if path.is_dir() and isinstance(marker, dict) and marker.get("source") == self.source:
                found.append((float(marker.get("fetched_at", 0)), path, marker))
        if not found:
            return None
        check = self.settings.reuse_check
        etag = self._head(self.manifest_key)["ETag"] if check == "etag" else None
        for _, path, marker in sorted(found, key=lambda f: f[0], reverse=True):
            if etag is not None and marker.get("manifest_etag") != etag:
                continue
            sizes = marker.get("files") or {}
            if any(_size(path / name) != size for name, size in sizes.items()):
                continue
            if check == "sha256":
                manifest = load_manifest(path)
                if any(sha256_file(path / n) != manifest.files[n].sha256 for n in manifest.files):
                    continue
            return path
        return None

    # download

    def download(self) -> Path:
        manifest, body, etag = self._manifest()
        if self.backend == "default":
            self.backend = manifest.default_backend
        names = list(manifest.files) if self.backend is None else manifest.files_for(self.backend)
        staging = self.settings.cache_dir / f"{STAGING}{self.ident}"
        staging.mkdir(mode=0o755, exist_ok=True)
        heads = self._pool_map(lambda n: self._head(self.prefix + n), names)
        files = []
        for name, head in zip(names, heads, strict=True):
            entry = manifest.files[name]
            url = f"s3://{self.bucket}/{self.prefix}{name}"
            if int(head["ContentLength"]) != entry.size:
                raise ModelFetchError(
                    f"{url}: the object is {head['ContentLength']} bytes, the manifest says {entry.size} "
                    "(truncated or replaced); nothing was published"
                )
            path = staging / name
            path.parent.mkdir(parents=True, exist_ok=True)
            files.append(
                _File(
                    name,
                    url,
                    self.prefix + name,
                    entry.size,
                    entry.sha256,
                    str(head["ETag"]),
                    self.settings.part_size,
                    path,
                )
            )
        todo = [f for f in files if not f.resume()]
        self._check_space(sum(f.remaining() for f in todo), manifest)
        try:
            self._fetch_all(todo)
        finally:
            for f in todo:
                if f.fd >= 0:
                    os.close(f.fd)
        return self._publish(staging, manifest, body, etag, files)

    def _manifest(self) -> tuple[Manifest, bytes, str]:
        url = f"s3://{self.bucket}/{self.manifest_key}"
        try:
            response = self.s3.get_object(Bucket=self.bucket, Key=self.manifest_key)
            body = response["Body"].read()
        except Exception as e:
            if _error_code(e) in ("NoSuchKey", "404"):
                raise ModelFetchError(f"{url}: missing; {self.source} is not a packed model") from e
            raise _fetch_error(url, e) from e
        try:
            raw = parse_json(body)
            manifest = _parse(self.settings.cache_dir, raw, task_fields)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ModelFetchError(f"{url}: invalid manifest: {e}") from None
        if self.backend not in (None, "default", *manifest.backends):
            raise ConfigError(
                f"backend {self.backend!r} is not in {url}; valid: {', '.join(['default', *sorted(manifest.backends)])}"
            )
        return manifest, body, str(response["ETag"])

    def _check_space(self, needed: int, manifest: Manifest) -> None:
        free = shutil.disk_usage(self.settings.cache_dir).free
        if needed and needed + SPACE_MARGIN > free and self.keep is not None:
            # Versions a reload left behind (normally pruned once the swap freed them): make room first.
            prune(self.settings.cache_dir, self.keep())
            free = shutil.disk_usage(self.settings.cache_dir).free
        if needed and needed + SPACE_MARGIN > free:
            mb = 2**20
            need_mb = -(-(needed + SPACE_MARGIN) // mb)
            raise InsufficientStorageError(
                f"{self.settings.cache_dir}: {manifest.key} from {self.source} needs {need_mb} MB "
                f"({-(-needed // mb)} MB of files + {SPACE_MARGIN // mb} MB margin), {free // mb} MB is free. "
                "Raise the function's ephemeral storage (EphemeralStorage Size: 512 MB by default, up to 10240 MB), "
                "fetch one backend only (WARMSTART_BACKEND), or point WARMSTART_CACHE_DIR at a larger volume"
            )

    def _pool_map(self, fn: Callable[[str], dict[str, Any]], items: list[str]) -> list[dict[str, Any]]:
        with ThreadPoolExecutor(max_workers=min(self.settings.workers, max(1, len(items)))) as pool:
            return list(pool.map(fn, items))

    def _fetch_all(self, files: list[_File]) -> None:
        """Every missing part of every file on one pool; a file is verified as soon as its last part lands."""
        pool = ThreadPoolExecutor(max_workers=self.settings.workers, thread_name_prefix="s3fetch")
        pending: set[Future[None]] = set()
        total = sum(f.remaining() for f in files)
        self.fetched, self.fetched_lock = 0, threading.Lock()
        started = last = time.monotonic()
        try:
            for f in files:
                f.fd = os.open(f.part, os.O_RDWR | os.O_CREAT, 0o644)
                os.ftruncate(f.fd, f.size)  # sparse: space is taken as parts land
                write_json(f.sidecar, f.state())
                if len(f.done) == f.nparts:
                    pending.add(pool.submit(self._finish, f))
                pending |= {pool.submit(self._part, f, i) for i in range(f.nparts) if i not in f.done}
            while pending:
                finished, pending = wait(pending, timeout=PROGRESS_S, return_when=FIRST_COMPLETED)
                for future in finished:
                    future.result()  # the first failure stops the fetch; pending parts are cancelled
                now = time.monotonic()
                if now - last >= PROGRESS_S and pending:
                    last = now
                    self._progress(total, now - started)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _part(self, f: _File, index: int) -> None:
        start, end = f.span(index)
        for attempt in range(_PART_ATTEMPTS):
            try:
                self._get_range(f, start, end)
                break
            except ModelFetchError:
                raise
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    raise InsufficientStorageError(
                        f"{f.part}: the cache directory filled up while fetching {f.url} (EphemeralStorage too small?)"
                    ) from e
                raise
            except Exception as e:
                if _error_code(e) in ("PreconditionFailed", "412"):
                    f.discard()
                    raise ModelFetchError(
                        f"{f.url}: the object changed during the download (ETag {f.etag} no longer matches); "
                        "the partial file was discarded, nothing was published"
                    ) from e
                if type(e).__name__ not in _TRANSIENT or attempt == _PART_ATTEMPTS - 1:
                    raise _fetch_error(f"{f.url} bytes {start}-{end - 1}", e) from e
        if f.mark(index):
            self._finish(f)

    def _get_range(self, f: _File, start: int, end: int) -> None:
        response = self.s3.get_object(Bucket=self.bucket, Key=f.key, Range=f"bytes={start}-{end - 1}", IfMatch=f.etag)
        body = response["Body"]
        offset = start
        while offset < end and (chunk := body.read(min(_CHUNK, end - offset))):
            view = memoryview(chunk)
            while view:
                written = os.pwrite(f.fd, view, offset)
                view, offset = view[written:], offset + written
        if offset != end:
            raise ModelFetchError(f"{f.url}: bytes {start}-{end - 1}: the response ended at byte {offset}")
        with self.fetched_lock:
            self.fetched += end - start

    def _progress(self, total: int, elapsed: float) -> None:
        done = self.fetched
        mb = 2**20
        log.info(
            f"fetching s3://{self.bucket}/{self.prefix}: {done / mb:,.0f} of {total / mb:,.0f} MB "
            f"({100 * done / max(total, 1):.0f}%) in {elapsed:.0f} s",
            extra={"fields": {"fetched_bytes": done, "total_bytes": total, "elapsed_s": round(elapsed, 1)}},
        )

    def _finish(self, f: _File) -> None:
        """Size and SHA-256 against the manifest, then fsync and rename; a mismatch discards the file."""
        size = os.fstat(f.fd).st_size
        digest = hashlib.sha256()
        for offset in range(0, size, _CHUNK):
            digest.update(os.pread(f.fd, _CHUNK, offset))
        actual = digest.hexdigest()
        if size != f.size or actual != f.sha256:
            f.discard()
            raise ModelFetchError(
                f"{f.url}: SHA-256 {actual} ({size} bytes) does not match the manifest's {f.sha256} ({f.size} bytes) "
                "(corrupt or replaced object); nothing was published"
            )
        os.fsync(f.fd)
        os.rename(f.part, f.path)
        with f.lock:
            write_json(f.sidecar, f.state(complete=True))

    def _publish(self, staging: Path, manifest: Manifest, body: bytes, etag: str, files: list[_File]) -> Path:
        if self.backend is not None:
            # Only one backend's files came down: the local manifest lists just those, so init checks what is there.
            raw = manifest.raw
            raw = {
                **raw,
                "backends": {self.backend: raw["backends"][self.backend]},
                "default_backend": self.backend,
                "files": {f.name: raw["files"][f.name] for f in files},
            }
            body = (json.dumps(raw, indent=2) + "\n").encode()
        (staging / MANIFEST_NAME).write_bytes(body)
        for f in files:
            f.sidecar.unlink(missing_ok=True)
        marker = {
            "source": self.source,
            "backend": self.backend,
            "manifest_etag": etag,
            "files": {f.name: f.size for f in files},
            "fetched_at": time.time(),
        }
        write_json(staging / MARKER, marker)
        load_manifest(staging)  # what we publish must read back
        name = re.sub(r"[^A-Za-z0-9._@-]", "_", manifest.key)
        out = self.settings.cache_dir / f"{name}-{self.ident}"
        replace_dir(staging, out)
        return out
