"""A generate pack's tokenizer.json with its BPE merges written as "a b" strings, the form `tokenizers` reads
fastest: parsing Qwen3's 151k merges as pairs (`[["a", "b"], ...]`, what tokenizers >= 0.20 writes) took
0.29-0.36 s of CPU at init, as strings 0.22-0.25 s (3 runs each, tokenizers 0.23; the whole file ~20% less).

Init parses the tokenizer before the first token, so the rewrite is made once at pack time, and only where it
is provably the same tokenizer: a BPE model whose merge parts hold no space (the string form splits at the
space: byte-level BPE writes a space as `Ġ`), both files parsed and written back by `tokenizers` give the same
JSON, and they encode the hard cases (infra.pack.wordpiece's, and the chat markers) to the same ids. Anything
else keeps the file as it came. `warmstart pack --from` writes it; `warmstart optimize` rewrites a generate pack
made before.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

PROBES = ("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", "Ġ ĠĠ space  two\u3000wide")


def compact_merges(text: str) -> str | None:
    """`text` (a tokenizer.json) with its merges as strings, or None where that is not provably the same
    tokenizer (not BPE, merges already strings, a part with a space, or a difference once parsed)."""
    data: dict[str, Any] = json.loads(text)
    model = data.get("model") or {}
    merges = model.get("merges")
    if model.get("type") != "BPE" or not merges or not all(isinstance(m, list) and len(m) == 2 for m in merges):
        return None
    if any(" " in part for pair in merges for part in pair):
        return None
    model["merges"] = [f"{a} {b}" for a, b in merges]
    out = json.dumps(data, ensure_ascii=False)
    return out if same_tokenizer(text, out) else None


def same_tokenizer(a: str, b: str) -> bool:
    """Whether two tokenizer.json texts are the same tokenizer: the same JSON once parsed and written back by
    `tokenizers`, and the same ids on the hard cases."""
    from tokenizers import Tokenizer

    from infra.pack.wordpiece import HARD_CASES

    ta, tb = Tokenizer.from_str(a), Tokenizer.from_str(b)
    if json.loads(ta.to_str()) != json.loads(tb.to_str()):
        return False
    cases = [*HARD_CASES, *PROBES]
    for special in (False, True):
        got_a = [e.ids for e in ta.encode_batch(cases, add_special_tokens=special)]
        if got_a != [e.ids for e in tb.encode_batch(cases, add_special_tokens=special)]:
            return False
    return True


def write_tokenizer(source: Path, dest: Path) -> bool:
    """`source` (the user's tokenizer.json) into the pack at `dest`: with its merges as strings where provably
    the same tokenizer (True), else copied as it is (False)."""
    compact = compact_merges(source.read_text(encoding="utf-8"))
    if compact is None:
        shutil.copyfile(source, dest)
        return False
    dest.write_text(compact, encoding="utf-8")
    return True


def compact_pack(model_dir: Path) -> bool:
    """A pack made before this rewrite (`warmstart optimize`): its tokenizer.json rewritten in place, the manifest's
    size and SHA-256 of it with it, where provably the same tokenizer; False where nothing changed."""
    from handler.core.manifest import MANIFEST_NAME, sha256_file

    manifest_path = model_dir / MANIFEST_NAME
    raw = json.loads(manifest_path.read_text())
    name = (raw.get("tokenizer") or {}).get("file")
    if not name or name not in raw.get("files", {}):
        return False
    path = model_dir / name
    compact = compact_merges(path.read_text(encoding="utf-8"))
    if compact is None:
        return False
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(compact, encoding="utf-8")
    os.replace(tmp, path)
    raw["files"][name] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    tmp = manifest_path.with_name(f".{MANIFEST_NAME}.tmp")
    tmp.write_text(json.dumps(raw, indent=2) + "\n")
    os.replace(tmp, manifest_path)
    return True
