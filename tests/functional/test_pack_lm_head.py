"""int4 packs with an 8-bit LM head (`head_bits: 8`, infra.pack.lm_head) beside the int4 head (`head_bits: 4`),
on tiny random models: a tied one (qwen3: the embedding's GatherBlockQuantized reads the head's 8-bit blocks) and
an untied one (llama: a float embedding)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from infra.pack import lm_head, lm_int4
from tests.fixtures.lm_pack import source_dir
from tests.lm_models import HIDDEN

FAMILIES = ("qwen3", "llama")


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], Path]:
    from infra.pack.lm_pack import pack_lm
    from infra.pack.precision import Precision

    out = tmp_path_factory.mktemp("head-packs")
    packs: dict[tuple[str, int], Path] = {}
    for family in FAMILIES:
        # (family, 4), (family, 8): the int4 head and the default 8-bit head (blocks of 64: the tiny models' hidden
        # size); (family, 32): the 8-bit head in the builder's blocks of 32 (`head_block: 32`)
        for key, options in ((4, {"head_bits": 4}), (8, {"head_bits": 8}), (32, {"head_bits": 8, "head_block": 32})):
            packs[(family, key)] = pack_lm(
                source_dir(family),
                out / f"{family}-{key}",
                precision=Precision(quantize="int4", min_quality=0.0),
                builder_options=dict(options),
            )
    return packs


def _model(pack: Path) -> Any:
    import onnx

    return onnx.load(str(pack / "model.onnx"), load_external_data=False)


def _attrs(node: Any) -> dict[str, Any]:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _precision(pack: Path) -> dict[str, Any]:
    return dict(json.loads((pack / "manifest.json").read_text())["precision"])


@pytest.mark.parametrize("family", FAMILIES)
def test_the_heads_bits_are_recorded_and_built(packs: dict[tuple[str, int], Path], family: str) -> None:
    for bits in (4, 8):
        pack = packs[(family, bits)]
        precision = _precision(pack)
        assert precision["scheme"]["head_bits"] == bits
        assert "head_bits" not in precision["builder_options"]  # ours: passed to the builder as its own option
        model = _model(pack)
        head = lm_head.head_node(model)
        assert head is not None and _attrs(head)["bits"] == bits and lm_head.head_bits(pack) == bits
        graph = model.graph
        body = {_attrs(n)["bits"] for n in graph.node if n.op_type == "MatMulNBits" and n is not head}
        assert body == {4}  # the int4 body whatever the head
        gathers = [n for n in graph.node if n.op_type == "GatherBlockQuantized"]
        if family == "llama":  # untied: the embedding stays a float Gather
            assert gathers == [] and "tied_head" not in precision["scheme"]
            continue
        (gather,) = gathers
        assert _attrs(gather)["bits"] == bits and gather.input[2] == head.input[2]
        assert _attrs(gather)["block_size"] == _attrs(head)["block_size"]  # one set of blocks, read by both
        if bits == 8:  # the builder's dangling names mended, then proved (infra.pack.lm_head)
            assert precision["scheme"]["tied_head"] == {"tied": "model.embed_tokens.weight", "rows_checked": 257}
        else:
            assert "tied_head" not in precision["scheme"]
    # one body: the 8-bit-head pack's int4 blocks are the 4-bit-head pack's, byte for byte
    four, eight = lm_int4.read_blocks(packs[(family, 4)]), lm_int4.read_blocks(packs[(family, 8)])
    assert set(four) == {*eight, "/lm_head/MatMul_Q4"}  # read_blocks: the 4-bit nodes
    for name, blocks in eight.items():
        assert np.array_equal(blocks.codes, four[name].codes) and np.array_equal(blocks.scales, four[name].scales)
    for name, blocks in lm_int4.read_blocks(packs[(family, 32)]).items():  # the head's block leaves the body alone
        assert np.array_equal(blocks.codes, four[name].codes) and np.array_equal(blocks.scales, four[name].scales)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_8_bit_head_is_closer_to_the_source_and_the_gate_agrees_at_least_as_well(
    packs: dict[tuple[str, int], Path], family: str
) -> None:
    read = lm_int4.source_reader(tuple(sorted(source_dir(family).glob("*.safetensors"))))
    source = read("lm_head.weight")
    if source is None:
        source = read("model.embed_tokens.weight")
    errors = {}
    for bits in (4, 8):
        pack = packs[(family, bits)]
        model = _model(pack)
        head = lm_head.head_node(model)
        assert head is not None
        inits = {t.name: t for t in model.graph.initializer}
        a = _attrs(head)
        codes = lm_int4._read(inits[head.input[1]], pack)
        blocks = lm_int4.Blocks(
            codes.reshape(a["N"], -1, a["block_size"] * bits // 8),
            lm_int4._read(inits[head.input[2]], pack).reshape(a["N"], -1),
            a["block_size"],
            a["K"],
            bits,
        )
        assert lm_int4.is_rtn_of(blocks, source)  # the builder's (MLAS) round-to-nearest at either width
        errors[bits] = float(((lm_int4.dequantize(blocks) - source) ** 2).sum())
    assert errors[8] < errors[4] / 100  # 16x finer steps: ~256x less squared error
    q = {bits: _precision(packs[(family, bits)])["quality"] for bits in (4, 8)}
    assert q[8]["items"] == q[4]["items"] == 8
    assert q[8]["top1_agreement"] >= q[4]["top1_agreement"], q


def _head_blocks(pack: Path) -> lm_int4.Blocks:
    model = _model(pack)
    head = lm_head.head_node(model)
    assert head is not None
    return lm_int4.node_blocks(head, {t.name: t for t in model.graph.initializer}, pack)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_8_bit_head_is_in_blocks_of_head_block_proved_from_the_source(
    packs: dict[tuple[str, int], Path], family: str
) -> None:
    read = lm_int4.source_reader(tuple(sorted(source_dir(family).glob("*.safetensors"))))
    name = "lm_head.weight" if read("lm_head.weight") is not None else "model.embed_tokens.weight"
    source = read(name)
    default, builders = packs[(family, 8)], packs[(family, 32)]
    scheme, theirs = _precision(default)["scheme"], _precision(builders)["scheme"]
    assert (scheme["head_block"], theirs["head_block"]) == (HIDDEN, 32)  # the default: 128 or less, dividing 64
    record = scheme["head_reblocked"]
    assert {k: record[k] for k in ("from", "block", "source")} == {"from": 32, "block": HIDDEN, "source": name}
    assert record.get("rows_checked") == (257 if family == "qwen3" else None)  # the tied gather's rows proved
    assert "head_reblocked" not in theirs
    ours, built = _head_blocks(default), _head_blocks(builders)
    assert (ours.block, built.block) == (HIDDEN, 32)
    assert ours.scales.shape == (source.shape[0], 1) and built.scales.shape == (source.shape[0], 2)
    assert lm_int4.is_rtn_of(ours, source) and lm_int4.is_rtn_of(built, source)
    assert not np.array_equal(ours.scales, built.scales[:, :1])  # re-quantized, not the builder's first half
    assert (
        json.loads((default / "manifest.json").read_text())["version"]
        != (json.loads((builders / "manifest.json").read_text())["version"])
    )


def test_the_served_8_bit_pack_decodes_the_gates_tokens(packs: dict[tuple[str, int], Path]) -> None:
    """The tied 8-bit-head pack as published (page-aligned weights, the mended graph) decodes greedily what
    onnxruntime-genai decodes from it, and a prompt's first tokens are the float32 source's where the gate says
    the pack agrees."""
    import onnxruntime_genai as og
    import torch
    import transformers

    from infra.pack.lm_calibration import NEW_TOKENS, builtin_prompts
    from infra.pack.lm_quality import graph_greedy, prefix_fraction, prompt_ids, reference_greedy
    from infra.pack.lm_source import read_lm_source

    pack = packs[("qwen3", 8)]
    source = read_lm_source(source_dir("qwen3"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source.root))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(source.root), dtype=torch.float32).eval()
    graph = og.Model(str(pack))
    eos = set(json.loads((pack / "manifest.json").read_text())["generation"]["eos_token_ids"])
    fractions = []
    for text in builtin_prompts():
        ids = prompt_ids(tokenizer, source.chat_template, text)
        want = reference_greedy(model, ids, NEW_TOKENS, eos)
        fractions.append(prefix_fraction(want, graph_greedy(og, graph, ids, NEW_TOKENS)))
    assert sum(fractions) / len(fractions) == pytest.approx(_precision(pack)["quality"]["greedy_agreement"], abs=1e-6)


@pytest.mark.parametrize(
    ("quantize", "options", "match"),
    [
        ("int4", {"head_bits": 16}, r"head_bits=16 for int4; valid: 4, 8"),
        ("int4", {"head_bits": "8"}, r"head_bits='8' for int4; valid: 4, 8"),
        ("int8", {"head_bits": 4}, r"head_bits=4 for int8; valid: 8$"),
        (None, {"head_bits": 8}, r"head_bits=8 for float32; the head's bits apply to --quantize int4 / int8"),
        ("int4", {"head_block": 128}, r"head_block=128 for an 8-bit head over hidden size 64; valid: 16, 32, 64 \(of"),
        ("int4", {"head_block": 48}, r"head_block=48 for an 8-bit head over hidden size 64; valid: 16, 32, 64 \(of"),
        ("int4", {"head_block": "64"}, r"head_block='64' for an 8-bit head over hidden size 64; valid: 16, 32, 64"),
        ("int4", {"head_bits": 4, "head_block": 64}, r"head_block=64 for int4 with head_bits=4; .* valid: 32 "),
        ("int8", {"head_block": 64}, r"head_block=64 for int8 with head_bits=8; .* valid: 128 "),
        (None, {"head_block": 64}, r"head_block=64 for float32; the head's block applies to --quantize int4 / int8"),
    ],
)
def test_head_options_that_do_not_apply_are_refused_before_building(
    tmp_path: Path, quantize: str | None, options: dict[str, Any], match: str
) -> None:
    from infra.pack.lm_pack import pack_lm
    from infra.pack.precision import Precision, PrecisionError

    with pytest.raises(PrecisionError, match=match):
        pack_lm(source_dir("llama"), tmp_path / "out", precision=Precision(quantize=quantize), builder_options=options)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("hidden", "block"), [(1024, 128), (896, 128), (576, 64), (64, 64), (48, 16), (40, 32)])
def test_the_default_head_block_is_the_largest_up_to_128_that_divides_the_hidden_size(hidden: int, block: int) -> None:
    # 1024: Qwen3-0.6B; 576: SmolLM2-135M; 40: none of 16..256 divides it, the body's 32 (no re-blocking)
    assert lm_head.check_block("int4", {"block_size": 32, "head_bits": 8}, hidden) == block
    assert lm_head.check_block("int8", {"block_size": 128}, hidden) == 128
    assert lm_head.check_block("int4", {"block_size": 32, "head_bits": 4}, hidden) == 32


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The builder's own tied 8-bit-head graph, before mend_tied: its gather reads names not in the graph."""
    from infra.pack.lm_pack import run_builder, stage
    from infra.pack.lm_source import read_lm_source

    where = tmp_path_factory.mktemp("built-8")
    options: dict[str, str | int | bool] = {"prune_lm_head": True, "block_size": 32, "head_bits": 8}
    staged = stage(read_lm_source(source_dir("qwen3")), where / "source")
    run_builder(staged, where / "built", where / "c", "int4", options)
    return where / "built"


