"""bench/generate/load_options.py: which pack, graph, threads and session options each variant's child loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.generate import load_options

PACK, NO_PREPACK, Q4 = Path("/packs/opt"), Path("/packs/no-prepack"), Path("/packs/q4")


def _args(variant: str, **kw: object) -> tuple[str, str, int, bool, str, int, bool, str]:
    argv = load_options.child(variant, PACK, NO_PREPACK, Q4, decode=7, release=True, **kw)  # type: ignore[arg-type]
    root, decoder, threads, parallel, level, decode, release, library = argv[3:]
    return root, decoder, int(threads), parallel == "1", level, int(decode), release == "1", library


@pytest.mark.parametrize(
    ("variant", "want"),
    [
        ("opt", (str(PACK), "model.opt.onnx", 1, False, "")),
        ("opt-2threads", (str(PACK), "model.opt.onnx", 2, False, "")),
        ("opt-parallel-2threads", (str(PACK), "model.opt.onnx", 2, True, "")),
        ("portable", (str(PACK), "", 1, False, "")),
        ("no-prepack", (str(NO_PREPACK), "model.opt.onnx", 1, False, "")),
        ("q4op", (str(Q4), "", 1, False, "ORT_ENABLE_ALL")),
        ("q4op-noopt", (str(Q4), "", 1, False, "ORT_DISABLE_ALL")),
        ("q4op-noopt-2threads", (str(Q4), "", 2, False, "ORT_DISABLE_ALL")),
    ],
)
def test_each_variant_loads_its_own_pack_and_options(variant: str, want: tuple[str, str, int, bool, str]) -> None:
    assert _args(variant) == (*want, 7, True, "")  # no library but the pack's own config names


def test_a_q4pack_variant_opens_the_packs_q4_graph_with_its_library_and_proved_passes(tmp_path: Path) -> None:
    entry = {"model": "model.q4.onnx", "graph_optimization_level": "ORT_DISABLE_ALL"}
    (tmp_path / "manifest.json").write_text(json.dumps({"backends": {"genai": {"q4": entry}}}))
    lib = tmp_path / "libws_q4.so"
    got = _args("q4pack", q4pack=(tmp_path, lib))
    assert got == (str(tmp_path), "model.q4.onnx", 1, False, "ORT_DISABLE_ALL", 7, True, str(lib.resolve()))


def test_the_q4_variants_need_the_rewritten_pack() -> None:
    with pytest.raises(SystemExit, match="variant q4op-noopt needs --q4 DIR"):
        load_options.child("q4op-noopt", PACK, None)
