"""handler/backends/native/ws_q4_kernels.c, the int4 MatMul on MatMulNBits' bytes as a pack holds them: every code path
this CPU runs against a float64 product (A quantized per block as the kernel does, so the int32 sums are exact and
only the float sums round), on odd shapes and N sub-ranges; the same bytes against ONNX Runtime's MatMulNBits; the
wrapper's refusals. The library is built with gcc (~1 s) once per session."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.generate.ws_q4 import ISAS, Q4ArgumentError, WsQ4, build


@pytest.fixture(scope="module")
def lib_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("ws_q4"))


@pytest.fixture(scope="module")
def lib(lib_path: Path) -> WsQ4:
    return WsQ4(lib_path)


def case(m: int, k: int, n: int, seed: int = 0) -> tuple[Any, Any, Any]:
    rng = np.random.default_rng(seed)
    # rows of different magnitude (and one all-zero block) so that per-block scales matter
    a = (rng.standard_normal((m, k)) * rng.uniform(0.1, 10, (m, 1))).astype(np.float32)
    a[0, :32] = 0
    if m > 1:  # a row on a grid of 1/127 of its largest value: values land on integers, where quantizers part
        a[1] = rng.integers(-127, 128, k) * np.float32(0.013)
    b = rng.integers(0, 256, (n, k // 32, 16), dtype=np.uint8)
    s = (rng.random((n, k // 32)) * 0.05 + 0.001).astype(np.float32)
    return a, b, s


def reference(a: Any, b: Any, s: Any) -> tuple[Any, Any]:
    """(float64 product, sum of |terms|): A quantized per block of 32 as MLAS does (times 127 / max, rounded to
    even; scale max / 127), W from the nibbles (low = even element, high = odd) minus 8, times the block scales."""
    m, k = a.shape
    blocks = a.reshape(m, k // 32, 32)
    amax = np.abs(blocks).max(-1)
    sa = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(amax != 0, np.float32(127) / np.where(amax != 0, amax, np.float32(1)), np.float32(0))
    q = np.rint(blocks * inv[..., None]).astype(np.int64)
    w = np.empty((*b.shape[:2], 32), np.int64)
    w[..., 0::2], w[..., 1::2] = b & 15, b >> 4
    terms = sa[:, None, :].astype(np.float64) * s[None].astype(np.float64) * np.einsum("mbk,nbk->mnb", q, w - 8)
    return terms.sum(-1), np.abs(terms).sum(-1)


def close(got: Any, a: Any, b: Any, s: Any) -> None:
    want, mag = reference(a, b, s)
    # float32 sums of exact int32 block sums times scales: a few ulps of the terms' magnitude
    assert np.all(np.abs(got - want) <= 1e-6 * mag + 1e-30), float(np.max(np.abs(got - want) / (mag + 1e-30)))


@pytest.fixture(params=ISAS)
def isa(request: pytest.FixtureRequest, lib: WsQ4) -> Any:
    """Each code path; one this CPU lacks must be refused by name (not skipped), and the tests below then run the
    best one again, so every parameter checks something."""
    name = request.param
    before = lib.isa
    if name in lib.supported():
        lib.set_isa(name)
    else:
        with pytest.raises(Q4ArgumentError, match=f"isa '{name}': this build on this CPU runs scalar"):
            lib.set_isa(name)
    yield lib.isa
    lib.set_isa(before)


# M: one decode row, the two-row register path, a tile remainder, a prompt step, two passes of 96 rows and a
# remainder; N: not a multiple of the row blocking; K: one block, a partial vector group (17 blocks), one past a
# buffered chunk of K (129 blocks)
SHAPES = [(1, 32, 5), (2, 544, 9), (3, 96, 37), (4, 1024, 6), (64, 1024, 37), (5, 4128, 7), (1, 3072, 11)]
SHAPES += [(200, 544, 9)]


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_every_path_matches_the_float64_product(lib: WsQ4, isa: str, m: int, k: int, n: int) -> None:
    a, b, s = case(m, k, n)
    close(lib.matmul(a, b, s), a, b, s)


@pytest.mark.parametrize("rows", [(0, 37), (5, 22), (13, 14), (33, 37), (20, 20)])
@pytest.mark.parametrize("m", [1, 3, 64])
def test_an_n_range_writes_its_columns_only(lib: WsQ4, isa: str, m: int, rows: tuple[int, int]) -> None:
    a, b, s = case(m, 96, 37, seed=m)
    out = np.full((m, 37), 7.5, np.float32)
    lib.matmul(a, b, s, n_range=rows, out=out)
    lo, hi = rows
    close(out[:, lo:hi], a, b[lo:hi], s[lo:hi])
    assert np.all(out[:, :lo] == 7.5) and np.all(out[:, hi:] == 7.5)


def test_unaligned_weights_and_scratch(lib: WsQ4, isa: str) -> None:
    """B and scales at odd byte offsets (external data offsets are not promised aligned), scratch anywhere; one
    quantization of A serving several N ranges, as the op splits N over threads."""
    m, k, n = 3, 1024, 21
    a, b, s = case(m, k, n, seed=5)
    raw = np.zeros(b.nbytes + s.nbytes + 8, np.uint8)
    raw[1 : 1 + b.nbytes] = b.reshape(-1)
    raw[3 + b.nbytes : 3 + b.nbytes + s.nbytes] = s.view(np.uint8).reshape(-1)
    scratch = np.zeros(lib.lib.ws_q4_scratch_size(m, k) + 8, np.uint8)
    out = np.zeros((m, n), np.float32)
    base = raw.ctypes.data
    lib.lib.ws_q4_quantize_a(a.ctypes.data, m, k, scratch.ctypes.data + 5)
    for lo, hi in ((0, 8), (8, 13), (13, 21)):
        lib.lib.ws_q4_matmul_q(scratch.ctypes.data + 5, m, k, base + 1, base + 3 + b.nbytes, n, out.ctypes.data, lo, hi)
    close(out, a, b, s)


def test_paths_agree_with_each_other_to_float_rounding(lib: WsQ4) -> None:
    a, b, s = case(8, 2048, 19, seed=3)
    got = {}
    before = lib.isa
    for name in lib.supported():
        lib.set_isa(name)
        got[name] = lib.matmul(a, b, s)
    lib.set_isa(before)
    scale = max(float(np.abs(x).max()) for x in got.values())
    assert all(np.abs(x - got["scalar"]).max() <= 1e-5 * scale for x in got.values())


def test_same_bytes_as_onnx_runtime_matmulnbits(lib: WsQ4) -> None:
    """A one-node MatMulNBits graph (bits 4, block 32, accuracy_level 4, no zero points: what the packer writes)
    on the same bytes: the difference is float rounding of the block sums (MLAS sums in another order)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    m, k, n = 64, 1024, 48
    a, b, s = case(m, k, n, seed=9)
    # half the rows on a grid of 1/127 of their largest value: a * 127 / max lands on integers, where 1 / (max /
    # 127) would round some values to the neighbouring int (MLAS's quantizer takes 127 / max)
    a[::2] = (np.random.default_rng(9).integers(-127, 128, (m // 2, k)) * np.float32(0.013)).astype(np.float32)
    node = helper.make_node(
        "MatMulNBits", ["A", "B", "S"], ["Y"], domain="com.microsoft", K=k, N=n, bits=4, block_size=32, accuracy_level=4
    )
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(b, "B"), numpy_helper.from_array(s, "S")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(g, ir_version=10, opset_imports=opsets)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    theirs = sess.run(None, {"A": a})[0]
    ours = lib.matmul(a, b, s)
    assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max()


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ({"k": 48}, "K = 48 must be a positive multiple of the block size 32"),
        ({"b_blocks": 2}, r"B: uint8 \[N, K/32 = 3, 16\]"),
        ({"scales": 5}, r"scales: float32 \[N = 4, K/32 = 3\]"),
        ({"a_dtype": np.float64}, r"A: float32 \[M, K\], got float64"),
        ({"n_range": (2, 5)}, r"n_range \(2, 5\): 0 <= begin <= end <= N = 4"),
    ],
)
def test_wrong_arguments_are_refused_with_the_rule(lib: WsQ4, shape: dict[str, Any], message: str) -> None:
    k = shape.get("k", 96)
    a = np.zeros((2, k), shape.get("a_dtype", np.float32))
    b = np.zeros((4, shape.get("b_blocks", k // 32), 16), np.uint8)
    s = np.zeros(shape.get("scales", 4 * (k // 32)), np.float32)
    with pytest.raises(Q4ArgumentError, match=message):
        lib.matmul(a, b, s, n_range=shape.get("n_range"))


def test_an_unknown_path_name_lists_the_names(lib: WsQ4) -> None:
    with pytest.raises(Q4ArgumentError, match="isa 'sse': one of scalar, avx2, avx512vnni"):
        lib.set_isa("sse")


@pytest.mark.parametrize(("env", "want"), [("scalar", 0), ("avx2", 1), ("nonsense", None)])
def test_the_environment_chooses_a_lower_path(lib_path: Path, lib: WsQ4, env: str, want: int | None) -> None:
    """WS_Q4_ISA (how the benchmark forces AVX2) picks a path the CPU has; a name it does not know keeps the best."""
    best = ISAS.index(lib.supported()[-1])
    code = f"import ctypes; print(ctypes.CDLL({str(lib_path)!r}).ws_q4_isa())"
    out = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "WS_Q4_ISA": env}, capture_output=True, text=True, check=True
    )
    assert int(out.stdout) == (min(want, best) if want is not None else best)


def test_scratch_size_covers_the_padded_rows(lib: WsQ4) -> None:
    """Rows are padded to 16 blocks: 40 bytes per padded block (32 int8, a scale, a sum) plus header and slack."""
    size = lib.lib.ws_q4_scratch_size
    assert size(1, 32) == 128 + 16 * 40
    assert size(3, 544) == 128 + 3 * 32 * 40
    assert ctypes.sizeof(ctypes.c_size_t) == 8


def test_threads_share_one_quantized_a(lib: WsQ4) -> None:
    """The op's split: A quantized once, then N ranges computed at once on several threads from the same scratch
    (ctypes drops the GIL for the call), each writing its own columns."""
    from concurrent.futures import ThreadPoolExecutor

    m, k, n = 9, 2048, 203
    a, b, s = case(m, k, n, seed=11)
    scratch = np.zeros(lib.lib.ws_q4_scratch_size(m, k), np.uint8)
    out = np.full((m, n), np.nan, np.float32)
    lib.lib.ws_q4_quantize_a(a.ctypes.data, m, k, scratch.ctypes.data)
    cuts = [0, 1, 50, 51, 130, 203]

    def part(i: int) -> None:
        lib.lib.ws_q4_matmul_q(
            scratch.ctypes.data, m, k, b.ctypes.data, s.ctypes.data, n, out.ctypes.data, cuts[i], cuts[i + 1]
        )

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(part, range(len(cuts) - 1)))
    close(out, a, b, s)


def test_the_library_exports_the_header_only(lib_path: Path) -> None:
    """Loaded into ONNX Runtime's process beside libonnxruntime: nothing but the ws_q4_ names may be visible."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib_path)], capture_output=True, text=True, check=True)
    names = {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}
    want = {"ws_q4_scratch_size", "ws_q4_quantize_a", "ws_q4_matmul_q", "ws_q4_matmul", "ws_q4_isa", "ws_q4_set_isa"}
    want |= {"ws_q8_scratch_size", "ws_q8_quantize_a", "ws_q8_matmul_q", "ws_q8_matmul"}  # ws_q8.h, built beside
    assert names == want


def test_only_the_avx512_code_uses_avx512_registers(lib_path: Path) -> None:
    """An AVX2-only CPU (Lambda's x86 hosts vary) runs every function but the AVX-512 ones: an EVEX instruction
    (zmm, a mask register, a vector register above 15) anywhere else would be SIGILL there, which this host (it has
    AVX-512) cannot show by running the code."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    evex = re.compile(r"%zmm|%k[1-7]\b|%[xy]mm(1[6-9]|2\d|3[01])\b")
    fn, users = "", set()
    for line in out.stdout.splitlines():
        head = re.match(r"[0-9a-f]+ <(.+)>:$", line)
        if head:
            fn = head.group(1)
        elif evex.search(line):
            users.add(fn)
    assert users and all("512" in name for name in users), users


def test_a_nan_or_an_infinity_in_a_makes_its_row_nan(lib: WsQ4, isa: str) -> None:
    """Not finite values made up from a quantized NaN (MatMulNBits gives finite ones for a NaN, NaN for an
    infinity): on every path the row holding one is NaN, the other rows are the product as usual."""
    a, b, s = case(4, 1024, 7, seed=13)
    a[0, 5], a[1, 700], a[2, 0], a[2, 1] = np.nan, np.inf, np.inf, -np.inf
    got = lib.matmul(a, b, s)
    assert np.isnan(got[:3]).all()
    close(got[3:], a[3:], b, s)


def test_a_build_without_the_x86_paths_runs_the_scalar_one(tmp_path: Path) -> None:
    """What an arm64 build compiles (no immintrin, no target attributes): it builds warning-free, says scalar,
    refuses the vector paths by name and computes the same product."""
    lib = WsQ4(build(tmp_path, name="libws_q4_portable.so", flags=("-DWS_Q4_X86=0",)))
    assert lib.isa == "scalar" and lib.supported() == ["scalar"]
    with pytest.raises(Q4ArgumentError, match="isa 'avx2': this build on this CPU runs scalar"):
        lib.set_isa("avx2")
    for m, k, n in ((1, 544, 9), (3, 1024, 5)):
        a, b, s = case(m, k, n, seed=m)
        close(lib.matmul(a, b, s), a, b, s)