def _copy(built: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "built"
    shutil.copytree(built, copy)
    return copy


def test_the_builders_tied_graph_does_not_load_and_the_mended_one_reads_the_heads_blocks(
    built: Path, tmp_path: Path
) -> None:
    import onnxruntime_genai as og

    copy = _copy(built, tmp_path)
    with pytest.raises(Exception, match=r"lm_head\.MatMul\.weight_Q8G32' is not a graph input"):
        og.Model(str(copy))  # onnxruntime-genai 0.18's builder: the reason mend_tied exists
    read = lm_int4.source_reader(tuple(sorted(source_dir("qwen3").glob("*.safetensors"))))
    assert lm_head.mend_tied(copy, read) == {"tied": "model.embed_tokens.weight", "rows_checked": 257}
    og.Model(str(copy))
    assert lm_head.mend_tied(copy, read) is None  # nothing dangling: nothing to mend


def test_a_tied_head_that_is_not_the_sources_is_refused(built: Path, tmp_path: Path) -> None:
    copy = _copy(built, tmp_path)
    before = (copy / "model.onnx").read_bytes()
    other = lm_int4.source_reader(tuple(sorted(source_dir("qwen3", seed=1).glob("*.safetensors"))))
    with pytest.raises(lm_head.HeadError, match=r"8-bit blocks are not the round-to-nearest of the source's"):
        lm_head.mend_tied(copy, other)
    with pytest.raises(lm_head.HeadError, match="not the round-to-nearest"):
        lm_head.mend_tied(copy, lambda name: None)
    assert (copy / "model.onnx").read_bytes() == before  # refused before the graph was saved


def test_dangling_names_that_are_not_the_builders_are_refused(built: Path, tmp_path: Path) -> None:
    import onnx

    copy = _copy(built, tmp_path)
    model = onnx.load(str(copy / "model.onnx"), load_external_data=False)
    gather = next(n for n in model.graph.node if n.op_type == "GatherBlockQuantized")
    gather.input[2] = "some.other.scale"
    onnx.save(model, str(copy / "model.onnx"))
    read = lm_int4.source_reader(tuple(sorted(source_dir("qwen3").glob("*.safetensors"))))
    with pytest.raises(lm_head.HeadError, match=r"'some\.other\.scale', not in the graph, and not the builder's"):
        lm_head.mend_tied(copy, read)
    gather.input[2] = "lm_head.MatMul.weight_scale"
    for attr in gather.attribute:
        if attr.name == "block_size":
            attr.i = 64
    onnx.save(model, str(copy / "model.onnx"))
    with pytest.raises(lm_head.HeadError, match=r"bits=8 block_size=64 where the head has bits=8 block_size=32"):
        lm_head.mend_tied(copy, read)


def test_a_head_reblocked_from_another_source_is_refused_and_a_proved_one_loads(built: Path, tmp_path: Path) -> None:
    import onnxruntime_genai as og

    copy = _copy(built, tmp_path)
    read = lm_int4.source_reader(tuple(sorted(source_dir("qwen3").glob("*.safetensors"))))
    lm_head.mend_tied(copy, read)
    before = {p.name: p.read_bytes() for p in copy.iterdir() if p.is_file()}
    other = lm_int4.source_reader(tuple(sorted(source_dir("qwen3", seed=1).glob("*.safetensors"))))
    with pytest.raises(lm_head.HeadError, match=r"8-bit blocks are not the round-to-nearest .*; not re-blocked"):
        lm_head.reblock(copy, other, 64)
    with pytest.raises(lm_head.HeadError, match=r"block 128 for K=64"):
        lm_head.reblock(copy, read, 128)
    assert {p.name: p.read_bytes() for p in copy.iterdir() if p.is_file()} == before  # refused: nothing written
    assert lm_head.reblock(copy, read, 32) is None  # already in blocks of 32
    record = lm_head.reblock(copy, read, 16)
    assert record == {"from": 32, "block": 16, "source": "model.embed_tokens.weight", "rows_checked": 257}
    blocks = _head_blocks(copy)
    assert blocks.block == 16 and lm_int4.is_rtn_of(blocks, read("model.embed_tokens.weight"))
    og.Model(str(copy))  # the head and the tied gather in blocks of 16 load


def test_the_bench_re_blocks_a_published_pack_and_keeps_its_body(
    packs: dict[tuple[str, int], Path], tmp_path: Path
) -> None:
    """bench/generate/reblock.py (the 0.6B figures' packs): a published pack's head re-blocked as the packer does,
    the body's blocks unchanged, the graph loads; another model's directory is refused."""
    import onnxruntime_genai as og

    from bench.generate.reblock import reblocked_copy

    pack = packs[("qwen3", 32)]
    out = reblocked_copy(pack, source_dir("qwen3"), 16, tmp_path / "out")
    scheme = _precision(out)["scheme"]
    assert scheme["head_block"] == 16 and scheme["head_reblocked"]["rows_checked"] == 257
    assert _head_blocks(out).block == 16
    body, theirs = lm_int4.read_blocks(out), lm_int4.read_blocks(pack)
    assert set(body) == set(theirs) and all(np.array_equal(body[n].codes, theirs[n].codes) for n in body)
    og.Model(str(out))
    with pytest.raises(SystemExit, match="not the directory"):
        reblocked_copy(pack, source_dir("qwen3", seed=1), 16, tmp_path / "other")
