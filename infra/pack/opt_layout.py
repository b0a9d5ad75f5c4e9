"""The pre-optimized model's data file laid out for a cold start (pack time, inside `warmstart optimize`).

ONNX Runtime saves model.opt.onnx.data in its own order: the embedding table first, then each MatMul weight's
original beside its prepacked copy. A start reads the originals once at session creation (ORT maps each, reads
it whole, then unmaps it: measured with `perf trace` page faults and munmap under strace), its first run
reads the prepacked copies and the other small tensors, and the embedding tables only a few rows each. On a disk
with a large readahead window (8 MB here) every fault on an uncached page reads a window around it, so a cold
start read 93 of the file's 133 MB for all-MiniLM-L6-v2 (81 MB needed, the rest the tables' windows), and the
ranges recorded for the prefetch (25 pieces, 33.8 MB) left out the originals and two of each Attention's three
packed buffers.

`relayout` rewrites the file with every buffer at a page-aligned offset in three groups, in the order a start
reads them: the originals of the prepacked weights (session creation), the prepacked copies and every other
tensor except an embedding table (the first run; in the order the graph's nodes first use them), then the
embedding tables, smallest first, last in the file (their rows are read anywhere: the readahead around them
stops at the end of the file instead of running into weights). What a start reads is then one span from offset
0, the manifest's `touched_ranges`, which init's prefetch asks the kernel for in one request. Only the `offset`
entries of the external data (and the offsets inside each `prepacked_N` value) change; every buffer's bytes are
copied and compared, and optimize() then proves the model's outputs bit-identical on the relaid file.

What cannot be laid out safely (a buffer outside the file, two buffers overlapping, another data file, an
unreadable prepacked entry, a tensor in a node attribute with external data) is refused: LayoutError.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAGE = 4096  # ONNX Runtime maps an external tensor in place only at a page-aligned offset

_CHUNK = 1 << 22
LAYOUT_VERSION = 1  # the `layout` record's "version": raised when the order changes
# The groups, in file order: the originals of prepacked weights (read at session creation), what the first run
# reads, the embedding tables (a few rows read; last, so the readahead around them stops at the end of the file).
LOAD, RUN, TABLE = 0, 1, 2


class LayoutError(ValueError):
    """A model's external data cannot be laid out (the optimized copy's here, a generate pack's in
    infra.pack.lm_layout), or a laid-out file does not match its graph."""


@dataclass
class Buffer:
    """One byte range of the data file and the entry of the graph that names it."""

    tensor: Any  # onnx.TensorProto
    key: str  # "offset", or a prepacked_N key
    index: int  # which of a prepacked entry's buffers (0 for "offset")
    offset: int
    length: int
    group: int = RUN  # LOAD, RUN or TABLE


def _external(tensor: Any) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def _int(value: str, what: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise LayoutError(f"{what}: {value!r} is not a byte count") from None
    if n < 0:
        raise LayoutError(f"{what}: {n} is negative")
    return n


def packed_buffers(value: str, what: str) -> list[tuple[int, int, str]]:
    """A prepacked entry's buffers: "<kernel>+<hash>|<offset>;<length>;<flag>[|...]" -> [(offset, length, flag)]."""
    parts = value.split("|")
    if len(parts) < 2 or not parts[0]:
        raise LayoutError(f"{what}: {value!r} is not '<kernel>+<hash>|<offset>;<length>;<flag>...'")
    out = []
    for part in parts[1:]:
        fields = part.split(";")
        if len(fields) != 3:
            raise LayoutError(f"{what}: buffer {part!r} is not '<offset>;<length>;<flag>'")
        out.append((_int(fields[0], what), _int(fields[1], what), fields[2]))
    return out


def buffers(graph: Any, data: str, size: int, where: str = "") -> list[Buffer]:
    """Every byte range of `data` the graph names, each checked: in the file, not overlapping another."""
    tables = embedding_tables(graph)
    found: list[Buffer] = []
    for tensor in graph.graph.initializer:
        info = _external(tensor)
        if not info:
            continue
        what = f"{where}initializer {tensor.name!r}"
        if info.get("location") != data or "offset" not in info or "length" not in info:
            raise LayoutError(f"{what}: external data {info}: expected {data!r} with an offset and a length")
        packed = sorted(k for k in info if k.startswith("prepacked"))
        group = LOAD if packed else TABLE if tensor.name in tables else RUN
        found.append(Buffer(tensor, "offset", 0, _int(info["offset"], what), _int(info["length"], what), group))
        for key in packed:
            for i, (offset, length, _) in enumerate(packed_buffers(info[key], f"{what} {key}")):
                found.append(Buffer(tensor, key, i, offset, length, RUN))
    for node in graph.graph.node:
        for attr in node.attribute:
            if any(_external(t) for t in [attr.t, *attr.tensors]):
                raise LayoutError(f"{where}node {node.name!r} has an attribute tensor with external data")
    end, last = 0, ""
    for b in sorted(found, key=lambda b: (b.offset, b.length)):
        name = f"{b.tensor.name!r} ({b.key})"
        if b.offset + b.length > size:
            raise LayoutError(f"{where}{name} ends at {b.offset + b.length}, past the data file's {size} bytes")
        if b.offset < end:
            raise LayoutError(f"{where}{name} at {b.offset} overlaps {last}, which ends at {end}")
        end, last = b.offset + b.length, name
    return found


# Lookups that read a few rows of their table input(s): op type -> the inputs that are tables.
_LOOKUPS = {"Gather": (0,), "GatherBlockQuantized": (0,), "EmbedLayerNormalization": (2, 3, 4)}


