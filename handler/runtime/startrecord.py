"""Recording the start's file list (`handler.runtime.startfiles`: its format, and the replay), build time only:
`python -m handler.runtime.startrecord [--model DIR] [--out FILE] [--pth]`, run where the function is built (`make
setup`, the CPU image's build). Apart from the replay so that a start, which imports the replay's module for its
prefetch, never loads the recorder: ~30 functions a start never runs, whose code objects and function objects
cost every start ~0.4 M instructions (callgrind).

A start runs twice in a child process (import `handler.app`, one invocation); before the second, its files'
pages are evicted, after it `mincore` says which pages it read. Paths are kept relative to the sys.path entry
they were found under, so a list recorded in a build tree resolves where the code is deployed. Stdlib + ctypes.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from handler.runtime.startfiles import LIST, PROBE, VERSION, install_pth, open_regular, sample

PAGE = 4096
# Touched pages closer than this are read as one range: fewer syscalls, and the kernel reads ahead anyway.
MERGE_GAP = 1 << 16
EVENT = {"inputs": ["A cold start is the time from nothing to the first answer."]}

_CHILD = """
import json, os, sys
before = set(sys.modules)
try:
    import awslambdaric.bootstrap  # what Lambda mode imports before handler.app: the interpreter-start hook's
except ImportError:
    pass
from handler.core import numpy_gate
numpy_gate.load_later = lambda: False  # the list is of the start to its answer: a lean start's later numpy is not
import handler.app
try:
    handler.app.lambda_handler(json.loads(sys.argv[2]), None)
except Exception:
    pass  # a task that takes other inputs: the init chain is recorded all the same
mods = []
for name, mod in list(sys.modules.items()):
    spec = getattr(mod, "__spec__", None)
    if name in before or spec is None or type(spec.loader).__name__ == "BundleLoader":
        continue  # a bundled module's .pyc is not read
    for p in (getattr(spec, "cached", None), getattr(spec, "origin", None)):
        if isinstance(p, str) and os.path.isfile(p):
            mods.append(p)
            break
    if name == "handler.runtime.codebundle" and mod.report()["modules"]:
        mods.append(mod.BUNDLE)  # read whole by its first function, before the modules it holds
maps = []
with open("/proc/self/maps") as f:
    for line in f:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            maps.append(parts[5].strip())
with open(sys.argv[1], "w") as out:
    json.dump({"modules": mods, "maps": maps, "path": sys.path, "backend": handler.app.runtime.backend.name}, out)
