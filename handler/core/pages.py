"""Give back the pages of file mappings that a model's load read and its runs never read again.

ONNX Runtime maps a pack's external weights (model.onnx.data) and reads more of them while a session is built
than its runs read after: a MatMulNBits kernel packs each int4 weight and its scales into a copy of its own (in
memory, or mapped from the prepacked data file of `warmstart optimize`), so the originals are read once, at load,
and sit in the process's RSS from then on: 71 MB of scales on the Qwen3-0.6B-shaped int4 pack's prepacked
decoder, every MatMul weight (~355 MB) on its portable one (docs/benchmarks.md, "Where a generate pack's memory
goes"). `release_file_pages` drops this process's page-table entries of such mappings (madvise MADV_DONTNEED):
the page cache keeps the pages, and a page that is read again is mapped again from it (a minor fault), so only
what the runs read comes back into the RSS. The same holds for the shared libraries' code: the parts that only
the load ran (ORT's graph passes, session building) leave the RSS too (`mapped_files`: 18.6 MB more on that pack).

Safe by construction: only private mappings with no page of their own are advised (smaps' `Anonymous: 0 kB`:
no page was ever written, so the file holds exactly what they hold; ORT maps external data read-write but private
and never writes an initializer); a shared mapping, or one holding a written page, is left as it is. Called at
init, while no other thread runs the model. Linux only (elsewhere: nothing done, 0 released).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from pathlib import Path

from handler.core.records import record

MADV_DONTNEED = 4  # <sys/mman.h> on Linux (every architecture)
SMAPS = Path("/proc/self/smaps")
MAPS = Path("/proc/self/maps")


@record
class Released:
    mappings: int  # mappings advised
    mapped_bytes: int  # their size
    resident_bytes: int  # their RSS before (what the process gave back, until its runs read pages again)
    skipped: int  # mappings of the files left as they are (shared, or holding pages of their own)


def mapped_files(maps: Path = MAPS) -> set[Path]:
    """Every file this process maps (its libraries, a model's weights), from `maps` (a /proc/PID/maps)."""
    try:
        text = maps.read_text()
    except OSError:  # no /proc (not Linux)
        return set()
    found = set()
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            found.add(Path(fields[5]))
    return found


def file_mappings(
    files: Iterable[Path], smaps: Path = SMAPS, writable: Iterable[Path] = ()
) -> list[tuple[int, int, bool, int]]:
    """(start, end, may be dropped, resident bytes) of each mapping of `files` in `smaps` (a /proc/PID/smaps).
    A writable mapping may be dropped only when its file is one of `writable` (see release_file_pages)."""
    wanted = {str(Path(f).resolve()) for f in files}
    may_write = {str(Path(f).resolve()) for f in writable}
    found: list[tuple[int, int, bool, int]] = []
    current: list[int] | None = None  # [start, end, private, rss, anonymous]
    try:
        text = smaps.read_text()
    except OSError:  # no /proc (not Linux)
        return []
    for line in text.splitlines():
        if not line:
            continue
        first = line.split(maxsplit=5)
        if "-" in first[0] and len(first) >= 5 and ":" in first[3]:  # a mapping's header: addresses perms ...
            if current is not None:
                found.append((current[0], current[1], bool(current[2]) and current[4] == 0, current[3]))
            current = None
            if len(first) == 6 and first[5] in wanted:
                start, end = (int(x, 16) for x in first[0].split("-"))
                private = first[1].endswith("p") and (first[1][1] != "w" or first[5] in may_write)
                current = [start, end, int(private), 0, -1]
        elif current is not None and first[0] == "Rss:":
            current[3] = int(first[1]) * 1024
        elif current is not None and first[0] == "Anonymous:":
            current[4] = int(first[1])
    if current is not None:
        found.append((current[0], current[1], bool(current[2]) and current[4] == 0, current[3]))
    return found


def release_file_pages(files: Iterable[Path], smaps: Path = SMAPS, writable: Iterable[Path] = ()) -> Released:
    """Drop this process's resident pages of the private, unwritten mappings of `files` (see the module).

    A writable mapping only where its file is one of `writable` (the pack's own weights, which nothing writes): a
    library's data segment is a writable private mapping too, and another thread could write its first page
    between the smaps read and the madvise; dropping that page would lose the write. Read-only mappings (code,
    constants) cannot be written, so any file's are released."""
    mappings = file_mappings(files, smaps, writable)
    if not mappings:
        return Released(0, 0, 0, 0)
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return Released(0, 0, 0, len(mappings))
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    done = skipped = 0
    mapped = resident = 0
    for start, end, droppable, rss in mappings:
        if droppable and madvise(start, end - start, MADV_DONTNEED) == 0:
            done += 1
            mapped += end - start
            resident += rss
        else:
            skipped += 1
    return Released(done, mapped, resident, skipped)


def release_after_load(root: Path) -> Released:
    """What a model's load read and its runs do not, given back at the end of its load: every mapped file's pages
    (release_file_pages), writable mappings only of the files under `root` (the model's own)."""
    mapped = mapped_files()
    root = root.resolve()
    return release_file_pages(mapped, writable=[f for f in mapped if f.is_relative_to(root)])