def embedding_tables(graph: Any) -> set[str]:
    """The tables that only lookups take (a Gather's, a GatherBlockQuantized's, such as the table ONNX Runtime
    folds out of an 8-bit tied head, and a fused EmbedLayerNormalization's word, position and segment tables):
    read a few rows at a time. A table another node also takes (a tied head's MatMulNBits) is read whole."""
    tables: set[str] = set()
    other: set[str] = set()
    for n in graph.graph.node:
        looked_up = {n.input[i] for i in _LOOKUPS.get(n.op_type, ()) if i < len(n.input) and n.input[i]}
        tables |= looked_up
        other |= {t for t in n.input if t and t not in looked_up}
    return tables - other


def _order(graph: Any, found: list[Buffer]) -> list[Buffer]:
    """The groups in turn; inside one, the order of the first node that takes each tensor (then file order), the
    tables smallest first (a position table's rows are read from its start; the word table's anywhere)."""
    first: dict[str, int] = {}
    for n, node in enumerate(graph.graph.node):
        for name in node.input:
            first.setdefault(name, n)
    late = len(graph.graph.node)
    return sorted(
        found, key=lambda b: (b.group, b.length if b.group == TABLE else 0, first.get(b.tensor.name, late), b.offset)
    )


def relayout(model_path: Path, data: str) -> dict[str, Any]:
    """Rewrite `model_path` and its data file `data` (beside it) in the start's order, every buffer at a PAGE
    offset; returns the record (the bytes of each group). Both files are replaced only once the copy is
    proved byte for byte."""
    import onnx  # pack time only

    data_path = model_path.with_name(data)
    graph = onnx.load(str(model_path), load_external_data=False)
    found = buffers(graph, data, data_path.stat().st_size, f"{model_path.name}: ")
    new_data, new_model = data_path.with_name(f".{data}.layout"), model_path.with_name(f".{model_path.name}.layout")
    sizes = [0, 0, 0]
    try:
        moved: list[tuple[Buffer, int]] = []
        with open(data_path, "rb") as src, open(new_data, "wb") as dst:
            at = 0
            for b in _order(graph, found):
                at = -(-at // PAGE) * PAGE
                copy_range(src.fileno(), dst.fileno(), b.offset, at, b.length)
                moved.append((b, at))
                sizes[b.group] += b.length
                at += b.length
            dst.truncate(-(-at // PAGE) * PAGE)  # whole pages: the last buffer's page is mapped whole
        with open(data_path, "rb") as src, open(new_data, "rb") as dst:
            for b, at in moved:
                if not _same(src.fileno(), b.offset, dst.fileno(), at, b.length):
                    raise LayoutError(f"{data_path}: {b.tensor.name!r} ({b.key}) differs after the copy")
        for b, at in moved:
            _set_offset(b, at)
        new_model.write_bytes(graph.SerializeToString())  # the graph only: its tensors stay in `data`
        # What was written must read back as a consistent, page-aligned layout before it replaces the original.
        _aligned(
            buffers(onnx.load(str(new_model), load_external_data=False), data, new_data.stat().st_size), model_path
        )
        os.replace(new_data, data_path)
        os.replace(new_model, model_path)
    finally:
        new_data.unlink(missing_ok=True)
        new_model.unlink(missing_ok=True)
    return {
        "version": LAYOUT_VERSION,
        "page": PAGE,
        "load_bytes": sizes[LOAD],
        "run_bytes": sizes[RUN],
        "table_bytes": sizes[TABLE],
    }


def _set_offset(b: Buffer, at: int) -> None:
    for entry in b.tensor.external_data:
        if entry.key != b.key:
            continue
        if b.key == "offset":
            entry.value = str(at)
        else:
            head, *parts = entry.value.split("|")
            fields = parts[b.index].split(";")
            parts[b.index] = ";".join([str(at), *fields[1:]])
            entry.value = "|".join([head, *parts])


def check(model_path: Path, data: str) -> list[Buffer]:
    """The laid-out file's buffers, refused (LayoutError) when one is outside the file, overlaps another or is
    not at a PAGE offset."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False)
    return _aligned(buffers(graph, data, model_path.with_name(data).stat().st_size, f"{model_path.name}: "), model_path)


def _aligned(found: list[Buffer], model_path: Path) -> list[Buffer]:
    unaligned = [f"{b.tensor.name!r} ({b.key}) at {b.offset}" for b in found if b.offset % PAGE]
    if unaligned:
        raise LayoutError(f"{model_path.name}: not at a {PAGE}-byte offset: {', '.join(unaligned[:5])}")
    return found


def copy_range(src: int, dst: int, offset: int, at: int, length: int) -> None:
    """`length` bytes from `src` at `offset` to `dst` at `at`: copy_file_range (in the kernel), else pread/pwrite."""
    done = 0
    while done < length:
        try:
            n = os.copy_file_range(src, dst, length - done, offset + done, at + done)
        except OSError:
            n = 0
        if n <= 0:
            chunk = os.pread(src, min(length - done, _CHUNK), offset + done)
            if not chunk:
                raise LayoutError(f"short read at {offset + done}")
            n = os.pwrite(dst, chunk, at + done)
        done += n


def _same(a: int, at_a: int, b: int, at_b: int, length: int) -> bool:
    done = 0
    while done < length:
        n = min(length - done, _CHUNK)
        if os.pread(a, n, at_a + done) != os.pread(b, n, at_b + done):
            return False
        done += n
    return True


__all__ = [
    "LAYOUT_VERSION",
    "Buffer",
    "LayoutError",
    "buffers",
    "check",
    "copy_range",
    "embedding_tables",
    "packed_buffers",
    "relayout",
]
