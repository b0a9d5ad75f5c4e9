"""infra/pack/bpe_merges.py: a generate pack's tokenizer.json gets its BPE merges as "a b" strings (parsed faster at
init) only where that is provably the same tokenizer; anything else is packed as it came."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.pack.bpe_merges import compact_merges, same_tokenizer, write_tokenizer
from tests.lm_models import build_lm_tokenizer


@pytest.fixture(scope="module")
def pairs_json() -> str:
    text: str = build_lm_tokenizer("qwen3").to_str()
    assert all(isinstance(m, list) for m in json.loads(text)["model"]["merges"])  # tokenizers >= 0.20 writes pairs
    return text


def test_pair_merges_become_strings_and_encode_the_same(pairs_json: str, tmp_path: Path) -> None:
    out = compact_merges(pairs_json)
    assert out is not None
    merges = json.loads(out)["model"]["merges"]
    assert merges and all(isinstance(m, str) and m.count(" ") == 1 for m in merges)
    assert same_tokenizer(pairs_json, out)
    src = tmp_path / "tokenizer.json"
    src.write_text(pairs_json, encoding="utf-8")
    assert write_tokenizer(src, tmp_path / "packed.json") and (tmp_path / "packed.json").read_text() == out
    assert compact_merges(out) is None  # already strings: nothing to do


def test_what_is_not_provably_the_same_is_packed_as_it_came(pairs_json: str, tmp_path: Path) -> None:
    spaced = json.loads(pairs_json)
    spaced["model"]["merges"][0] = ["a b", "c"]  # the string form would split this part at its space
    assert compact_merges(json.dumps(spaced)) is None
    wordpiece = {**json.loads(pairs_json), "model": {"type": "WordPiece", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}}
    assert compact_merges(json.dumps(wordpiece)) is None
    fewer = json.loads(pairs_json)
    fewer["model"]["merges"] = fewer["model"]["merges"][:-5]  # another tokenizer: the proof tells them apart
    assert not same_tokenizer(pairs_json, json.dumps(fewer))
    src = tmp_path / "tokenizer.json"
    src.write_text(json.dumps(spaced), encoding="utf-8")
    assert not write_tokenizer(src, tmp_path / "packed.json")
    assert (tmp_path / "packed.json").read_bytes() == src.read_bytes()


def test_optimize_rewrites_a_pack_made_before_and_its_manifest(pairs_json: str, tmp_path: Path) -> None:
    import hashlib

    from infra.pack.bpe_merges import compact_pack

    (tmp_path / "tokenizer.json").write_text(pairs_json, encoding="utf-8")
    old = {"size": 1, "sha256": "0" * 64}
    manifest = {"task": "generate", "tokenizer": {"file": "tokenizer.json"}, "files": {"tokenizer.json": old}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert compact_pack(tmp_path)
    data = (tmp_path / "tokenizer.json").read_bytes()
    assert data.decode() == compact_merges(pairs_json)
    entry = json.loads((tmp_path / "manifest.json").read_text())["files"]["tokenizer.json"]
    assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}  # what init's check reads
    assert not compact_pack(tmp_path)  # once is enough
