"""ctypes access to handler/backends/native/ws_q4_kernels.c, the int4 MatMul that computes from MatMulNBits' bytes as
a pack holds them (no prepack): build the kernels alone with gcc, call them on numpy arrays, pick their code path.
For the benchmark (bench/generate/q4kern.py) and the tests; the engine loads the same kernels inside the
Q4MatMul op's library (handler/backends/q4lib.py).

    lib = WsQ4(build(Path("build/native")))
    c = lib.matmul(a, b, scales)       # a float32 [M, K], b uint8 [N, K/32, 16], scales float32 [N, K/32]
    c = lib.matmul8(a, b, scales)      # the 8-bit kernels (ws_q8.h): b uint8 [N, K/block, block], scales [N, K/block]
"""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path
from typing import Any

from handler.backends.q4lib import NATIVE

SOURCES = (NATIVE / "ws_q4_kernels.c", NATIVE / "ws_q8_kernels.c", NATIVE / "ws_q4.h", NATIVE / "ws_q8.h")
BLOCK = 32
Q8_BLOCKS = (32, 64, 128, 256)  # the 8-bit kernels' block sizes
# the code paths, in the order of ws_q4.h's WS_Q4_ISA_* (a lower one always runs where a higher one does)
ISAS = ("scalar", "avx2", "avx512vnni")


class Q4ArgumentError(ValueError):
    """Arrays or a range the kernel cannot take; the message names the rule and the values seen."""


