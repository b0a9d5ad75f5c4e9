"""The custom op `ai.warmstart::Q4MatMul` (handler/backends/native/ws_q4_op.c with the tree's ws_q4.h kernels) and a
pack rewritten to use it (bench/generate/q4op.py): a tiny random Qwen3 packed int4 gives the same greedy tokens as
its MatMulNBits graph, one-node graphs agree with ONNX Runtime's MatMulNBits (accuracy level 4: A quantized to int8
per block, as the op does) on 1 and 2 intra-op threads, and bad attributes are refused at session creation with the
op's message."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.generate import q4op
from handler.backends import q4lib
from tests.fixtures.lm_pack import pack_tiny_lm


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The op with the kernels the tree has (handler/backends/native/ws_q4_kernels.c)."""
    return q4op.build(tmp_path_factory.mktemp("q4lib") / "libws_q4_op.so")


@pytest.fixture(scope="module")
def reference_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The op with handler/backends/native/ws_q4_ref.c, the scalar reference the model-level comparisons are checked
    against."""
    return q4op.build(tmp_path_factory.mktemp("q4ref") / "libws_q4_op.so", q4op.NATIVE / "ws_q4_ref.c")


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory, library: Path) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("q4packs")
    pack = pack_tiny_lm(out, "qwen3", quantize="int4")
    return pack, _rewritten(pack, out / "q4", library)


def _rewritten(pack: Path, out: Path, library: Path) -> Path:
    q4op.rewrite(pack, out, library)
    return out


def _graph(
    op: str, K: int, N: int, seed: int = 0, bits: int = 4, block: int = 32, **attrs: Any
) -> tuple[bytes, np.ndarray, np.ndarray]:
    """A one-node model, A [M, K] -> Y [M, N]: MatMulNBits (bits 4 or 8, accuracy level 4) or our op with `attrs`
    (`k_attr`: another K attribute, `b_shape`: B's initializer reshaped); B and scales random initializers;
    (model, B, scales)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(N, K // block, block * bits // 8), dtype=np.uint8)
    scales = (rng.random((N, K // block), dtype=np.float32) * 0.02 + 0.001).astype(np.float32)
    b_init, k_attr = attrs.pop("b_shape", None), attrs.pop("k_attr", K)
    if op == "MatMulNBits":
        domain = "com.microsoft"
        node = helper.make_node(
            op, ["A", "B", "S"], ["Y"], domain=domain, K=K, N=N, bits=bits, block_size=block, accuracy_level=4
        )
    else:
        domain = q4lib.DOMAIN
        node = helper.make_node(op, ["A", "B", "S"], ["Y"], domain=domain, **{"K": k_attr, "N": N, **attrs})
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])],
        [
            numpy_helper.from_array(b if b_init is None else b.reshape(b_init), "B"),
            numpy_helper.from_array(scales, "S"),
        ],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(domain, 1)]
    return helper.make_model(graph, ir_version=10, opset_imports=opsets).SerializeToString(), b, scales


def _session(model: bytes, library: Path | None, threads: int = 1) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if library is not None:
        options.register_custom_ops_library(str(library))
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(("kernels", "threads"), [("tree", 1), ("tree", 2), ("reference", 1)])
def test_the_op_agrees_with_matmulnbits(
    library: Path, reference_library: Path, kernels: str, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N = 1000: four ParallelFor ranges of 256 columns, the last one short; M = 1, 3, 64 and a rank-3 A."""
    monkeypatch.setenv("WS_Q4_ALLOW_SCALAR", "1")  # the reference is a scalar path: allowed here on purpose
    K, N = 1024, 1000
    ours, b, scales = _graph(q4op.OP, K, N, block_size=32)
    theirs, b2, _ = _graph("MatMulNBits", K, N)
    assert (b == b2).all()
    lib = library if kernels == "tree" else reference_library
    q4, mlas = _session(ours, lib, threads), _session(theirs, None, threads)
    w = (np.stack([b & 15, b >> 4], -1).reshape(N, K).astype(np.float64) - 8) * np.repeat(scales, 32, 1)
    rng = np.random.default_rng(1)
    for shape in [(1, K), (3, K), (64, K), (2, 5, K)]:
        a = rng.standard_normal(shape, dtype=np.float32)
        if len(shape) == 3:  # a rank-3 A through the same graph: its input is declared [M, K], so flatten back
            got = q4.run(None, {"A": a.reshape(-1, K)})[0].reshape(*shape[:-1], N)
        else:
            got = q4.run(None, {"A": a})[0]
        want = mlas.run(None, {"A": a.reshape(-1, K)})[0].reshape(got.shape)
        exact = a.astype(np.float64) @ w.T
        # Same int8 blocks, same int32 sums: only the float sums of scale products differ in rounding.
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
        # Against the float weights, A's int8 rounding (~0.5% of a block's largest value) dominates.
        assert np.abs(got - exact).max() <= 2e-2 * np.abs(exact).max()
        assert np.abs(got - exact).max() > 0  # quantized A, not a float path


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"block_size": 64}, "Q4MatMul: block_size 64 is not supported (valid: 32)"),
        ({"block_size": 32, "b_shape": (1000, 32 * 16)}, "Q4MatMul: B's shape does not match K=1024, N=1000"),
    ],
)
def test_bad_attributes_are_refused_at_session_creation(library: Path, attrs: dict[str, Any], message: str) -> None:
    model, *_ = _graph(q4op.OP, 1024, 1000, **attrs)
    with pytest.raises(Exception, match=message.replace("(", r"\(").replace(")", r"\)")):
        _session(model, library)


def test_a_cpu_with_only_the_scalar_path_is_refused_unless_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built as an arm64 (or pre-AVX2 x86) machine builds it, the op runs only its scalar reference path, 11-16x
    slower than MLAS: the session is refused with the reason, so the engine opens the MatMulNBits decoder; allowed
    (WS_Q4_ALLOW_SCALAR=1) it runs and agrees with MatMulNBits."""
    lib = q4lib.build(tmp_path / "libws_q4_scalar.so", flags=("-DWS_Q4_X86=0",))
    ours, _, _ = _graph(q4op.OP, 64, 8, block_size=32)
    theirs, _, _ = _graph("MatMulNBits", 64, 8)
    monkeypatch.delenv("WS_Q4_ISA", raising=False)
    monkeypatch.delenv("WS_Q4_ALLOW_SCALAR", raising=False)
    with pytest.raises(Exception, match=r"only the scalar reference path .* not run"):
        _session(ours, lib)
    monkeypatch.setenv("WS_Q4_ALLOW_SCALAR", "1")
    a = np.random.default_rng(3).standard_normal((2, 64), dtype=np.float32)
    got, want = _session(ours, lib).run(None, {"A": a})[0], _session(theirs, None).run(None, {"A": a})[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))


def test_a_k_the_weights_do_not_have_is_refused(library: Path) -> None:
    """K says 512 while B holds 1024 columns: refused before any run reads past a row."""
    import onnx
    from onnx import helper

    model_bytes, *_ = _graph(q4op.OP, 1024, 1000, block_size=32)
    model = onnx.load_from_string(model_bytes)
    node = model.graph.node[0]
    node.ClearField("attribute")
    node.attribute.extend([helper.make_attribute(k, v) for k, v in {"K": 512, "N": 1000, "block_size": 32}.items()])
    with pytest.raises(Exception, match=r"Q4MatMul: B's shape does not match K=512, N=1000"):
        _session(model.SerializeToString(), library)


def test_the_rewrite_takes_the_packers_rules_and_links_the_weights(packs: tuple[Path, Path]) -> None:
    import onnx

    pack, q4 = packs
    before = onnx.load(str(pack / "model.onnx"), load_external_data=False)
    after = onnx.load(str(q4 / "model.onnx"), load_external_data=False)
    ops = [n.op_type for n in after.graph.node]
    body = [n for n in before.graph.node if n.op_type == "MatMulNBits"]
    report = json.loads((q4 / "q4op.json").read_text())
    # The packer's rules (infra.pack.lm_q4.rewrite): every body MatMulNBits a Q4MatMul, the 8-bit head a Q8MatMul.
    assert ops.count(q4op.OP) == len(body) - 1 and ops.count(q4lib.OP_Q8) == 1
    assert report["rewritten"] == len(body) and ops.count("MatMulNBits") == 0
    assert os.stat(q4 / "model.onnx.data").st_ino == os.stat(pack / "model.onnx.data").st_ino  # a link, no copy
    assert [i.name for i in after.graph.initializer] == [i.name for i in before.graph.initializer]
    config = json.loads((q4 / "genai_config.json").read_text())
    assert config["model"]["decoder"]["session_options"]["custom_ops_library"] == q4op.LIBRARY_NAME
    assert "graph_optimization_level" not in config["model"]["decoder"]["session_options"]
    # The engine checks every listed file's size at load: the rewritten ones are listed as they are now.
    manifest = json.loads((q4 / "manifest.json").read_text())
    for name in ("genai_config.json", "model.onnx", q4op.LIBRARY_NAME):
        assert manifest["files"][name]["size"] == (q4 / name).stat().st_size
    assert q4op.LIBRARY_NAME in manifest["backends"]["genai"]["files"]
    assert "optimized" not in manifest["backends"]["genai"]


def test_the_engine_loads_a_rewrite_without_graph_passes(packs: tuple[Path, Path], library: Path) -> None:
    """handler's manifest check and genai's load, then the same greedy tokens as the MatMulNBits pack."""
    from handler.core.manifest import load_manifest

    pack, _ = packs
    out = pack.parent / "q4-nopass"
    q4op.rewrite(pack, out, library, graph_passes=False)
    session = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]["session_options"]
    assert session["graph_optimization_level"] == "ORT_DISABLE_ALL"
    assert load_manifest(out).files[q4op.LIBRARY_NAME].size == (out / q4op.LIBRARY_NAME).stat().st_size
    result = q4op.compare(pack, out, steps=8, threads=1)
    assert result["equal"], result


