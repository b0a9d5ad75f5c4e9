"""bench/generate/rss.py's accounting, offline: the smaps split and the target it compares against (no engine is
started here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.generate import rss

SMAPS = """\
7f0000000000-7f0000100000 r--s 00000000 08:01 12 /pack/model.opt.onnx.data
Size:               1024 kB
Rss:                 800 kB
Anonymous:             0 kB
7f0000100000-7f0000200000 r--s 00100000 08:01 12 /pack/model.opt.onnx.data
Rss:                 200 kB
Anonymous:             0 kB
55d000000000-55d000400000 rw-p 00000000 00:00 0                          [heap]
Rss:                3072 kB
Anonymous:          3072 kB
7f1000000000-7f1000100000 rw-p 00000000 00:00 0
Rss:                1024 kB
Anonymous:          1024 kB
7f2000000000-7f2000100000 rw-p 00010000 08:01 13 /usr/lib/libfoo.so
Rss:                 512 kB
Anonymous:           256 kB
"""


def test_smaps_split_into_file_backed_and_anonymous_by_mapping() -> None:
    got = rss.split_smaps(SMAPS)
    assert got["rss_mb"] == pytest.approx((800 + 200 + 3072 + 1024 + 512) / 1024)
    assert got["anon_mb"] == pytest.approx((3072 + 1024 + 256) / 1024)
    assert got["file_mb"] == pytest.approx((800 + 200 + 256) / 1024)  # a private .so page written is anonymous
    assert got["top"] == {"[heap]": 3, "model.opt.onnx.data": 1, "[anon]": 1, "libfoo.so": 0}


def _pack(tmp_path: Path) -> Path:
    (tmp_path / "model.onnx.data").write_bytes(b"\0" * 3 * 2**20)
    (tmp_path / "model.opt.onnx.data").write_bytes(b"\0" * 5 * 2**20)
    genai = {
        "files": ["genai_config.json", "model.onnx", "model.onnx.data"],
        "optimized": {"files": ["model.opt.onnx", "model.opt.onnx.data"]},
    }
    manifest = {
        "backends": {"genai": genai},
        "generation": {"kv": {"layers": 2, "kv_heads": 4, "head_dim": 8, "dtype": "float32"}},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path


def test_the_target_counts_the_weights_once_the_requests_kv_and_150_mb(tmp_path: Path) -> None:
    pack = _pack(tmp_path)
    kv = 2 * 2 * 4 * 8 * 4 * 1024 / 2**20  # keys and values x layers x heads x dim x float32 x 1,024 tokens
    # the weights once, as packed, whichever decoder opens them: the optimized decoder's data file holds the
    # builder's originals beside the prepacked copies, and counting it would excuse the copy the target is about
    assert rss.target_mb(pack, 1024) == {"weights_mb": 3.0, "kv_mb": kv, "target_mb": 3.0 + kv + 150}


def test_variants_parse_and_a_malformed_one_is_refused() -> None:
    assert rss.parse_variant("base=") == ("base", {})
    assert rss.parse_variant("off=WARMSTART_GENAI_OPTIMIZED=off,X=1") == (
        "off",
        {"WARMSTART_GENAI_OPTIMIZED": "off", "X": "1"},
    )
    for bad in ("base", "=X=1", "v=X"):
        with pytest.raises(SystemExit, match="NAME=ENV=VALUE"):
            rss.parse_variant(bad)


def test_evict_drops_every_file_of_the_pack_from_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pack = _pack(tmp_path)
    advised: list[tuple[str, int]] = []
    real = rss.os.posix_fadvise

    def fadvise(fd: int, offset: int, length: int, advice: int) -> None:
        advised.append((Path(f"/proc/self/fd/{fd}").resolve().name, advice))
        real(fd, offset, length, advice)

    monkeypatch.setattr(rss.os, "posix_fadvise", fadvise)
    rss.evict(pack)  # the first start of each pack fills the cache as an instance's start does
    names = sorted(p.name for p in pack.iterdir())
    assert advised == [(name, rss.os.POSIX_FADV_DONTNEED) for name in names]
