"""The int4 MatMul that needs no prepack: ONNX Runtime custom op `ai.warmstart::Q4MatMul` (native/ws_q4_op.c
around the kernels of native/ws_q4_kernels.c), a shared library built from the sources beside this module.

Why our own kernel: ONNX Runtime's MatMulNBits re-packs every int4 weight into MLAS's layout at session creation,
even from a pack saved with its prepacked copies (it finds those by a hash of what it packed again): ~0.6 s of a
0.6B model's ~0.85 s cold start at 1.7 vCPU, and no session option avoids it. Q4MatMul computes straight from
the pack's bytes as ONNX Runtime maps them from model.onnx.data (docs/benchmarks.md, "An int4 MatMul without
prepack"). A pack carries the rewritten graph as `backends.genai.q4` (infra/pack/lm_q4.py, proved against the
MatMulNBits graph); the engine opens it where the library is built and loads (handler.backends.genai_load).

Stdlib only, no library loaded here: the prefetch plans its files before numpy is imported.

    python -m handler.backends.q4lib build [--out FILE]     # gcc, about 2 s; run by `make setup` and the images
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from handler.core.errors import ConfigError

NATIVE = Path(__file__).with_name("native")
LIBRARY = NATIVE / "libws_q4.so"  # built, never committed (.gitignore)
SOURCES = ("ws_q4_op.c", "ws_q4_kernels.c", "ws_q8_kernels.c")
DOMAIN, OP = "ai.warmstart", "Q4MatMul"
OP_Q8 = "Q8MatMul"  # the 8-bit MatMulNBits (an int4 pack's tied LM head), in the same library
ENV = "WARMSTART_GENAI_Q4"  # auto (default: where the pack has the graph and the library loads) | off
ENV_LIBRARY = "WARMSTART_Q4_LIBRARY"  # another build of the library (a path)
MODES = ("auto", "off")


def mode(env: Mapping[str, str]) -> str:
    """WARMSTART_GENAI_Q4, checked: auto (default) or off."""
    raw = (env.get(ENV) or "auto").strip().lower()
    if raw not in MODES:
        raise ConfigError(f"{ENV}={raw!r}; valid values: {', '.join(MODES)}")
    return raw


def library(env: Mapping[str, str] | None = None) -> tuple[Path | None, str]:
    """The library to load and, when there is none, why: WARMSTART_Q4_LIBRARY (a file that must exist), else the
    build beside this module."""
    env = os.environ if env is None else env
    named = (env.get(ENV_LIBRARY) or "").strip()
    if named:
        path = Path(named)
        if not path.is_file():
            raise ConfigError(f"{ENV_LIBRARY}={named!r}: no such file")
        return path.resolve(), ""
    if LIBRARY.is_file():
        return LIBRARY, ""
    return None, f"the library is not built ({LIBRARY}: python -m handler.backends.q4lib build)"


def build(out: Path = LIBRARY, cc: str | None = None, kernels: Path | None = None, flags: tuple[str, ...] = ()) -> Path:
    """Compile the op and its kernels into `out` (written aside, then renamed: a reader never maps half a file).
    No -march: the kernels pick AVX-512 VNNI, AVX2 or scalar code at run time, so one build serves any x86-64.
    `kernels`: another implementation of ws_q4.h (native/ws_q4_ref.c, the scalar reference the benchmarks and
    tests check the kernels against; the 8-bit kernels then run their scalar path, as its ws_q4_isa() says);
    `flags`: e.g. -DWS_Q4_X86=0, the scalar path alone as an arm64 build has it."""
    import subprocess  # deferred, as tempfile (it imports shutil): the engine's start only reads paths here
    import tempfile

    cc = cc or os.environ.get("CC") or "gcc"
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(fd)
    cmd = [cc, "-O3", "-Wall", "-Wextra", "-shared", "-fPIC", "-fvisibility=hidden", *flags, f"-I{NATIVE}", "-o", tmp]
    try:
        sources = [NATIVE / SOURCES[0], kernels or NATIVE / SOURCES[1], NATIVE / SOURCES[2]]
        subprocess.run([*cmd, *map(str, sources), "-lm"], check=True)
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse
    import subprocess
    import sys

    ap = argparse.ArgumentParser(prog="python -m handler.backends.q4lib", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile the library")
    b.add_argument("--out", type=Path, default=LIBRARY)
    args = ap.parse_args(argv)
    try:
        print(build(args.out))
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"q4lib: build failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