def test_a_pack_with_nothing_to_rewrite_is_refused(packs: tuple[Path, Path], library: Path, tmp_path: Path) -> None:
    pack, q4 = packs
    with pytest.raises(q4op.RewriteError, match="is the pack itself"):
        q4op.rewrite(pack, pack, library)
    with pytest.raises(q4op.RewriteError, match="not a generate pack"):
        q4op.rewrite(tmp_path, tmp_path / "out", library)
    with pytest.raises(q4op.RewriteError, match="no such library"):
        q4op.rewrite(pack, tmp_path / "out", tmp_path / "missing.so")
    assert not (tmp_path / "out").exists()  # refused before anything is written
    with pytest.raises(q4op.RewriteError, match="no MatMulNBits of bits 4, block 32"):
        q4op.rewrite(q4, tmp_path / "again", library)  # already rewritten: only the 8-bit head is left


def test_greedy_tokens_and_logits_match_the_matmulnbits_graph(packs: tuple[Path, Path]) -> None:
    """Through onnxruntime-genai (the engine's C API path), which loads the library named in genai_config.json."""
    pack, q4 = packs
    result = q4op.compare(pack, q4, steps=24, threads=1)
    assert result["equal"], result
    assert len(set(result["tokens"])) > 3  # the scaled tiny model does not settle on one token
    # Tolerance: each product differs from MLAS's in float rounding only (the one-node test: <= 1e-5), but a layer's
    # output then quantized to int8 by the next can land one step over: one such flip moved the logits by 1.7e-3 of
    # their largest (the AVX-512 kernel, step 7 of 24; the other steps 0.0).
    assert result["logits_max_diff"] <= 1e-2 * result["logits_max_abs"], result


