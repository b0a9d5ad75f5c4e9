"""handler/backends/native/ws_q8_kernels.c, the 8-bit MatMul on MatMulNBits' bytes (bits 8, zero point 128: an int4
pack's tied LM head): every code path this CPU runs against a float64 product (A quantized per block of the
weights' block size as MLAS does, so the int32 sums are exact and only the float sums round), on odd shapes, every
block size and N sub-ranges; the same bytes against ONNX Runtime's MatMulNBits bits 8. Built with gcc once per
module, with the 4-bit kernels (the same library, the same ws_q4_isa() choice)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.generate.ws_q4 import ISAS, Q4ArgumentError, WsQ4, build


@pytest.fixture(scope="module")
def lib_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("ws_q8"))


@pytest.fixture(scope="module")
def lib(lib_path: Path) -> WsQ4:
    return WsQ4(lib_path)


def case(m: int, k: int, n: int, block: int, seed: int = 0) -> tuple[Any, Any, Any]:
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((m, k)) * rng.uniform(0.1, 10, (m, 1))).astype(np.float32)
    a[0, -block:] = 0  # an all-zero block (the last: row 0 starts the scratch, its first block must count): scale 0
    if m > 1:  # a row on a grid of 1/127 of its largest value: values land on integers, where quantizers part
        a[1] = rng.integers(-127, 128, k) * np.float32(0.013)
    b = rng.integers(0, 256, (n, k // block, block), dtype=np.uint8)
    b[0, 0, :4] = (0, 255, 128, 1)  # the extremes: -128 and 127 after the zero point (AVX2's |w| trick at 128)
    s = (rng.random((n, k // block)) * 0.05 + 0.001).astype(np.float32)
    return a, b, s


def reference(a: Any, b: Any, s: Any) -> tuple[Any, Any]:
    """(float64 product, sum of |products|): A quantized per block of B's block size as MLAS does (times 127 / max,
    rounded to even; scale max / 127), W = byte - 128 times the block scales. The magnitude is per product, not per
    block: the vector paths convert each int32 lane's partial sum of a block to float (exact), so their float
    rounding scales with the lanes' sums, which cancel within a block."""
    m, k = a.shape
    block = b.shape[2]
    blocks = a.reshape(m, k // block, block)
    amax = np.abs(blocks).max(-1)
    sa = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(amax != 0, np.float32(127) / np.where(amax != 0, amax, np.float32(1)), np.float32(0))
    q = np.rint(blocks * inv[..., None]).astype(np.int64)
    w = b.astype(np.int64) - 128
    scale = sa[:, None, :].astype(np.float64) * s[None].astype(np.float64)
    terms = scale * np.einsum("mbk,nbk->mnb", q, w)
    return terms.sum(-1), (scale * np.einsum("mbk,nbk->mnb", np.abs(q), np.abs(w))).sum(-1)


def close(got: Any, a: Any, b: Any, s: Any) -> None:
    want, mag = reference(a, b, s)
    assert np.all(np.abs(got - want) <= 1e-6 * mag + 1e-30), float(np.max(np.abs(got - want) / (mag + 1e-30)))


@pytest.fixture(params=ISAS)
def isa(request: pytest.FixtureRequest, lib: WsQ4) -> Any:
    """Each code path; one this CPU lacks must be refused by name (not skipped)."""
    name = request.param
    before = lib.isa
    if name in lib.supported():
        lib.set_isa(name)
    else:
        with pytest.raises(Q4ArgumentError, match=f"isa '{name}': this build on this CPU runs scalar"):
            lib.set_isa(name)
    yield lib.isa
    lib.set_isa(before)


# M: one decode row, the AVX-512 tile's remainders (1-3 rows past 4), 8 decode rows, a prompt step; N: odd (the
# two-column tile's remainder); K: one block, an odd count of blocks of 32 (half a vector), the head's 1024
SHAPES = [(1, 1, 5), (2, 3, 9), (3, 8, 37), (5, 2, 6), (8, 8, 37), (64, 8, 11), (7, 1, 3)]


@pytest.mark.parametrize("block", [32, 64, 128, 256])
@pytest.mark.parametrize(("m", "nblocks", "n"), SHAPES)
def test_every_path_matches_the_float64_product(lib: WsQ4, isa: str, m: int, nblocks: int, n: int, block: int) -> None:
    k = nblocks * block if (block, nblocks) != (32, 8) else 33 * 32
    a, b, s = case(m, k, n, block, seed=m + block)
    close(lib.matmul8(a, b, s), a, b, s)


@pytest.mark.parametrize("rows", [(0, 37), (5, 22), (13, 14), (33, 37), (20, 20)])
@pytest.mark.parametrize(("m", "block"), [(1, 128), (3, 64), (64, 128), (9, 32)])
def test_an_n_range_writes_its_columns_only(lib: WsQ4, isa: str, m: int, block: int, rows: tuple[int, int]) -> None:
    a, b, s = case(m, 3 * block, 37, block, seed=m)
    out = np.full((m, 37), 7.5, np.float32)
    lib.matmul8(a, b, s, n_range=rows, out=out)
    lo, hi = rows
    close(out[:, lo:hi], a, b[lo:hi], s[lo:hi])
    assert np.all(out[:, :lo] == 7.5) and np.all(out[:, hi:] == 7.5)


def test_unaligned_weights_and_scratch_and_one_a_for_several_ranges(lib: WsQ4, isa: str) -> None:
    """B and scales at odd byte offsets, scratch anywhere; A quantized once, then several N ranges (the op's split)."""
    m, k, n, block = 3, 1024, 21, 128
    a, b, s = case(m, k, n, block, seed=5)
    raw = np.zeros(b.nbytes + s.nbytes + 8, np.uint8)
    raw[1 : 1 + b.nbytes] = b.reshape(-1)
    raw[3 + b.nbytes : 3 + b.nbytes + s.nbytes] = s.view(np.uint8).reshape(-1)
    scratch = np.zeros(lib.lib.ws_q8_scratch_size(m, k, block) + 8, np.uint8)
    out = np.zeros((m, n), np.float32)
    base = raw.ctypes.data
    lib.lib.ws_q8_quantize_a(a.ctypes.data, m, k, block, scratch.ctypes.data + 5)
    for lo, hi in ((0, 8), (8, 13), (13, 21)):
        lib.lib.ws_q8_matmul_q(scratch.ctypes.data + 5, m, base + 1, base + 3 + b.nbytes, n, out.ctypes.data, lo, hi)
    close(out, a, b, s)


def test_a_nan_or_an_infinity_in_a_makes_its_row_nan(lib: WsQ4, isa: str) -> None:
    a, b, s = case(4, 1024, 7, 64, seed=13)
    a[0, 5], a[1, 700], a[2, 0], a[2, 1] = np.nan, np.inf, np.inf, -np.inf
    got = lib.matmul8(a, b, s)
    assert np.isnan(got[:3]).all()
    close(got[3:], a[3:], b, s)


@pytest.mark.parametrize(("block", "m"), [(32, 3), (64, 1), (64, 8), (128, 1), (128, 8), (128, 64), (256, 3)])
def test_same_bytes_as_onnx_runtime_matmulnbits_8bit(lib: WsQ4, isa: str, block: int, m: int) -> None:
    """MatMulNBits bits 8, accuracy_level 4, no zero points (the packer's head) on the same bytes: MLAS quantizes A
    per block of the weights' block size, rounding to even; only the float sums differ (a quantization per 32, or
    one rounding half away from zero, would part by ~1e-3 of the largest)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    k, n = 1024, 48
    a, b, s = case(m, k, n, block, seed=9 + m)
    node = helper.make_node(
        "MatMulNBits", ["A", "B", "S"], ["Y"], domain="com.microsoft", K=k, N=n, bits=8, block_size=block,
        accuracy_level=4,
    )  # fmt: skip
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(b, "B"), numpy_helper.from_array(s, "S")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    model = helper.make_model(g, ir_version=10, opset_imports=opsets).SerializeToString()
    theirs = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]).run(None, {"A": a})[0]
    ours = lib.matmul8(a, b, s)
    assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max()


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ({"block": 48}, r"block one of 32, 64, 128, 256 \(MatMulNBits bits 8\)"),
        ({"k": 200}, "K = 200 must be a positive multiple of the block size 64"),
        ({"scales": 5}, r"scales: float32 \[N = 4, K/64 = 3\]"),
        ({"n_range": (2, 5)}, r"n_range \(2, 5\): 0 <= begin <= end <= N = 4"),
    ],
)
def test_wrong_arguments_are_refused_with_the_rule(lib: WsQ4, shape: dict[str, Any], message: str) -> None:
    k, block = shape.get("k", 192), shape.get("block", 64)
    a = np.zeros((2, k), np.float32)
    b = np.zeros((4, 3, block), np.uint8)
    s = np.zeros(shape.get("scales", 12), np.float32)
    with pytest.raises(Q4ArgumentError, match=message):
        lib.matmul8(a, b, s, n_range=shape.get("n_range"))


def test_a_build_without_the_x86_paths_runs_the_scalar_one(tmp_path: Path) -> None:
    lib = WsQ4(build(tmp_path, name="libws_q8_portable.so", flags=("-DWS_Q4_X86=0",)))
    assert lib.isa == "scalar"
    a, b, s = case(3, 384, 5, 128, seed=1)
    close(lib.matmul8(a, b, s), a, b, s)


def test_the_library_exports_the_headers_only(lib_path: Path) -> None:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib_path)], capture_output=True, text=True, check=True)
    names = {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}
    assert {n for n in names if n.startswith("ws_q8_")} == {
        "ws_q8_scratch_size", "ws_q8_quantize_a", "ws_q8_matmul_q", "ws_q8_matmul"
    }  # fmt: skip
