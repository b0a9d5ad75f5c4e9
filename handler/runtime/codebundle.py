"""The init chain's own modules as one file of compiled code, written where the function is built (`make setup`,
beside startfiles.json) and read once at init instead of one `.pyc` per module.

Why: importing one of warmstart's ~45 modules on the Lambda path costs the import system a directory stat, a
source stat, a `.pyc` open, fstat, two reads and a close (strace: ~10 system calls) plus its Python steps to
find, check and read the file (~0.3 M instructions). From the bundle it is one source stat and a dict lookup.

What stays right: each module is compiled from its own source path, so `__file__`, `__spec__.origin` and the
frames of a traceback name the source file and line, as from a `.pyc`; the loader is a `SourceFileLoader` for
that path (`get_source`, `inspect`, a reload read the file as before). Each entry records its source's size,
mtime and hash (`_imp.source_hash`, what a hash-checked `.pyc` records): the same size and mtime use it at the
cost of one stat; the same size and another mtime (a zip layer keeps mtimes to 2 s, or none, and an image
build may touch them) read the source once and use the entry only when the hash is the recorded one (`hashed`
in the report: still no compile, where a zip layer ships no `.pyc` at all); anything else is imported the
ordinary way (a stale entry is never used). A bundle written by another bytecode (magic number, cache tag,
optimization level: what a `.pyc` is checked on) or another layout is not used at all. The finder is placed
first only while `handler.app` initializes (`install` ... `uninstall`); WARMSTART_CODE_BUNDLE=off turns it off.

Writing: `python -m handler.runtime.codebundle [--model DIR] [--out FILE]` imports `handler.app` in a child (no
bundle) and bundles the `handler` modules it loaded, stdlib only. Written by `make setup`, the CPU image's build
(infra/deploy/Dockerfile) and the zip path's function.zip (layers/build.py, when its Python is the layer's).
"""

from __future__ import annotations

import _imp
import importlib.machinery
import marshal
import os
import sys
from collections.abc import Sequence
from importlib._bootstrap_external import MAGIC_NUMBER  # the import system's own (always loaded)
from typing import Any

BUNDLE = os.path.join(os.path.dirname(__file__), "codebundle.bin")
VERSION = 2  # entries: (source path, mtime_ns, size, is a package, code, source hash)
# Imported before the finder is in place (handler.app installs it): never looked up in the bundle.
BEFORE = frozenset({"handler", "handler.app", "handler.runtime", "handler.runtime.codebundle"})
# The code root: the directory that holds the `handler` package; entries are relative to it.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _stamp() -> tuple[Any, ...]:
    """What compiled code depends on besides its source, as a `.pyc` is checked (magic number, cache tag) plus the
    optimization level: a bundle with another stamp is not used. Not the patch release: a 3.12 build machine's
    bundle serves Lambda's 3.12, as its `.pyc` files would."""
    return (VERSION, sys.implementation.cache_tag, MAGIC_NUMBER, sys.flags.optimize)


_RAW_MAGIC = int.from_bytes(MAGIC_NUMBER, "little")  # the key a hash-checked .pyc's hash uses


def source_hash(source: bytes) -> bytes:
    """The source's hash as a hash-checked `.pyc` records it (SipHash keyed by the magic number: in C, cheap)."""
    return _imp.source_hash(_RAW_MAGIC, source)


class BundleLoader(importlib.machinery.SourceFileLoader):
    """A source file's loader that hands out the bundled code object once (the first exec); anything after that
    (a reload) reads the source or `.pyc` as the plain loader does."""

    def __init__(self, fullname: str, path: str, code: Any) -> None:
        super().__init__(fullname, path)
        self._code = code

    def get_code(self, fullname: str) -> Any:
        code, self._code = self._code, None
        if code is not None and fullname == self.name:
            # Compiled under another root (a zip layer's bundle names /var/task): the frames name this file, as
            # the import system does for a moved `.pyc` (in C; nothing to do when the names are equal).
            _imp._fix_co_filename(code, self.path)  # type: ignore[attr-defined]  # (not in typeshed)
            return code
        return super().get_code(fullname)


class BundleFinder:
    """First on sys.meta_path during init: a module in the bundle whose source is unchanged comes from it."""

    def __init__(self, entries: dict[str, tuple[str, int, int, bool, Any, bytes]], root: str = _ROOT) -> None:
        self.entries = entries
        self.root = root
        self.used: list[str] = []
        self.stale: list[str] = []
        self.hashed = 0  # used after checking the source's hash (its mtime was not the recorded one)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        entry = self.entries.pop(fullname, None)
        if entry is None:
            return None
        try:
            rel, mtime_ns, size, package, code, digest = entry
            st = os.stat(origin := os.path.join(self.root, rel))
            fresh = st.st_size == size and (st.st_mtime_ns == mtime_ns or self._same_source(origin, digest))
        except (OSError, TypeError, ValueError):  # gone, or an entry not of this layout: the ordinary import
            fresh = False
        if not fresh:
            self.stale.append(fullname)  # edited since the bundle was written: the ordinary import
            return None
        spec = importlib.machinery.ModuleSpec(fullname, BundleLoader(fullname, origin, code), origin=origin)
        spec.has_location = True  # __file__ (and __cached__) set from origin, as for a file-found module
        if package:
            spec.submodule_search_locations = [os.path.dirname(origin)]
        self.used.append(fullname)
        return spec

    def _same_source(self, origin: str, digest: bytes) -> bool:
        """Another mtime, the same size: the entry is used only if the source is the one compiled."""
        with open(origin, "rb") as f:
            same = source_hash(f.read()) == digest
        self.hashed += same
        return same


