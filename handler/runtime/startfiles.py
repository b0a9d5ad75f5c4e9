"""The start's file list: which pages of which code files a cold start reads, recorded once where the function
is built (`make setup`, the image build, `layers.build`) and replayed by the prefetch thread at the next start.

Why: on a cold page cache (a new Lambda container reads its image's chunks lazily) the import chain is ~250
small `.pyc`/`.py` files and the extension modules' libraries, each read when the import reaches it, one at a
time while the CPU waits. Replayed, the kernel gets every read at once, in the order the start needs them, and
only the pages the start touched (whole libraries would be 80 MB of reads the start never makes, queued ahead
of the ones it waits for: measured slower than no prefetch at all).

Recording (`python -m handler.runtime.startrecord [--model DIR] [--out FILE]`, build time only, in a module of
its own: a start, which imports this one for its prefetch, never loads the recorder): a start runs twice in a
child process; before the second, its files' pages are evicted, after it `mincore` says which pages it read.
Paths are kept relative to the sys.path entry they were found under, so a list recorded in a build tree
resolves where the code is deployed.

Replay (`load`, stdlib only, on the prefetch thread): a missing, unreadable or stale list (another Python,
another backend) gives None and the prefetch falls back to whole libraries; a file that is gone is skipped.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

LIST = Path(__file__).with_name("startfiles.json")
VERSION = 1

Item = tuple[Path, "list[list[int]] | None"]


def open_regular(path: str | os.PathLike[str]) -> int | None:
    """A read-only descriptor of `path` if it is a regular file, else None (a hint skips what it cannot read). A
    plain `open` of a FIFO blocks until a writer comes (forever: a model directory or a start list can name one,
    and the start would hang); non-blocking it opens at once, and `fstat` of the descriptor then says what was
    opened (no window between a check and the open). A device (/dev/zero: endless) or a directory is skipped too;
    the manifest's own check reports a model file that is not regular."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:  # absent, a socket (ENXIO), a symlink loop (ELOOP)
        return None
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        regular = False
    if not regular:
        os.close(fd)
        return None
    return fd


def read_regular(path: str | os.PathLike[str]) -> bytes:
    """A regular file's bytes; FileNotFoundError for anything else (absent, a FIFO, a device)."""
    fd = open_regular(path)
    if fd is None:
        raise FileNotFoundError(f"{path}: absent or not a regular file")
    with os.fdopen(fd, "rb") as f:
        return f.read()


PROBE = 6  # files a warm-cache check samples (`warm`): the recorder writes them in the list's first line


def _head(data: bytes) -> dict[str, Any] | None:
    """The list's header line as the recorder writes it (version, interpreter, backend and the probe's files, then
    a line break before `files`): parsed alone, a warm-cache check reads ~1 KB of JSON instead of the whole list
    (callgrind: ~0.8 M instructions of a start). Any other layout: None, and the caller parses the whole file."""
    line, newline, _ = data.partition(b"\n")
    if not newline or not line.endswith(b","):
        return None
    try:
        head = json.loads(line[:-1] + b"}")
    except ValueError:
        return None
    return head if isinstance(head, dict) and isinstance(head.get("probe"), list) else None


def load(backend: str, path: Path | None = None, count: int | None = None) -> tuple[list[Item] | None, str]:
    """The recorded files resolved against this interpreter's sys.path, in start order; or None and why. With
    `count`, only that many of them, evenly spread (`sample`): what a warm-cache probe reads. With `count=PROBE`
    the recorder's header line holds them (`_head`): only that line is parsed."""
    try:
        data = read_regular(path or LIST)
        raw = (_head(data) if count == PROBE else None) or json.loads(data)
    except FileNotFoundError:
        return None, "none recorded"
    except (OSError, ValueError) as e:
        return None, f"unreadable: {type(e).__name__}"
    if not isinstance(raw, dict) or raw.get("version") != VERSION:
        return None, "stale: another format"
    if raw.get("cache_tag") != sys.implementation.cache_tag:
        return None, f"stale: recorded for {raw.get('cache_tag')}"
    if raw.get("backend") != backend:
        return None, f"stale: recorded for the {raw.get('backend')} backend"
    bases: dict[str, str | None] = {}
    items: list[Item] = []
    if count == PROBE and isinstance(raw.get("probe"), list):
        entries = raw["probe"]  # the recorder's sample(files, PROBE)
    else:
        entries = raw.get("files", [])
        entries = sample(entries, count) if count else entries
    for rel, ranges in entries:
        top = rel.split("/", 1)[0]
        if top not in bases:
            # The first sys.path entry holding it, as the import system finds it. `os.access` answers a missing
            # path with False where `os.path.exists` has os.stat raise and catches it (most entries miss: ~20k
            # instructions each), and the name is joined in place (posixpath.join is Python): the warm-cache probe
            # went from 0.41 to 0.10 M instructions (callgrind).
            bases[top] = next((e for e in sys.path if e and os.access(f"{e}/{top}", os.F_OK)), None)
        base = bases[top]
        if base is not None:
            items.append((Path(base, rel), ranges))
    return items, "recorded"