"""


def _child(env: dict[str, str], cwd: Path) -> dict[str, Any]:
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, out.name, json.dumps(EVENT)],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"the recording start failed:\n{proc.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(Path(out.name).read_text())
        return result


def evict(paths: Iterable[str]) -> None:
    for p in paths:
        fd = open_regular(p)
        if fd is None:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident(path: str) -> list[bool]:
    """Which pages of the file are in the page cache (mincore on a fresh mapping)."""
    import ctypes
    import mmap

    size = os.path.getsize(path)
    if size == 0:
        return []
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    pages = (size + PAGE - 1) // PAGE
    fd = open_regular(path)
    if fd is None:
        raise OSError(f"{path}: absent or not a regular file")
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        try:
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            return [bool(v & 1) for v in vec]
        finally:
            libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
    finally:
        os.close(fd)


def ranges_of(pages: Sequence[bool], size: int, gap: int = MERGE_GAP) -> list[list[int]]:
    """[offset, length] runs of resident pages, runs closer than `gap` bytes merged, clipped to the file."""
    out: list[list[int]] = []
    for i, hit in enumerate(pages):
        if not hit:
            continue
        offset = i * PAGE
        if out and offset <= out[-1][0] + out[-1][1] + gap:
            out[-1][1] = offset + PAGE - out[-1][0]
        else:
            out.append([offset, PAGE])
    if out:
        out[-1][1] = min(out[-1][1], size - out[-1][0])
    return out


def _relative(path: str, bases: Sequence[str]) -> str | None:
    real = os.path.realpath(path)
    for base in sorted(bases, key=len, reverse=True):  # the deepest entry: site-packages before its parents
        if real.startswith(base + os.sep):
            return real[len(base) + 1 :]
    return None


def order(modules: Sequence[str], maps: Sequence[str], bases: Sequence[str]) -> list[str]:
    """Relative paths in start order: modules as imported; a library mapped but not itself a module (numpy.libs'
    OpenBLAS) just before the first module of its package (the extension that loads it)."""
    rels = [r for r in (_relative(p, bases) for p in modules) if r is not None]
    seen = set(rels)
    for lib in dict.fromkeys(r for r in (_relative(p, bases) for p in maps) if r is not None):
        if lib in seen or not (lib.endswith(".so") or ".so." in lib):
            continue
        seen.add(lib)
        top = lib.split("/", 1)[0].removesuffix(".libs")
        at = next((i for i, r in enumerate(rels) if r.split("/", 1)[0] == top and r.endswith(".so")), len(rels))
        rels.insert(at, lib)
    return rels


def record(out: Path | None = None, model: Path | None = None, cwd: Path | None = None) -> dict[str, Any]:
    """Run a start twice (the second from a cold page cache) and write the list; returns its summary."""
    out = out or LIST
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WARMSTART_", "AWS_LAMBDA_RUNTIME_API"))}
    # An on-demand start, the one whose first answer waits on the reads (no warm-up: a lean one, without numpy,
    # for an embedding model on the C API: handler.runtime.prefetch.lean_start)
    env.update(
        {"WARMSTART_PREFETCH": "off", "PYTHONDONTWRITEBYTECODE": "1", "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand"}
    )
    if model is not None:
        env["WARMSTART_MODEL"] = str(model.resolve())
    code_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([code_root, *filter(None, [env.get("PYTHONPATH")])])
    cwd = cwd or Path(code_root)
    first = _child(env, cwd)
    bases = [os.path.realpath(p) for p in first["path"] if p and os.path.isdir(p)]
    rels = order(first["modules"], first["maps"], bases)
    deepest = sorted(bases, key=len, reverse=True)
    real = {r: next(os.path.join(b, r) for b in deepest if os.path.isfile(os.path.join(b, r))) for r in rels}
    evict(real.values())
    pinned = {r: resident(p) for r, p in real.items()}  # pages mapped by other processes stay: not ours to judge
    _child(env, cwd)
    files: list[list[Any]] = []
    total = 0
    for r in rels:
        path = real[r]
        size = os.path.getsize(path)
        if pinned[r] and all(pinned[r]):
            # Its pages could not be evicted (mapped by another process, or a RAM disk): which the start read
            # is unknowable, so all of it, as the prefetch read libraries before there were lists.
            files.append([r, None])
            total += size
            continue
        spans = ranges_of(resident(path), size)
        if not spans:
            continue
        n = sum(length for _, length in spans)
        total += n
        files.append([r, None if n >= size else spans])
    doc = {
        "version": VERSION,
        "cache_tag": sys.implementation.cache_tag,
        "backend": first["backend"],
        "mb": round(total / 2**20, 1),
        "probe": sample(files, PROBE),
        "files": files,
    }
    # One JSON document; its first line is the header (every field but `files`), which `_head` parses alone.
    head = json.dumps({k: v for k, v in doc.items() if k != "files"})
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(f"{head[:-1]},\n" + '"files": ' + json.dumps(files, indent=0) + "}\n")
    os.replace(tmp, out)
    return {k: v for k, v in doc.items() if k not in ("files", "probe")} | {"files": len(files), "out": str(out)}


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m handler.runtime.startrecord", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, help="packed model to start with (default: as init finds it)")
    p.add_argument("--out", type=Path, default=None, help=f"default: {LIST.name} beside this module")
    p.add_argument(
        "--pth",
        action="store_true",
        help="also replay it from interpreter start: a .pth file in this interpreter's site-packages (images)",
    )
    args = p.parse_args(argv)
    summary = record(args.out, args.model)
    if args.pth:
        import sysconfig

        summary["pth"] = str(install_pth(Path(sysconfig.get_paths()["purelib"]), args.out))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
