"""A generate pack's Q4MatMul graph (infra.pack.lm_q4): the int4 packer writes model.q4.onnx beside model.onnx, its
body MatMulNBits as our Q4MatMul and its 8-bit head as our Q8MatMul on the same initializers (the same data file
and offsets, the same prefetch ranges), kept only when proved against model.onnx per op and on the whole decoder; a
wrong graph is refused with nothing written; without the op's library, or for a pack that is not int4, the pack
goes on without it and says why.

The int4 pack is tests/fixtures/lm_pack.py's cached tiny Qwen3 (shared with the other int4 tests); the library is
built once into tmp and passed in where a test calls lm_q4 itself."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import onnx
import pytest

from handler.backends import q4lib
from handler.core.manifest import load_manifest, verify_sha256
from infra.pack import lm_layout, lm_q4
from infra.pack.optimize import touched_ranges
from tests.fixtures.lm_pack import pack_tiny_lm, source_dir


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return q4lib.build(tmp_path_factory.mktemp("q4lib") / "libws_q4.so")


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packer's int4 pack, as `warmstart pack --quantize int4` writes it (the library found or built)."""
    return pack_tiny_lm(tmp_path_factory.mktemp("q4"), "qwen3", quantize="int4")


def _old(pack: Path, where: Path) -> Path:
    """A copy of `pack` as a pack made before the q4 graph: no file, no entry."""
    out = where / "old"
    shutil.copytree(pack, out)
    raw = json.loads((out / "manifest.json").read_text())
    raw["backends"]["genai"].pop("q4")
    raw["files"].pop(lm_q4.Q4_FILE)
    (out / lm_q4.Q4_FILE).unlink()
    (out / "manifest.json").write_text(json.dumps(raw, indent=2) + "\n")
    load_manifest(out)
    return out


def _externals(model: Any) -> dict[str, dict[str, str]]:
    return {t.name: {e.key: e.value for e in t.external_data} for t in model.graph.initializer}


def test_the_int4_pack_carries_the_proved_q4_graph(packed: Path) -> None:
    manifest = load_manifest(packed)
    verify_sha256(manifest)  # the manifest's hashes of every file, model.q4.onnx among them
    entry = manifest.backends["genai"]["q4"]
    assert "q4_skipped" not in manifest.backends["genai"]
    portable = onnx.load(str(packed / "model.onnx"), load_external_data=False)
    q4 = onnx.load(str(packed / lm_q4.Q4_FILE), load_external_data=False)
    body = [n.name for n in portable.graph.node if n.op_type == "MatMulNBits" and "lm_head" not in n.name]
    ours = [n.name for n in q4.graph.node if (n.domain, n.op_type) == (q4lib.DOMAIN, q4lib.OP)]
    assert ours == body and len(body) == 10  # 2 layers x (qkv, o, gate, up, down)
    # The tied 8-bit head (blocks of 64 here) as Q8MatMul; the embedding's lookup of the same bytes stays.
    head = [n for n in q4.graph.node if n.name == "/lm_head/MatMul_Q8"]
    assert [(n.domain, n.op_type) for n in head] == [(q4lib.DOMAIN, q4lib.OP_Q8)]
    assert {a.name: a.i for a in head[0].attribute}["block_size"] == 64
    assert not [n for n in q4.graph.node if n.op_type == "MatMulNBits"]
    gathers = [n.name for n in q4.graph.node if n.op_type == "GatherBlockQuantized"]
    assert entry["rewritten"] == 11 and entry["ops"] == {"ai.warmstart.Q4MatMul": 10, "ai.warmstart.Q8MatMul": 1}
    assert entry["kept"] == [
        f"{g}: GatherBlockQuantized (a lookup of the quantized bytes: no prepack)" for g in gathers
    ]
    assert any(o.domain == q4lib.DOMAIN for o in q4.opset_import)
    # No tensor loaded or copied: every initializer refers to the same file and offsets as model.onnx's.
    assert _externals(q4) == _externals(portable)
    assert any(info.get("location") == "model.onnx.data" for info in _externals(q4).values())
    assert sorted(p.name for p in packed.iterdir()) == sorted(["manifest.json", *manifest.files])  # nothing aside
    # The start's prefetch of the q4 graph reads what the portable one's does (backends.genai.layout.ranges).
    assert touched_ranges(packed / lm_q4.Q4_FILE) == touched_ranges(packed / "model.onnx")
    assert manifest.backends["genai"]["layout"]["ranges"]["model.onnx.data"] == touched_ranges(packed / lm_q4.Q4_FILE)
    assert entry["files"] == [lm_q4.Q4_FILE] and entry["op"] == "ai.warmstart.Q4MatMul"
    assert entry["graph_optimization_level"] == "ORT_DISABLE_ALL"
    proof = entry["proof"]
    assert (proof["probes"], proof["steps"]) == (len(lm_q4.PROBE_LENGTHS), lm_q4.PROBE_STEPS)
    assert proof["kernel"] in lm_q4.ISAS  # the path the proof ran (this CPU's best)
    assert 0 <= proof["max_abs_logit_diff"] <= proof["tolerance"]
    assert 0 < proof["max_op_diff_of_largest"] <= proof["op_tolerance"] == lm_q4.OP_TOLERANCE  # rounding, not equal


