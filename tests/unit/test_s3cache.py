"""The S3 model cache's pruning: only what no live process of the instance holds, oldest first, never a
source being fetched, never a directory that is not ours."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from handler.models import s3cache
from handler.models.s3cache import MARKER, describe, flock, hold, prune


def published(cache: Path, name: str, fetched_at: float, mb: int = 1) -> Path:
    path = cache / name
    path.mkdir(parents=True)
    (path / "model.onnx").write_bytes(b"x")
    (path / MARKER).write_text(
        json.dumps({"source": f"s3://b/{name}/", "files": {"model.onnx": mb << 20}, "fetched_at": fetched_at})
    )
    return path


def test_prune_keeps_what_is_held_and_removes_the_rest_oldest_first(tmp_path: Path) -> None:
    old, older, served = (published(tmp_path, f"m@{v}-id{v}", t) for v, t in (("2", 20.0), ("1", 10.0), ("3", 30.0)))
    (tmp_path / ".staging-id9").mkdir()  # an abandoned download of another source
    (tmp_path / "not-ours").mkdir()  # a cache directory may be shared: what has no marker is left alone
    assert prune(tmp_path, [served]) == [older.name, old.name, ".staging-id9"]  # staging: by its mtime (now)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [served.name, "not-ours"]
    assert json.loads((tmp_path / f".keep-{os.getpid()}.json").read_text()) == [served.name]


def test_a_source_being_fetched_is_left_alone(tmp_path: Path) -> None:
    fetching = published(tmp_path, "m@2-abc", 1.0)
    with flock(tmp_path / ".abc.lock"):
        assert prune(tmp_path, []) == []
    assert prune(tmp_path, []) == [fetching.name]


def test_what_another_live_process_holds_is_kept(tmp_path: Path) -> None:
    theirs, mine = published(tmp_path, "m@1-id1", 1.0), published(tmp_path, "m@2-id2", 2.0)
    (tmp_path / f".keep-{os.getppid()}.json").write_text(json.dumps([theirs.name]))  # the parent: alive
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / f".keep-{int(dead.stdout)}.json").write_text(json.dumps([mine.name]))  # exited: ignored
    assert prune(tmp_path, []) == [mine.name]
    assert theirs.is_dir() and not (tmp_path / f".keep-{int(dead.stdout)}.json").exists()


def test_hold_adds_to_what_this_process_holds(tmp_path: Path) -> None:
    a, b = published(tmp_path, "a@1-x", 1.0), published(tmp_path, "b@1-y", 2.0)
    hold(tmp_path, [a])
    hold(tmp_path, [b], add=True)
    assert json.loads((tmp_path / f".keep-{os.getpid()}.json").read_text()) == [a.name, b.name]
    assert s3cache.held_by_others(tmp_path) == set()


def test_describe_says_what_the_cache_holds(tmp_path: Path) -> None:
    served = published(tmp_path, "m@2-id2", 2.0, mb=87)
    published(tmp_path, "m@1-id1", 1.0, mb=87)
    (tmp_path / ".staging-id3").mkdir()
    (tmp_path / ".staging-id3" / "model.onnx.part").write_bytes(bytes(1 << 20))
    report = describe(tmp_path, [served])
    assert report["models"] == [
        {"dir": "m@1-id1", "source": "s3://b/m@1-id1/", "mb": 87.0, "held": False},
        {"dir": "m@2-id2", "source": "s3://b/m@2-id2/", "mb": 87.0, "held": True},
    ]
    assert (report["models_mb"], report["partial_mb"], report["dir"]) == (174.0, 1.0, str(tmp_path))
    assert report["free_mb"] > 0


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_locks_and_keep_files_whose_owner_is_gone_are_pruned(tmp_path: Path) -> None:
    """Empty `.lock` files and dead processes' keep files (and their torn `.tmp`) stayed forever."""
    gone, served = published(tmp_path, "m@1-aaaaaaaaaaaaaaaa", 1.0), published(tmp_path, "m@2-bbbbbbbbbbbbbbbb", 2.0)
    for ident in ("aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb", "cccccccccccccccc", "dddddddddddddddd"):
        (tmp_path / f".{ident}.lock").touch()
    (tmp_path / ".staging-dddddddddddddddd").mkdir()  # a resumable download: its lock stays
    dead = dead_pid()
    (tmp_path / f".keep-{dead}.json").write_text("[]")
    (tmp_path / f".keep-{dead}.json.tmp").write_text("[")  # it died mid-write
    (tmp_path / f".keep-{os.getppid()}.json").write_text(json.dumps([served.name]))  # alive: kept
    (tmp_path / ".user.lock").touch()  # not a name of ours
    with flock(tmp_path / ".eeeeeeeeeeeeeeee.lock"):  # a fetch in progress, nothing on disk yet: kept
        assert prune(tmp_path, [served]) == [gone.name, ".staging-dddddddddddddddd"]
        left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(
        [
            ".bbbbbbbbbbbbbbbb.lock",
            ".eeeeeeeeeeeeeeee.lock",
            f".keep-{os.getpid()}.json",
            f".keep-{os.getppid()}.json",
            ".user.lock",
            served.name,
        ]
    )


def test_a_staging_directory_being_resumed_keeps_its_lock(tmp_path: Path) -> None:
    (tmp_path / ".staging-dddddddddddddddd").mkdir()
    with flock(tmp_path / ".dddddddddddddddd.lock"):
        assert prune(tmp_path, []) == []
    assert (tmp_path / ".dddddddddddddddd.lock").exists()


def test_a_lock_removed_while_waited_for_is_taken_again_on_the_new_file(tmp_path: Path) -> None:
    """A prune unlinks a lock file it holds; whoever waited on that file must not go on holding a lock on an
    unlinked inode beside a third process locking the new file."""
    import threading

    path = tmp_path / ".ffffffffffffffff.lock"
    got = threading.Event()
    release = threading.Event()

    def waiter() -> None:
        with flock(path):
            got.set()
            assert release.wait(10)

    with flock(path):
        thread = threading.Thread(target=waiter)
        thread.start()
        assert not got.wait(0.2)
        path.unlink()
    assert got.wait(10)
    with flock(path, blocking=False) as third:
        assert third is False  # the waiter holds the file now at `path`
    release.set()
    thread.join(10)