def warm(items: Sequence[Item]) -> bool:
    """Whether the page cache already holds `items`: each one's first and last range start read (one byte) with
    RWF_NOWAIT, which fails with EAGAIN when the page is not cached, ~6 us a probe. On a warm cache issuing the
    whole list's readahead cost more than it saved (1 vCPU, 11 rounds: 210 vs 195 ms, docs/coldstart.md); any
    page missing, or a kernel or filesystem without RWF_NOWAIT: False (issue them)."""
    flag = getattr(os, "RWF_NOWAIT", None)
    if flag is None or not items:
        return False
    buf = bytearray(1)
    for path, ranges in items:
        fd = open_regular(path)
        if fd is None:
            continue  # gone, or not a regular file: nothing to read either way
        try:
            size = os.fstat(fd).st_size
            for offset in {r[0] for r in (ranges[0], ranges[-1])} if ranges else (0,):
                if size > offset and os.preadv(fd, [buf], offset, flag) < 1:
                    return False
        except OSError:  # BlockingIOError (EAGAIN: not cached), EOPNOTSUPP: unknown, so issue
            return False
        finally:
            os.close(fd)
    return True


def issue(items: Iterable[Item]) -> tuple[int, str | None]:
    """Ask the kernel to read `items` ahead (posix_fadvise WILLNEED: queued, the I/O completes in the background):
    the bytes asked for, and the last error (a file that is absent is skipped silently)."""
    asked, error = 0, None
    for path, ranges in items:
        fd = open_regular(path)
        if fd is None:
            continue  # absent or not a regular file (a FIFO would block us): init reports it, not us
        try:
            if ranges is None:
                asked += os.fstat(fd).st_size
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            for offset, length in ranges or ():
                asked += length
                os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
        except OSError as e:
            error = f"{path.name}: {e}"
        finally:
            os.close(fd)
    return asked, error


def sample(items: Sequence[Any], count: int = 6) -> list[Any]:
    """`count` items evenly spread over `items`, the first and the last included."""
    if len(items) <= count:
        return list(items)
    return [items[i * (len(items) - 1) // (count - 1)] for i in range(count)]


# -- replay from interpreter start (a .pth file) ------------------------------------------------------------

PTH = "warmstart-startfiles.pth"
ISSUED = "_warmstart_startfiles"  # set on `sys` once the list was issued, so the prefetch thread skips it


def boot(root: str, listing: str) -> None:
    """Called by the .pth line at interpreter start, before awslambdaric and handler import anything: when this
    process is a start of the function at `root` (its argv names `handler`, and `root`'s `handler` is the one
    imports will find), a thread issues the list. Anything else, or any error: nothing, silently."""
    argv = getattr(sys, "orig_argv", sys.argv)
    if not any(a.startswith("handler") for a in argv[1:]):
        return
    if (os.environ.get("WARMSTART_PREFETCH") or "all").strip() in ("model", "off"):
        return  # the code prefetch switched off: this is part of it
    first = next((e for e in sys.path if e and os.path.isdir(os.path.join(e, "handler"))), None)
    if first is None or os.path.realpath(first) != root:
        return
    backend = _backend_of(listing)
    probe, _ = load(backend, Path(listing), count=PROBE)
    if not probe:
        return  # stale or broken: the prefetch thread falls back to the libraries, and its report says why
    if warm(probe):
        return  # nothing to read ahead; the prefetch thread finds the same and says so in its report
    import threading

    def run() -> None:
        issue(load(backend, Path(listing))[0] or ())  # the list resolved here, not on the start's own thread

    setattr(sys, ISSUED, True)
    threading.Thread(target=run, name="warmstart-startfiles", daemon=True).start()


def _backend_of(listing: str) -> str:
    # The hook runs before any manifest is read: the list's own backend (a start with another one reads the
    # same import chain up to the backend's module, and the prefetch thread then does the model as always).
    try:
        data = read_regular(listing)
        return str((_head(data) or json.loads(data)).get("backend", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def install_pth(site_dir: Path, listing: Path | None = None) -> Path:
    """Write the .pth line that calls `boot` at interpreter start (in an image's site-packages: Python reads
    .pth files only there, not from PYTHONPATH entries such as Lambda's /var/task or /opt/python)."""
    root = os.path.realpath(Path(__file__).resolve().parents[2])
    listing = (listing or LIST).resolve()
    here = Path(__file__).resolve()
    # One line, starting with `import` (site.py runs only those); guarded: a .pth error would print on every start.
    inner = (
        "try:\n"
        " import importlib.util as u\n"
        f" s = u.spec_from_file_location('_warmstart_startfiles', {str(here)!r})\n"
        " m = u.module_from_spec(s)\n"
        " s.loader.exec_module(m)\n"
        f" m.boot({root!r}, {str(listing)!r})\n"
        "except Exception:\n"
        " pass\n"
    )
    line = f"import os, sys; exec({inner!r}) if os.path.isfile({str(listing)!r}) else None\n"
    out = site_dir / PTH
    out.write_text(line)
    return out
