"""Golden answers: at pack time, a few requests and what the packed model answers, recorded beside the manifest.

A rollout's PreTraffic hook (`warmers.pretraffic`) sends the same requests to the new Lambda version and
compares (`warmers.golden.compare`): a version that answers differently (wrong model, broken export, a dependency that
changed numerics) never gets traffic.

Written to `golden.json` (listed in the manifest's `files`, so its size and SHA-256 are recorded), named by the
manifest key `golden_file`:
`{"tolerance": {"cosine": 0.9999, "atol": 1e-4}, "cases": [{"request": {...}, "key": "embeddings", "expected": [...]}]}`
Not inside manifest.json: every start parses the manifest, and the answers' ~1,400 floats were most of that parse
(~0.6 M instructions of a start), for a file only a status request with `"golden": true` reads
(`Manifest.golden`, which also still reads the inline `golden` key of a manifest packed before).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from handler.core.errors import WarmstartError
from handler.core.manifest import MANIFEST_NAME

# The tolerance recorded with the cases; the same as `warmers.golden.TOLERANCE` (the checker's default, in
# warmer.zip), written here rather than imported so packing never needs the warmer package (the images'
# pack stage copies handler/ and infra/ only). tests/unit/test_cli.py keeps the two equal.
TOLERANCE = {"cosine": 0.9999, "atol": 1e-4}

# Short, long (past the 256-token truncation), non-ASCII: the shapes that break first.
EMBEDDING_INPUTS = (
    ["hello world"],
    ["The quick brown fox jumps over the lazy dog. " * 40, "ünïcödé ✓ 日本語のテキスト"],
)
DIGITS = 6
GOLDEN_FILE = "golden.json"


def _rounded(value: Any) -> Any:
    if hasattr(value, "tolist"):  # a numpy array or scalar: answers carry float32 arrays to the edge
        return _rounded(value.tolist())
    if isinstance(value, float):
        return round(value, DIGITS)
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def requests_for(task: str) -> list[tuple[dict[str, Any], str]]:
    """(request, response key to compare) per golden case; none for tasks without a natural probe."""
    if task == "embedding":
        return [({"inputs": list(inputs)}, "embeddings") for inputs in EMBEDDING_INPUTS]
    return []


def record(model_dir: Path, manifest: dict[str, Any]) -> dict[str, Any] | None:
    """Run the golden requests through the packed model in `model_dir` (a provisional manifest is written so
    the runtime can load it; `publish` writes the final one) and return the `golden` entry."""
    cases = requests_for(str(manifest.get("task")))
    if not cases:
        return None
    from infra.pack.publish import file_entries  # the same entries publish writes

    (model_dir / MANIFEST_NAME).write_text(json.dumps({**manifest, "files": file_entries(model_dir)}))
    from handler.core.config import Config
    from handler.runtime.invocation import Runtime

    runtime = Runtime.start(Config(model_dir=model_dir, backend=None, warmup=False), environ={}, emit=None)
    recorded = []
    for n, (request, key) in enumerate(cases, 1):
        try:
            reply = runtime.serve(request)
        except WarmstartError as e:  # NaN answers (weights that hold NaN), a model that fails: never packed
            from infra.pack.hf_export import ExportError

            raise ExportError(f"the packed model cannot answer golden request {n} of {len(cases)}: {e}") from None
        recorded.append({"request": request, "key": key, "expected": _rounded(reply[key])})
    return {"tolerance": dict(TOLERANCE), "cases": recorded}


def with_golden(build: Callable[[Path], dict[str, Any]]) -> Callable[[Path], dict[str, Any]]:
    """A packer's build step, followed by recording golden answers into `golden.json` beside the manifest it
    returns (`publish` lists the file with its size and SHA-256)."""

    def build_and_record(tmp: Path) -> dict[str, Any]:
        manifest = build(tmp)
        golden = record(tmp, manifest)
        if golden is not None:
            (tmp / GOLDEN_FILE).write_text(json.dumps(golden, separators=(",", ":")))
            manifest["golden_file"] = GOLDEN_FILE
        return manifest

    return build_and_record
