"""bench/generate/load_options.py: which pack, graph, threads and session options each variant's child loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.generate import load_options

PACK, NO_PREPACK, Q4 = Path("/packs/opt"), Path("/packs/no-prepack"), Path("/packs/q4")


def _args(variant: str) -> tuple[str, str, int, bool, str, int, bool]:
    argv = load_options.child(variant, PACK, NO_PREPACK, Q4, decode=7, release=True)
    root, decoder, threads, parallel, level, decode, release = argv[3:]
    return root, decoder, int(threads), parallel == "1", level, int(decode), release == "1"


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
    assert _args(variant) == (*want, 7, True)


def test_the_q4_variants_need_the_rewritten_pack() -> None:
    with pytest.raises(SystemExit, match="variant q4op-noopt needs --q4 DIR"):
        load_options.child("q4op-noopt", PACK, None)
