"""Publishing a packed model directory: built aside, checked, renamed into place."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from handler.core.manifest import MANIFEST_NAME, load_manifest, replace_dir, sha256_file


def file_entries(root: Path) -> dict[str, dict[str, Any]]:
    return {
        p.relative_to(root).as_posix(): {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME
    }


def publish(build: Callable[[Path], dict[str, Any]], out: Path, force: bool) -> Path:
    """Build into a temporary sibling directory, then rename: `out` is never half-written."""
    out = out.resolve()
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists; pass force=True (--force) to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it 0700; Lambda runs the function as another user
    try:
        manifest = build(tmp)
        manifest["files"] = file_entries(tmp)
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
        load_manifest(tmp)  # what we wrote must read back
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