def build(out_dir: Path, cc: str = "gcc", name: str = "libws_q4.so", flags: tuple[str, ...] = ()) -> Path:
    """`name` in out_dir, compiled again when a source is newer. Plain -O3: the vector paths carry their own
    target attributes (no -march, as the shipped build would be: Lambda's x86 CPUs vary). `flags`: e.g.
    -DWS_Q4_X86=0, the scalar path alone as an arm64 build has it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / name
    if lib.exists() and all(lib.stat().st_mtime >= src.stat().st_mtime for src in SOURCES):
        return lib
    tmp = out_dir / f".{name}.{id(out_dir)}.tmp"
    cmd = [cc, "-O3", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", *flags, "-o", str(tmp), *map(str, SOURCES[:2])]
    subprocess.run(cmd, check=True)
    tmp.replace(lib)  # atomic: a concurrent build never leaves a half-written library to load
    return lib


class WsQ4:
    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        sz, p = ctypes.c_size_t, ctypes.c_void_p
        lib.ws_q4_scratch_size.argtypes, lib.ws_q4_scratch_size.restype = [sz, sz], sz
        lib.ws_q4_quantize_a.argtypes, lib.ws_q4_quantize_a.restype = [p, sz, sz, p], None
        lib.ws_q4_matmul_q.argtypes = [p, sz, sz, p, p, sz, p, sz, sz]
        lib.ws_q4_matmul_q.restype = None
        lib.ws_q4_matmul.argtypes, lib.ws_q4_matmul.restype = [p, sz, sz, p, p, sz, p, p, sz, sz], None
        lib.ws_q4_isa.argtypes, lib.ws_q4_isa.restype = [], ctypes.c_int
        lib.ws_q4_set_isa.argtypes, lib.ws_q4_set_isa.restype = [ctypes.c_int], ctypes.c_int
        lib.ws_q8_scratch_size.argtypes, lib.ws_q8_scratch_size.restype = [sz, sz, sz], sz
        lib.ws_q8_quantize_a.argtypes, lib.ws_q8_quantize_a.restype = [p, sz, sz, sz, p], None
        lib.ws_q8_matmul_q.argtypes, lib.ws_q8_matmul_q.restype = [p, sz, p, p, sz, p, sz, sz], None
        lib.ws_q8_matmul.argtypes, lib.ws_q8_matmul.restype = [p, sz, sz, sz, p, p, sz, p, p, sz, sz], None
        self.lib = lib
        self._scratch: Any = None

    @property
    def isa(self) -> str:
        """The code path in effect: one of ISAS."""
        return ISAS[self.lib.ws_q4_isa()]

    def supported(self) -> list[str]:
        """The paths this CPU runs, lowest first (the highest is the default)."""
        now = self.lib.ws_q4_isa()
        out = [name for i, name in enumerate(ISAS) if self.lib.ws_q4_set_isa(i) == i]
        self.lib.ws_q4_set_isa(now)
        return out

    def set_isa(self, name: str) -> None:
        if name not in ISAS:
            raise Q4ArgumentError(f"isa {name!r}: one of {', '.join(ISAS)}")
        if self.lib.ws_q4_set_isa(ISAS.index(name)) < 0:
            raise Q4ArgumentError(f"isa {name!r}: this build on this CPU runs {', '.join(self.supported())}")

    def check(self, a: Any, b: Any, scales: Any, n_range: tuple[int, int] | None = None) -> tuple[int, int, int]:
        """(M, K, N) after the checks the C code leaves to its callers, each refusal naming the rule."""
        import numpy as np  # deferred as everywhere in bench: the module is imported by --help too

        if a.ndim != 2 or a.dtype != np.float32:
            raise Q4ArgumentError(f"A: float32 [M, K], got {a.dtype} {list(a.shape)}")
        m, k = a.shape
        if m < 1 or k < 1 or k % BLOCK:
            raise Q4ArgumentError(f"A: K = {k} must be a positive multiple of the block size {BLOCK}, M = {m} >= 1")
        nb = k // BLOCK
        if b.dtype != np.uint8 or b.ndim != 3 or b.shape[1:] != (nb, BLOCK // 2):
            raise Q4ArgumentError(f"B: uint8 [N, K/32 = {nb}, 16] (MatMulNBits bits 4), got {b.dtype} {list(b.shape)}")
        n = b.shape[0]
        if scales.dtype != np.float32 or scales.size != n * nb:
            raise Q4ArgumentError(f"scales: float32 [N = {n}, K/32 = {nb}], got {scales.dtype} {list(scales.shape)}")
        if n_range is not None and not 0 <= n_range[0] <= n_range[1] <= n:
            raise Q4ArgumentError(f"n_range {n_range}: 0 <= begin <= end <= N = {n}")
        return m, k, n

    def matmul(self, a: Any, b: Any, scales: Any, n_range: tuple[int, int] | None = None, out: Any = None) -> Any:
        """C [M, N] = a @ dequant(b)^T, columns n_range only (the rest of `out` untouched; zeros when new)."""
        import numpy as np

        m, k, n = self.check(a, b, scales, n_range)
        a, b, scales = (np.ascontiguousarray(x) for x in (a, b, scales))
        out, (begin, end) = _out(out, m, n), n_range if n_range is not None else (0, n)
        scratch = self.scratch(self.lib.ws_q4_scratch_size(m, k))
        self.lib.ws_q4_matmul(
            a.ctypes.data, m, k, b.ctypes.data, scales.ctypes.data, n, out.ctypes.data, scratch.ctypes.data, begin, end
        )
        return out

    def check8(self, a: Any, b: Any, scales: Any, n_range: tuple[int, int] | None = None) -> tuple[int, int, int, int]:
        """(M, K, N, block) of an 8-bit call after the checks the C code leaves to its callers."""
        import numpy as np

        if a.ndim != 2 or a.dtype != np.float32:
            raise Q4ArgumentError(f"A: float32 [M, K], got {a.dtype} {list(a.shape)}")
        m, k = a.shape
        if b.dtype != np.uint8 or b.ndim != 3 or b.shape[2] not in Q8_BLOCKS:
            raise Q4ArgumentError(
                f"B: uint8 [N, K/block, block], block one of {', '.join(map(str, Q8_BLOCKS))} (MatMulNBits bits 8), "
                f"got {b.dtype} {list(b.shape)}"
            )
        n, block = b.shape[0], b.shape[2]
        if m < 1 or k < 1 or k % block or b.shape[1] != k // block:
            raise Q4ArgumentError(f"A: K = {k} must be a positive multiple of the block size {block} = B's blocks")
        if scales.dtype != np.float32 or scales.size != n * (k // block):
            raise Q4ArgumentError(
                f"scales: float32 [N = {n}, K/{block} = {k // block}], got {scales.dtype} {list(scales.shape)}"
            )
        if n_range is not None and not 0 <= n_range[0] <= n_range[1] <= n:
            raise Q4ArgumentError(f"n_range {n_range}: 0 <= begin <= end <= N = {n}")
        return m, k, n, block

    def matmul8(self, a: Any, b: Any, scales: Any, n_range: tuple[int, int] | None = None, out: Any = None) -> Any:
        """The 8-bit kernels: C [M, N] = a @ ((b - 128) * scales)^T, columns n_range only (as matmul)."""
        import numpy as np

        m, k, n, block = self.check8(a, b, scales, n_range)
        a, b, scales = (np.ascontiguousarray(x) for x in (a, b, scales))
        out, (begin, end) = _out(out, m, n), n_range if n_range is not None else (0, n)
        scratch = self.scratch(self.lib.ws_q8_scratch_size(m, k, block))
        self.lib.ws_q8_matmul(
            a.ctypes.data, m, k, block, b.ctypes.data, scales.ctypes.data, n, out.ctypes.data,
            scratch.ctypes.data, begin, end,
        )  # fmt: skip
        return out

    def scratch(self, size: int) -> Any:
        """A buffer of at least `size` bytes (the kernels' scratch size), kept between calls (the benchmark times no
        allocation)."""
        import numpy as np

        if self._scratch is None or self._scratch.size < size:
            self._scratch = np.empty(size, np.uint8)
        return self._scratch


def _out(out: Any, m: int, n: int) -> Any:
    """The result buffer of a call: `out` checked (C-contiguous float32 [M, N]), or zeros when None."""
    import numpy as np

    if out is None:
        return np.zeros((m, n), np.float32)
    if out.shape != (m, n) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise Q4ArgumentError(f"out: C-contiguous float32 [M = {m}, N = {n}], got {out.dtype} {list(out.shape)}")
    return out