_finder: BundleFinder | None = None
_last: BundleFinder | None = None  # the finder of this start, kept for the init report after uninstall
_why = "not installed"
OFF = ("off", "0", "false", "no")


def install(path: str | None = None, environ: Any = None) -> BundleFinder | None:
    """Read the bundle and put its finder first on sys.meta_path; None (nothing changed) when there is none,
    it is switched off, unreadable, or written by another Python. WARMSTART_CODE_BUNDLE: `on` (default: the
    file beside this module), `off`, or a bundle's path."""
    global _finder, _last, _why
    env = os.environ if environ is None else environ
    wanted = (env.get("WARMSTART_CODE_BUNDLE") or "").strip()
    if wanted.lower() in OFF:
        _why = "WARMSTART_CODE_BUNDLE=off"
        return None
    where = path or (wanted if wanted and wanted.lower() not in ("on", "1", "true", "yes") else BUNDLE)
    try:
        with open(where, "rb") as f:
            stamp, entries = marshal.loads(f.read())
    except FileNotFoundError:
        _why = "no bundle (make setup writes it)"
        return None
    except (OSError, EOFError, ValueError, TypeError) as e:
        _why = f"unreadable: {type(e).__name__}"
        return None
    if stamp != _stamp() or not isinstance(entries, dict):
        _why = "written by another Python or bundle version"
        return None
    uninstall()
    _finder = _last = BundleFinder(entries)
    sys.meta_path.insert(0, _finder)
    return _finder


def uninstall() -> None:
    """Take the finder off sys.meta_path (init is over: later imports go the ordinary way)."""
    global _finder
    if _finder is not None:
        if _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        _finder = None


def report() -> dict[str, Any]:
    """For the init report: how many modules came from the bundle and which were stale, or why none did."""
    if _last is None:
        return {"modules": 0, "why": _why}
    return {"modules": len(_last.used), "stale": list(_last.stale), "hashed": _last.hashed}


# -- writing (build time) ---------------------------------------------------------------------------------------

_CHILD = """
import json, sys
import handler.app
print(json.dumps(sorted(n for n in sys.modules if n == "handler" or n.startswith("handler."))))
"""
# What a start with its prefetch on also imports (`prefetch.start`, on init's thread, before the first import
# below it): the listing child runs without a prefetch (it would read ahead for nothing), so they are named here.
PREFETCH_MODULES = ("handler.runtime.startfiles",)


def modules_of_init(model: str | None = None) -> list[str]:
    """The `handler` modules a start imports (handler.app in a child, bundle and prefetch off; the prefetch's own
    added: `PREFETCH_MODULES`)."""
    import json
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith(("WARMSTART_", "AWS_LAMBDA_RUNTIME_API"))}
    env.update({"WARMSTART_PREFETCH": "off", "WARMSTART_CODE_BUNDLE": "off"})
    if model is not None:
        env["WARMSTART_MODEL"] = os.path.abspath(model)
    env["PYTHONPATH"] = os.pathsep.join([_ROOT, *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD], cwd=_ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the start that lists the modules failed:\n{proc.stderr[-3000:]}")
    names: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return [n for n in sorted({*names, *PREFETCH_MODULES}) if n not in BEFORE]


def write(
    names: Sequence[str], out: str | None = None, root: str = _ROOT, runs_at: str | None = None
) -> dict[str, Any]:
    """Compile each named module's source (found under `root`) into one bundle; returns its summary. `runs_at`:
    the root the code will run from, when not `root` (a zip layer built in a temporary folder runs from
    /var/task): the name its frames carry, and no build path in the bundle's bytes."""
    entries: dict[str, tuple[str, int, int, bool, Any, bytes]] = {}
    for name in names:
        parts = name.split(".")
        base = os.path.join(root, *parts)
        package = os.path.isfile(os.path.join(base, "__init__.py"))
        origin = os.path.join(base, "__init__.py") if package else base + ".py"
        if not os.path.isfile(origin):
            continue  # not a plain source module (an extension, a namespace package): the ordinary import
        with open(origin, "rb") as f:
            source = f.read()
        st = os.stat(origin)
        rel = os.path.relpath(origin, root)
        named = origin if runs_at is None else os.path.join(runs_at, rel)
        code = compile(source, named, "exec", dont_inherit=True, optimize=sys.flags.optimize)
        entries[name] = (rel, st.st_mtime_ns, st.st_size, package, code, source_hash(source))
    target = out or BUNDLE
    tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.tmp")
    with open(tmp, "wb") as f:
        f.write(marshal.dumps((_stamp(), entries)))
    os.replace(tmp, target)
    return {"modules": len(entries), "bytes": os.path.getsize(target), "out": target}


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m handler.runtime.codebundle", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="packed model to start with (default: as init finds it)")
    p.add_argument("--out", default=None, help=f"default: {os.path.basename(BUNDLE)} beside this module")
    args = p.parse_args(argv)
    print(write(modules_of_init(args.model), args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
