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
_MAX_MANIFEST_BYTES = 64 << 20  # far above any manifest we write: refused unread


class OutputError(ValueError):
    """An output directory `warmstart pack` refuses to write or replace (raised before anything is written)."""


class OutputExistsError(FileExistsError):
    """The output directory exists and replacing it was not asked for. The message names the Python argument;
    the CLI says its flag (infra.cli.pack)."""

    def __init__(self, out: Path) -> None:
        super().__init__(f"{out} exists; pass force=True to replace it")
        self.out = out


_ID_CHARS = re.compile(r"[^a-z0-9._-]+")
# Directory names that say where a model lies, not what it is: a package's `model/`, a hub cache's
# `snapshots/<commit sha>`, a training run's `output/`. The id comes from further up (or the model's own name).
_GENERIC_NAMES = frozenset({"model", "models", "snapshot", "snapshots", "main", "latest", "final", "output", "outputs"})
_COMMIT = re.compile(r"[0-9a-f]{40}")
# A hub repo name as `_name_or_path` holds one (`org/name` or `name`); anything else there is a local path.
_HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
_HUB_CACHE_REPO = re.compile(r"models--(.+)")  # the hub cache's `models--org--name/snapshots/<sha>`


def default_id(source_dir: Path) -> str:
    """The model's own name as a valid model id (MODEL_ID), first found of: sentence-transformers' model card
    data (`config_sentence_transformers.json`), the hub cache's repo (`models--org--name/snapshots/<sha>` ->
    `name`), the directory's name unless generic (`model`, `snapshots`, a commit sha), `config.json`'s
    `_name_or_path` when a hub name (last: a fine-tune's names the model it was trained from, and a
    sentence-transformers directory's always does, so it is not read there), a parent directory's name that
    is not generic; else `model`."""
    root = Path(source_dir).resolve()
    found = _card_name(root) or _hub_cache_name(root)
    if found:
        return found
    if not _generic(root.name) and _as_id(root.name):
        return _as_id(root.name)
    named = _hub_name(root)
    if named:
        return named
    for parent in root.parents:
        if not _generic(parent.name) and _as_id(parent.name):
            return _as_id(parent.name)
    return "model"


def default_version(content_sha256: str, task: str, precision: str = "float32", scheme: str = "") -> str:
    """A version that changes when the weights (the source's content hash), the task, the precision
    (`float32`, `int8`, `bfloat16`, ...) or the build's scheme (a generate pack's builder options) change: 12 hex
    digits of a hash over them, with the precision appended when reduced (`3f2a9c0d1e4b-int8`), so two
    precisions of one model are two `id@version`s."""
    import hashlib

    key = f"{content_sha256}\n{task}\n{precision}" + (f"\n{scheme}" if scheme else "")
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return digest if precision == "float32" else f"{digest}-{precision}"


def precision_suffix(version: str, precision: str = "float32") -> str:
    """A given version (the default model's package version) marked with a reduced precision: `0.1.0-int8`."""
    return version if precision == "float32" else f"{version}-{precision}"


def _as_id(name: str) -> str:
    return _ID_CHARS.sub("-", name.lower())[:128].strip("-._")


def _generic(name: str) -> bool:
    return name.lower() in _GENERIC_NAMES or bool(_COMMIT.fullmatch(name.lower()))


def _read_json(path: Path) -> Any:
    try:
        return parse_json(path.read_bytes()) if path.is_file() and path.stat().st_size < (1 << 20) else None
    except (OSError, ValueError, UnicodeDecodeError):
        return None  # an unreadable file names nothing; read_source reports what is wrong with it


def _repo_name(name: object) -> str:
    """`org/name` or `name` as an id (`name`), or "" when not a hub name."""
    if not isinstance(name, str) or not _HUB_NAME.fullmatch(name.strip()):
        return ""
    return _as_id(name.strip().rsplit("/", 1)[-1])


def _card_name(root: Path) -> str:
    raw = _read_json(root / "config_sentence_transformers.json")
    if not isinstance(raw, dict):
        return ""
    card = raw.get("model_card_data")
    for where in (card if isinstance(card, dict) else {}, raw):
        for key in ("model_id", "model_name"):
            name = _repo_name(where.get(key))
            if name:
                return name
    return ""


def _hub_cache_name(root: Path) -> str:
    for folder in (root, *root.parents):
        if folder.parent.name == "snapshots":
            match = _HUB_CACHE_REPO.fullmatch(folder.parent.parent.name)
            return _as_id(match.group(1).split("--", 1)[-1]) if match else ""
    return ""


def _hub_name(root: Path) -> str:
    if (root / "modules.json").is_file():
        return ""  # a sentence-transformers directory's config.json names the transformer it was built on
    raw = _read_json(root / "config.json")
    name = raw.get("_name_or_path") if isinstance(raw, dict) else None
    if not isinstance(name, str) or name.startswith((".", "~")) or Path(name).exists():
        return ""
    return _repo_name(name)


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
        raise OutputExistsError(out)
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
