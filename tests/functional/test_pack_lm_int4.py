"""int4 packs with searched scales (infra.pack.lm_int4, `scales: mse`) against the builder's own round-to-nearest
blocks (`scales: rtn`, the default), on tiny random models: a tied one (qwen3: the LM head's blocks are also the
embedding's GatherBlockQuantized table) and an untied one (llama)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from infra.pack import lm_int4
from tests.fixtures.lm_pack import source_dir

FAMILIES = ("qwen3", "llama")


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    from infra.pack.lm_pack import pack_lm
    from infra.pack.precision import Precision

    out = tmp_path_factory.mktemp("int4-packs")
    found: dict[tuple[str, str], Path] = {}
    for family in FAMILIES:  # the int4 head (head_bits 4): its blocks searched too
        for scales in ("rtn", "mse"):
            found[(family, scales)] = pack_lm(
                source_dir(family),
                out / f"{family}-{scales}",
                precision=Precision(quantize="int4", min_quality=0.0),
                builder_options={"scales": scales, "head_bits": 4},
            )
    return found


def _reader(family: str, **options: Any) -> Any:
    from infra.pack.lm_source import read_lm_source

    return lm_int4.source_reader(read_lm_source(source_dir(family, **options)).weights)


def _error(blocks: lm_int4.Blocks, weight: Any) -> float:
    return float(((lm_int4.dequantize(blocks) - weight) ** 2).sum())


@pytest.mark.parametrize("family", FAMILIES)
def test_searched_blocks_are_closer_to_the_source_than_the_builders(
    packs: dict[tuple[str, str], Path], family: str
) -> None:
    read = _reader(family)
    ours, builders = lm_int4.read_blocks(packs[(family, "mse")]), lm_int4.read_blocks(packs[(family, "rtn")])
    assert sorted(ours) == sorted(builders) and "/lm_head/MatMul_Q4" in ours and len(ours) == 11
    total_ours = total_builder = 0.0
    for name, built in builders.items():
        source = lm_int4._proved_source(name, built, read)  # the rtn pack's blocks are the source's, proved
        assert lm_int4.is_rtn_of(built, source) and not lm_int4.is_rtn_of(ours[name], source)
        e_ours, e_builder = _error(ours[name], source), _error(built, source)
        assert e_ours <= e_builder
        total_ours, total_builder = total_ours + e_ours, total_builder + e_builder
    assert total_ours < 0.95 * total_builder


def test_requantizing_the_builders_graph_gives_the_packs_blocks(
    packs: dict[tuple[str, str], Path], tmp_path: Path
) -> None:
    """Deterministic, and independent of the data file's layout (the pack's is page-aligned, the builder's not)."""
    copy = tmp_path / "rtn"
    shutil.copytree(packs[("llama", "rtn")], copy)
    record = lm_int4.requantize(copy, _reader("llama"))
    assert record["nodes"] == 11 and record["squared_error"]["packed"] < record["squared_error"]["builder"]
    got, want = lm_int4.read_blocks(copy), lm_int4.read_blocks(packs[("llama", "mse")])
    for name in want:
        assert np.array_equal(got[name].codes, want[name].codes) and np.array_equal(got[name].scales, want[name].scales)


def test_a_source_that_is_not_the_builders_is_refused(packs: dict[tuple[str, str], Path], tmp_path: Path) -> None:
    copy = tmp_path / "rtn"
    shutil.copytree(packs[("qwen3", "rtn")], copy)
    before = (copy / "model.onnx.data").read_bytes()
    other = _reader("qwen3", seed=1)  # the same architecture and shapes, other weights
    with pytest.raises(lm_int4.RequantizeError, match=r"qkv_proj/MatMul_Q4: its int4 blocks are not the round-to"):
        lm_int4.requantize(copy, other)
    read = _reader("qwen3")
    swap = {"self_attn.q_proj": "self_attn.o_proj", "self_attn.o_proj": "self_attn.q_proj"}  # same shapes

    def swapped(name: str) -> Any:
        for a, b in swap.items():
            if f".{a}." in name:
                return read(name.replace(a, b))
        return read(name)

    with pytest.raises(lm_int4.RequantizeError, match=r"tried model\.layers\.0\.self_attn\.q_proj\.weight\+"):
        lm_int4.requantize(copy, swapped)
    with pytest.raises(lm_int4.RequantizeError, match="no source tensor of that name"):
        lm_int4.requantize(copy, lambda name: None)
    assert (copy / "model.onnx.data").read_bytes() == before  # refused at the first node, before any write


def test_greedy_decoding_of_both_against_float32(packs: dict[tuple[str, str], Path]) -> None:
    """The gate ran each graph (onnxruntime-genai's greedy search against transformers float32); the searched
    pack agrees at least as well on these models."""
    import json

    for family in FAMILIES:
        q = {s: json.loads((packs[(family, s)] / "manifest.json").read_text())["precision"] for s in ("mse", "rtn")}
        assert q["rtn"]["scheme"]["scales"] == "rtn" and "blocks" not in q["rtn"]["scheme"]
        assert q["mse"]["scheme"]["scales"] == "mse"
        mse, rtn = q["mse"]["quality"], q["rtn"]["quality"]
        assert q["mse"]["scheme"]["blocks"]["nodes"] == 11  # 2 layers x 5, the LM head
        assert mse["items"] == rtn["items"] == 8
        assert mse["top1_agreement"] >= rtn["top1_agreement"], (family, mse, rtn)


@pytest.mark.parametrize(
    ("quantize", "options", "match"),
    [
        ("int4", {"scales": "absmax"}, r"scales='absmax' for int4; valid: rtn, mse for symmetric int4"),
        ("int8", {"scales": "mse"}, r"scales='mse' for int8; valid"),
        ("int4", {"is_symmetric": False, "scales": "mse"}, r"scales='mse' for int4 \(asymmetric\); valid"),
    ],
)
def test_scales_that_do_not_apply_are_refused_before_building(
    tmp_path: Path, quantize: str, options: dict[str, Any], match: str
) -> None:
    from infra.pack.lm_pack import pack_lm
    from infra.pack.precision import Precision, PrecisionError

    with pytest.raises(PrecisionError, match=match):
        pack_lm(source_dir("llama"), tmp_path / "out", precision=Precision(quantize=quantize), builder_options=options)
    assert not (tmp_path / "out").exists()