def test_add_gives_a_pack_made_before_its_q4_graph(packed: Path, library: Path, tmp_path: Path) -> None:
    old = _old(packed, tmp_path)
    entry = lm_q4.add(old, library)
    manifest = load_manifest(old)
    verify_sha256(manifest)
    assert manifest.backends["genai"]["q4"] == entry
    assert (old / lm_q4.Q4_FILE).read_bytes() == (packed / lm_q4.Q4_FILE).read_bytes()
    assert lm_q4.ensure(old) == (entry, "kept (the pack has it)")  # `warmstart optimize` again: nothing redone


def test_a_relayout_drops_the_q4_graph_and_optimize_adds_it_back(packed: Path, tmp_path: Path) -> None:
    """model.onnx aligned again (new offsets): the q4 graph's references would be stale, so it goes."""
    pack = tmp_path / "pack"
    shutil.copytree(packed, pack)
    raw = json.loads((pack / "manifest.json").read_text())
    del raw["backends"]["genai"]["layout"]  # a pack laid out before the record: align runs again
    (pack / "manifest.json").write_text(json.dumps(raw, indent=2) + "\n")
    lm_layout.relayout(pack)
    manifest = load_manifest(pack)
    assert "q4" not in manifest.backends["genai"] and lm_q4.Q4_FILE not in manifest.files
    assert not (pack / lm_q4.Q4_FILE).exists()
    entry, what = lm_q4.ensure(pack)
    assert what == "added" and entry is not None and load_manifest(pack).backends["genai"]["q4"] == entry


def _swap_scales(original: Any) -> Any:
    """A rewrite whose first gate_proj Q4MatMul takes up_proj's scales (the same shape): a wrong graph that runs."""

    def rewrite(model: Any) -> tuple[int, list[str]]:
        result: tuple[int, list[str]] = original(model)
        nodes = {n.name: n for n in model.graph.node}
        gate, up = nodes["/model/layers.0/mlp/gate_proj/MatMul_Q4"], nodes["/model/layers.0/mlp/up_proj/MatMul_Q4"]
        assert gate.op_type == up.op_type == q4lib.OP
        gate.input[2] = up.input[2]
        return result

    return rewrite


