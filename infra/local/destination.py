"""The on-failure destination (`--on-failure FILE`): one JSON record a line for each dropped Event invoke.

Nothing about that file may stop the emulator: a path whose open blocks (a FIFO with no reader, some
devices) would freeze the event loop, and with it every invoke and even SIGTERM. So the path is checked
at startup (`check`), records are written by one writer thread (in order) with a non-blocking open that
takes only a regular file, and a write that fails is one JSON line on stderr, not a traceback.
"""

from __future__ import annotations

import json
import os
import queue
import stat
import sys
import threading
from pathlib import Path

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
_STOP = object()


class DestinationError(ValueError):
    """The on-failure path cannot take records (the message says what was found there)."""


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def check(path: str) -> None:
    """Raise DestinationError unless `path` is a writable regular file, or absent in an existing directory."""
    folder = Path(path).absolute().parent
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is not a directory"
        raise DestinationError(f"{path}: its directory {folder} {what}")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if not os.access(folder, os.W_OK):
            raise DestinationError(f"{path}: its directory {folder} is not writable") from None
        return
    except OSError as exc:
        raise DestinationError(f"{path}: {exc.strerror}") from None
    kind = _kind(mode)
    if kind is not None:
        raise DestinationError(f"{path}: is {kind}, not a regular file")
    if not os.access(path, os.W_OK):
        raise DestinationError(f"{path}: is not writable")


def append(path: str, line: bytes) -> None:
    """Append one line to a regular file; never blocks on open (O_NONBLOCK) and refuses anything else."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    fd = os.open(path, flags, 0o644)
    try:
        kind = _kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise OSError(f"{path} is {kind}, not a regular file")
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


class RecordWriter:
    """Writes records to the destination on its own daemon thread, in the order they were dropped."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="on-failure-writer", daemon=True)
        self._thread.start()

    def put(self, record: dict[str, object]) -> None:
        self._queue.put(record)

    def close(self, timeout: float = 2.0) -> None:
        """Write what is queued (for at most `timeout` seconds: the thread is a daemon, never waited for)."""
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def _run(self) -> None:
        while (record := self._queue.get()) is not _STOP:
            assert isinstance(record, dict)
            try:
                append(self.path, (json.dumps(record) + "\n").encode())
            except OSError as exc:
                context = record.get("requestContext")
                request_id = context.get("requestId") if isinstance(context, dict) else None
                failure = {
                    "warmstart": "on_failure",
                    "level": "ERROR",
                    "message": "on-failure destination record not written",
                    "path": self.path,
                    "requestId": request_id,
                    "error": str(exc),
                }
                sys.stderr.write(json.dumps(failure) + "\n")
                sys.stderr.flush()
