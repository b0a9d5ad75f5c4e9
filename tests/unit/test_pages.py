"""handler.core.pages: the pages of a private file mapping that no one wrote are dropped from the RSS and read
again, the same bytes, from the file; a mapping holding a written page, or a shared one, is left as it is."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest

from handler.core.pages import Released, file_mappings, mapped_files, release_file_pages

PAGE = mmap.PAGESIZE
PAGES = 64


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "weights.data"
    path.write_bytes(b"".join(bytes([i % 251]) * PAGE for i in range(PAGES)))
    return path


def touch(m: mmap.mmap) -> int:
    return sum(m[i * PAGE] for i in range(PAGES))  # one byte a page: every page mapped in


def resident(path: Path) -> int:
    return sum(rss for *_, rss in file_mappings([path]))


def test_an_unwritten_private_mapping_is_given_back_and_reads_the_same(data: Path) -> None:
    with data.open("rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # MAP_PRIVATE, read-write: as ORT maps weights
    try:
        before = touch(m)
        assert resident(data) >= PAGES * PAGE // 2
        released = release_file_pages([data], writable=[data])
        assert released.mappings == 1 and released.skipped == 0
        assert released.mapped_bytes == PAGES * PAGE
        assert PAGES * PAGE // 2 <= released.resident_bytes <= PAGES * PAGE
        assert resident(data) == 0
        assert touch(m) == before and m[:] == data.read_bytes()  # read again from the file
        assert resident(data) > 0
    finally:
        m.close()


def test_a_written_or_shared_mapping_is_left_as_it_is(data: Path) -> None:
    with data.open("rb") as f:
        written = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        shared = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # MAP_SHARED
    try:
        touch(shared)
        written[5 * PAGE] = 200  # a private copy of one page: dropping it would lose the write
        released = release_file_pages([data])
        assert released == Released(0, 0, 0, 2)
        assert written[5 * PAGE] == 200 and touch(shared) > 0
        assert resident(data) > 0
    finally:
        written.close()
        shared.close()


def test_a_writable_mapping_of_a_file_not_named_writable_is_left_as_it_is(data: Path) -> None:
    # A library's data segment is a private writable mapping: another thread may write its first page between the
    # smaps read and the madvise, and dropping it then would lose that write. Only the pack's own files (which
    # nothing writes) are released when writable; read-only mappings of any file are.
    with data.open("rb") as f:
        writable = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    try:
        touch(writable)
        assert release_file_pages([data]) == Released(0, 0, 0, 1)
        assert resident(data) > 0
        assert release_file_pages([data], writable=[data]).mappings == 1
    finally:
        writable.close()


def test_a_file_not_mapped_and_no_proc(data: Path, tmp_path: Path) -> None:
    assert release_file_pages([data]) == Released(0, 0, 0, 0)
    assert release_file_pages([data], smaps=tmp_path / "absent") == Released(0, 0, 0, 0)


def test_smaps_headers_with_spaces_in_the_path_and_other_files(tmp_path: Path) -> None:
    spaced = tmp_path / "a pack" / "model.opt.onnx.data"
    spaced.parent.mkdir()
    spaced.write_bytes(b"x")
    text = (
        f"7f0000000000-7f0000004000 rw-p 00000000 fe:00 12   {spaced}\n"
        "Rss:                  16 kB\nAnonymous:             0 kB\nVmFlags: rd wr mr mw me ac\n"
        f"7f0000004000-7f0000008000 rw-p 00004000 fe:00 12   {spaced}\n"
        "Rss:                  16 kB\nAnonymous:             4 kB\n"
        "7f0000008000-7f000000c000 r--p 00000000 fe:00 13   /usr/lib/libc.so.6\nRss: 16 kB\nAnonymous: 0 kB\n"
        "7f000000c000-7f0000010000 rw-p 00000000 00:00 0 \nRss: 16 kB\nAnonymous: 16 kB\n"
    )
    smaps = tmp_path / "smaps"
    smaps.write_text(text)
    assert file_mappings([spaced], smaps, writable=[spaced]) == [
        (0x7F0000000000, 0x7F0000004000, True, 16384),
        (0x7F0000004000, 0x7F0000008000, False, 16384),  # a written page: not dropped
    ]


def test_mapped_files_lists_this_process_files(data: Path, tmp_path: Path) -> None:
    with data.open("rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    try:
        found = mapped_files()
        assert data.resolve() in found and all(p.is_absolute() for p in found)
        assert any(p.name.startswith("libc.") or "python" in p.name for p in found)
    finally:
        m.close()
    assert mapped_files(tmp_path / "absent") == set()