@pytest.mark.parametrize(
    ("block", "K", "threads"), [(32, 1056, 1), (64, 1024, 1), (128, 1024, 1), (128, 1024, 2), (256, 1280, 1)]
)
def test_q8_op_agrees_with_matmulnbits_8bit(library: Path, block: int, K: int, threads: int) -> None:
    """The 8-bit op against MatMulNBits bits 8 at accuracy level 4 on the same bytes: A quantized per block of the
    weights' block size (K = 33 blocks of 32: a vector of the AVX-512 path half full), M = 1, 3, 8, 64 and a rank-3
    A, N = 1000 (four ParallelFor ranges, the last short)."""
    N = 1000
    ours, b, scales = _graph(q4lib.OP_Q8, K, N, bits=8, block=block, block_size=block)
    theirs, b2, _ = _graph("MatMulNBits", K, N, bits=8, block=block)
    assert (b == b2).all()
    q8, mlas = _session(ours, library, threads), _session(theirs, None, threads)
    w = (b.reshape(N, K).astype(np.float64) - 128) * np.repeat(scales, block, 1)
    rng = np.random.default_rng(1)
    for shape in [(1, K), (3, K), (8, K), (64, K), (2, 5, K)]:
        a = (rng.standard_normal(shape, dtype=np.float32) * rng.uniform(0.1, 10, (*shape[:-1], 1))).astype(np.float32)
        got = q8.run(None, {"A": a.reshape(-1, K)})[0].reshape(*shape[:-1], N)
        want = mlas.run(None, {"A": a.reshape(-1, K)})[0].reshape(got.shape)
        exact = a.astype(np.float64) @ w.T
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()  # the same int8 blocks and int32 sums
        assert np.abs(got - exact).max() <= 2e-2 * np.abs(exact).max()
        assert np.abs(got - exact).max() > 0  # quantized A, not a float path


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"block_size": 16}, "Q8MatMul: block_size 16 is not supported (valid: 32, 64, 128, 256)"),
        ({"block_size": 128, "b_shape": (1000, 1024)}, "Q8MatMul: B's shape does not match K=1024, N=1000"),
        ({"block_size": 64}, "Q8MatMul: B's shape does not match K=1024, N=1000 (expected [N, K/64, 64]"),
        ({"block_size": 128, "k_attr": 1000}, "Q8MatMul: K=1000, N=1000: K must be a positive multiple of 128"),
    ],
)
def test_q8_bad_attributes_are_refused_at_session_creation(library: Path, attrs: dict[str, Any], message: str) -> None:
    model, *_ = _graph(q4lib.OP_Q8, 1024, 1000, bits=8, block=128, **attrs)
    with pytest.raises(Exception, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        _session(model, library)


def test_q8_on_a_cpu_with_only_the_scalar_path_is_refused_unless_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As Q4MatMul: the scalar-only build refuses the session unless WS_Q4_ALLOW_SCALAR=1, then agrees."""
    lib = q4lib.build(tmp_path / "libws_q4_scalar.so", flags=("-DWS_Q4_X86=0",))
    ours, _, _ = _graph(q4lib.OP_Q8, 192, 8, bits=8, block=64, block_size=64)
    theirs, _, _ = _graph("MatMulNBits", 192, 8, bits=8, block=64)
    monkeypatch.delenv("WS_Q4_ISA", raising=False)
    monkeypatch.delenv("WS_Q4_ALLOW_SCALAR", raising=False)
    with pytest.raises(Exception, match=r"Q8MatMul: this CPU has only the scalar reference path .* not run"):
        _session(ours, lib)
    monkeypatch.setenv("WS_Q4_ALLOW_SCALAR", "1")
    a = np.random.default_rng(3).standard_normal((2, 192), dtype=np.float32)
    got, want = _session(ours, lib).run(None, {"A": a})[0], _session(theirs, None).run(None, {"A": a})[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))
