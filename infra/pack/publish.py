"""Publishing a packed model directory: built aside, checked, renamed into place.

What may be written or replaced is checked before anything is (`check_output`): a model id is a name, not a
path; the output never overlaps what is being packed; and `--force` replaces only a directory that is
recognizably one of ours (a manifest of our format, and nothing in the directory that it does not list).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from handler.core.manifest import FORMAT, MANIFEST_NAME, parse_json, replace_dir, sha256_file
from handler.tasks.catalog import load_manifest  # the task's own fields checked too, as init checks them

# A model id names a directory (`models/ID` by default) and the manifest's key (`ID@VERSION`): a closed set of
# characters, no path separators, never `.` or `..` (the first character is a letter or a digit).
MODEL_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
MODEL_ID_RULE = "1-128 characters of a-z 0-9 . _ -, starting with a letter or a digit"
_MAX_MANIFEST_BYTES = 64 << 20  # far above any manifest we write (golden answers included): refused unread


class OutputError(ValueError):
    """An output directory `warmstart pack` refuses to write or replace (raised before anything is written)."""


_ID_CHARS = re.compile(r"[^a-z0-9._-]+")


def default_id(source_dir: Path) -> str:
    """The directory's name as a valid model id (MODEL_ID)."""
    name = _ID_CHARS.sub("-", source_dir.resolve().name.lower())[:128].strip("-._")
    return name or "model"


def check_model_id(model_id: str) -> str:
    if not MODEL_ID.fullmatch(model_id):
        raise OutputError(f"--id {model_id!r}: not a valid model id; valid: {MODEL_ID_RULE}")
    return model_id


def check_output(out: Path, force: bool, sources: Iterable[Path] = ()) -> Path:
    """`out`, resolved, once it is safe to publish there: not overlapping any of `sources` (the packed model's
    inputs), absent, or (with `force`) a packed model of ours. Raises OutputError / FileExistsError."""
    out = Path(out).resolve()
    for source in sources:
        _check_no_overlap(out, Path(source).resolve())
    if not os.path.lexists(out):
        return out
    if not force:
        raise FileExistsError(f"{out} exists; pass force=True (--force) to replace it")
    _check_ours(out)
    return out


def _check_no_overlap(out: Path, source: Path) -> None:
    # Replacing the source (or a directory holding it) would delete the user's model; writing inside it would
    # change what is being packed.
    if out == source or out in source.parents:
        raise OutputError(f"{out}: the output would replace {source}, which is being packed; choose another --out")
    if source in out.parents:
        raise OutputError(f"{out}: the output is inside {source}, which is being packed; choose another --out")


def _check_ours(out: Path) -> None:
    """Refuse to replace anything but a packed model directory whose manifest lists every file in it."""
    if out.is_symlink() or not out.is_dir():
        raise OutputError(f"{out}: exists and is not a directory; --force replaces only a packed model directory")
    listed = _manifest_files(out)
    foreign = [p.relative_to(out).as_posix() for p in _entries(out) if not _is_listed(p, out, listed)]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise OutputError(
            f"{out}: holds files its manifest does not list ({shown}); --force replaces only a packed model "
            "directory with nothing else in it"
        )


def _manifest_files(out: Path) -> set[str]:
    path = out / MANIFEST_NAME
    not_ours = f"{out}: not a packed model directory (--force replaces only those)"
    if path.is_symlink() or not path.is_file():
        raise OutputError(f"{not_ours}: no {MANIFEST_NAME}")
    if path.stat().st_size > _MAX_MANIFEST_BYTES:
        raise OutputError(f"{not_ours}: {MANIFEST_NAME} is {path.stat().st_size} bytes")
    try:
        raw = parse_json(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        raise OutputError(f"{not_ours}: {MANIFEST_NAME} is not valid JSON ({e})") from None
    files = raw.get("files") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or not isinstance(files, dict):
        raise OutputError(f"{not_ours}: {MANIFEST_NAME} is not a {FORMAT!r} manifest")
    return {str(name) for name in files}


def _entries(out: Path) -> list[Path]:
    """Every file, link and directory under `out`, without following links."""
    found = []
    for folder, dirs, files in os.walk(out):
        found += [Path(folder, name) for name in (*dirs, *files)]
    return sorted(found)


def _is_listed(path: Path, out: Path, listed: set[str]) -> bool:
    name = path.relative_to(out).as_posix()
    if path.is_symlink():
        return False  # we never write links: one is the user's
    if path.is_dir():
        return any(f.startswith(name + "/") for f in listed)  # a folder of listed files (none today)
    return name == MANIFEST_NAME or name in listed


def file_entries(root: Path) -> dict[str, dict[str, Any]]:
    return {
        p.relative_to(root).as_posix(): {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME
    }


def publish(
    build: Callable[[Path], dict[str, Any]],
    out: Path,
    force: bool,
    sources: Iterable[Path] = (),
    read_back: Callable[[Path], Any] = load_manifest,
) -> Path:
    """Build into a temporary sibling directory, then rename: `out` is never half-written. `read_back`: how the
    written manifest is read back (default: as a model load reads it, the task's fields checked)."""
    out = check_output(out, force, sources)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it 0700; Lambda runs the function as another user
    try:
        manifest = build(tmp)
        manifest["files"] = file_entries(tmp)
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
        read_back(tmp)  # what we wrote must read back
        check_output(out, force, sources)  # still ours: nothing was put there while we built
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