@pytest.mark.parametrize("per_op", [True, False])
def test_the_proof_refuses_a_wrong_graph_and_writes_nothing(
    packed: Path, library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, per_op: bool
) -> None:
    """Each half of the proof alone refuses it: per op (against MatMulNBits on the same activations), and the whole
    decoder's tokens/logits (with the per-op half skipped)."""
    old = _old(packed, tmp_path)
    before = {p.name: p.read_bytes() for p in old.iterdir()}
    monkeypatch.setattr(lm_q4, "rewrite", _swap_scales(lm_q4.rewrite))
    if not per_op:
        monkeypatch.setattr(lm_q4, "prove_ops", lambda *args: 0.0)
    message = "gate_proj/MatMul_Q4: Q4MatMul differs from MatMulNBits" if per_op else "probe 0 .* step 0: "
    with pytest.raises(lm_q4.LmQ4Error, match=message):
        lm_q4.add(old, library)
    assert {p.name: p.read_bytes() for p in old.iterdir()} == before  # no file, the manifest's bytes unchanged
    if per_op:  # `warmstart optimize`: the pack goes on, the reason recorded
        entry, why = lm_q4.ensure(old)
        assert entry is None and "differs from MatMulNBits" in why
        assert load_manifest(old).backends["genai"]["q4_skipped"] == why
        assert not (old / lm_q4.Q4_FILE).exists()


def test_without_a_library_the_int4_pack_goes_on_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`warmstart pack --quantize int4` where the library is not built and cannot be: the pack is written, its
    manifest and the summary say why it has no q4 graph."""
    from infra.cli import main

    def no_build(*args: Any, **kwargs: Any) -> Path:
        raise OSError("gcc: not here")

    monkeypatch.setattr(q4lib, "library", lambda env=None: (None, "the library is not built"))
    monkeypatch.setattr(q4lib, "build", no_build)
    monkeypatch.delenv("CC", raising=False)  # gcc, found or not: the two reasons below
    argv = ["pack", "--from", str(source_dir("qwen3")), "--quantize", "int4", "--min-quality", "0"]
    assert main([*argv, "--out", str(tmp_path / "pack")]) == 0
    genai = load_manifest(tmp_path / "pack").backends["genai"]
    assert "q4" not in genai and not (tmp_path / "pack" / lm_q4.Q4_FILE).exists()
    why = genai["q4_skipped"]
    assert why in (
        "the library is not built; building it failed (gcc: not here)",
        "the library is not built; no C compiler (gcc) to build it",
    )
    assert f"  q4 graph: none ({why})" in capsys.readouterr().out


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_a_pack_that_is_not_int4_has_nothing_to_rewrite(tmp_path: Path, library: Path, quantize: str | None) -> None:
    pack = pack_tiny_lm(tmp_path, "qwen3", quantize=quantize)
    genai = load_manifest(pack).backends["genai"]
    assert "q4" not in genai and not (pack / lm_q4.Q4_FILE).exists()
    label = quantize or "float32"
    assert genai["q4_skipped"] == f"{label} pack: the op computes 4-bit blocks only (--quantize int4)"
    with pytest.raises(lm_q4.LmQ4Error, match=f"a {label} pack; the op computes 4-bit blocks only"):
        lm_q4.add(pack, library)
    if quantize == "int8":  # its MatMulNBits are 8-bit: no int4 body, so no graph for Q8MatMul alone
        with pytest.raises(lm_q4.LmQ4Error, match=r"no MatMulNBits the op computes .*: \d+ of bits 8 alone"):
            lm_q4.make(pack, library)
    assert not (pack / lm_q4.Q4_FILE).exists()


def test_warmstart_optimize_adds_it_and_says_so(
    packed: Path, library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`warmstart optimize DIR` on a pack made before: the q4 graph added and named on one line; `--remove` (the
    prepacked copy out again) leaves it in place."""
    from infra.cli import main

    old = _old(packed, tmp_path)
    monkeypatch.setenv(q4lib.ENV_LIBRARY, str(library))
    assert main(["optimize", str(old)]) == 0
    out = capsys.readouterr().out
    assert (
        "  q4 graph: model.q4.onnx added, 11 MatMulNBits as ai.warmstart.Q4MatMul (10), ai.warmstart.Q8MatMul (1), "
        "proved on 3 probes x 4" in out
    )
    assert load_manifest(old).backends["genai"]["q4"]["rewritten"] == 11
    assert main(["optimize", str(old), "--remove", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["q4_reason"] == "not asked (--remove)"
    assert "q4" in load_manifest(old).backends["genai"] and (old / lm_q4.Q4_FILE).is_file()
