"""The local cache of models fetched from S3 (`/tmp/warmstart/models`): its layout, locks, what it holds, and
pruning what nothing serves.

Layout: a published model is `<key>-<ident>/` with a marker file (`MARKER`: source, files, fetch time);
`.staging-<ident>/` is a download in progress or an interrupted one (resumable); `.<ident>.lock` is held by
whoever fetches that source. `<ident>` names one source and backend.

Pruning: each hot reload adds a version and Lambda's `/tmp` is 512 MB by default, so after a swap has freed the
old version (and, failing that, before a download that would not fit), every directory that no process of
the instance serves or is about to serve is removed, oldest first. Several processes can share the cache
(Lambda Managed Instances run one per concurrency slot; local zygote forks share `/tmp`): each writes what it
holds to `.keep-<pid>.json`, a prune keeps the union over the live processes, and a fetch in progress holds
its source's lock, which a prune must get before it removes anything of that source.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from handler.core.errors import ModelLoadError
from handler.core.manifest import read_regular

MARKER = ".warmstart-s3.json"  # inside a published directory: where it came from, the manifest's ETag
STAGING = ".staging-"
_KEEP = ".keep-"
_keep_lock = threading.Lock()  # this process's keep file: one writer at a time
MB = 2**20


@contextlib.contextmanager
def flock(path: Path, blocking: bool = True) -> Iterator[bool]:
    """An exclusive lock on `path` (created); yields False at once when `blocking=False` and it is held, by
    another process or by another open of this one. A prune removes lock files nobody holds (while holding
    them), so a lock is only taken once the file locked is still the one at `path`: else it is opened again."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            yield False
            return
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # removed (or replaced) while we waited for it: lock the file there now
    try:
        yield True
    finally:
        os.close(fd)  # releases the lock


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(read_regular(path))  # a FIFO or device at the name is refused, never read
    except (OSError, ValueError, RecursionError, ModelLoadError):  # missing, torn or hostile: as if absent
        return None


def ident_of(path: Path) -> str:
    """The source ident a published (`<key>-<ident>`) or staging (`.staging-<ident>`) directory belongs to."""
    return path.name.removeprefix(STAGING).rsplit("-", 1)[-1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _ours(cache_dir: Path, paths: Iterable[Path]) -> set[str]:
    root = cache_dir.resolve()
    return {p.name for p in paths if Path(p).resolve().parent == root}


def hold(cache_dir: Path, paths: Iterable[Path], add: bool = False) -> None:
    """Record in this process's keep file what it serves or is about to (`add`: on top of what it holds)."""
    path = cache_dir / f"{_KEEP}{os.getpid()}.json"
    with _keep_lock:
        names = _ours(cache_dir, paths)
        if add:
            held = read_json(path)
            names |= set(held) if isinstance(held, list) else set()
        write_json(path, sorted(names))


def held_by_others(cache_dir: Path) -> set[str]:
    """What the instance's other live processes hold; the keep files of dead ones are removed."""
    names: set[str] = set()
    for path in cache_dir.glob(f"{_KEEP}*.json"):
        pid = path.name.removeprefix(_KEEP).removesuffix(".json")
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        if not _alive(int(pid)):
            path.unlink(missing_ok=True)
            continue
        held = read_json(path)
        names |= {n for n in held if isinstance(n, str)} if isinstance(held, list) else set()
    return names


def _entries(cache_dir: Path) -> list[tuple[float, Path, dict[str, Any] | None]]:
    """Published directories (with our marker) and staging directories, oldest first."""
    found = []
    for path in cache_dir.iterdir():
        staging = path.name.startswith(STAGING)
        if (path.name.startswith(".") and not staging) or not path.is_dir():
            continue
        marker = None if staging else read_json(path / MARKER)
        if not staging and not isinstance(marker, dict):
            continue  # not ours: a cache directory may sit on a shared volume
        when = float(marker.get("fetched_at", 0)) if marker else path.stat().st_mtime
        found.append((when, path, marker))
    return sorted(found, key=lambda e: e[0])


_LOCK_NAME = re.compile(r"\.([0-9a-f]{16})\.lock")
_KEEP_NAME = re.compile(r"\.keep-([0-9]+)\.json(\.tmp)?")


def tidy(cache_dir: Path) -> list[str]:
    """Remove the small files whose owner is gone; returns their names. A dead process's keep file (and the
    `.tmp` of one it died writing): never this process's, never a live one's. A source's lock file once
    nothing of that source is left (no published or staging directory) and no one holds it: it is taken
    (non-blocking) and removed while held, and `flock` re-opens a lock file removed under a waiter."""
    removed: list[str] = []
    try:
        names = os.listdir(cache_dir)
    except OSError:
        return removed
    idents = {ident_of(cache_dir / n) for n in names if not n.startswith(".") or n.startswith(STAGING)}
    for name in names:
        keep = _KEEP_NAME.fullmatch(name)
        if keep is not None:
            pid = int(keep.group(1))
            if pid != os.getpid() and not _alive(pid):
                (cache_dir / name).unlink(missing_ok=True)
                removed.append(name)
            continue
        lock = _LOCK_NAME.fullmatch(name)
        if lock is None or lock.group(1) in idents:
            continue
        path = cache_dir / name
        with flock(path, blocking=False) as got:
            # Checked again under the lock: a fetch that took it since has made its staging directory.
            if (
                got
                and not any(cache_dir.glob(f"*-{lock.group(1)}"))
                and not (cache_dir / f"{STAGING}{lock.group(1)}").exists()
            ):
                path.unlink(missing_ok=True)
                removed.append(name)
    return removed


def prune(cache_dir: Path, keep: Iterable[Path]) -> list[str]:
    """Remove every model directory and abandoned download in `cache_dir` that neither this process (`keep`)
    nor another live one holds, oldest first; returns the names removed. A source being fetched right now
    (its lock held) is left alone."""
    if not cache_dir.is_dir():
        return []
    keep = list(keep)
    hold(cache_dir, keep)
    held = _ours(cache_dir, keep) | held_by_others(cache_dir)
    removed = []
    for _, path, _ in _entries(cache_dir):
        if path.name in held:
            continue
        with flock(cache_dir / f".{ident_of(path)}.lock", blocking=False) as got:
            if got:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path.name)
    tidy(cache_dir)
    return removed


def describe(cache_dir: Path, keep: Iterable[Path]) -> dict[str, Any]:
    """What the cache holds, for `status`: each model directory (source, size, whether this process holds
    it), partial downloads, and the free space left."""
    ours = _ours(cache_dir, keep)
    models: list[dict[str, Any]] = []
    partial = 0
    if cache_dir.is_dir():
        for _, path, marker in _entries(cache_dir):
            if marker is None:
                partial += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
                continue
            size = sum(int(s) for s in (marker.get("files") or {}).values())
            models.append(
                {"dir": path.name, "source": marker.get("source"), "mb": round(size / MB, 1), "held": path.name in ours}
            )
    usage = shutil.disk_usage(cache_dir) if cache_dir.is_dir() else None
    return {
        "dir": str(cache_dir),
        "models": models,
        "models_mb": round(sum(m["mb"] for m in models), 1),
        "partial_mb": round(partial / MB, 1),
        "free_mb": None if usage is None else usage.free // MB,
    }
