"""handler/runtime/codebundle.py: the init chain's compiled modules from one file, never a stale one, with the
module's identity (__file__, __spec__, loader) and its tracebacks as from its own source."""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest

from handler.runtime import codebundle

ROOT = Path(__file__).resolve().parents[2]

# Imports the named modules with the bundle installed and reports where each came from.
PROBE = """
import json, sys, traceback
from handler.runtime import codebundle
finder = codebundle.install(sys.argv[1])
names = json.loads(sys.argv[2])
import importlib
out = {"installed": finder is not None, "modules": {}}
for name in names:
    m = importlib.import_module(name)
    out["modules"][name] = {
        "loader": type(m.__spec__.loader).__name__, "file": m.__file__, "origin": m.__spec__.origin,
        "path": getattr(m, "__path__", None), "cached": m.__cached__,
    }
if "handler.core.manifest" in names:
    try:
        sys.modules["handler.core.manifest"].open_regular("/nonexistent/warmstart")
    except Exception:
        frame = traceback.extract_tb(sys.exc_info()[2])[-1]
        out["frame"] = [frame.filename, frame.lineno, frame.line]
out["report"] = codebundle.report()
codebundle.uninstall()
out["finder_left"] = any(type(f).__name__ == "BundleFinder" for f in sys.meta_path)
print(json.dumps(out))
"""


def _probe(bundle: Path, names: list[str], **env: str) -> dict:  # type: ignore[type-arg]
    base = {k: v for k, v in os.environ.items() if not k.startswith("WARMSTART_")}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(bundle), json.dumps(names)],
        cwd=ROOT,
        env={**base, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict = json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[type-arg]
    return result


MODULES = ["handler.core", "handler.core.errors", "handler.core.manifest"]


def test_bundled_modules_keep_their_identity_and_tracebacks(tmp_path: Path) -> None:
    bundle = tmp_path / "b.bin"
    assert codebundle.write(MODULES, str(bundle))["modules"] == 3
    seen = _probe(bundle, MODULES)
    assert seen["installed"] and seen["report"] == {"modules": 3, "stale": [], "hashed": 0}
    manifest = seen["modules"]["handler.core.manifest"]
    source = str(ROOT / "handler" / "core" / "manifest.py")
    assert manifest["loader"] == "BundleLoader"
    assert manifest["file"] == manifest["origin"] == source
    assert manifest["cached"] == str(ROOT / "handler/core/__pycache__" / f"manifest.{sys.implementation.cache_tag}.pyc")
    package = seen["modules"]["handler.core"]
    assert package["file"] == str(ROOT / "handler" / "core" / "__init__.py")
    assert package["path"] == [str(ROOT / "handler" / "core")]
    # The frame that raised names the source file and the line as the source has it.
    filename, lineno, line = seen["frame"]
    assert filename == source
    assert Path(source).read_text().splitlines()[lineno - 1].strip() == line
    assert line.startswith("raise ModelLoadError")
    assert not seen["finder_left"]


def test_a_stale_entry_is_not_used(tmp_path: Path) -> None:
    bundle = tmp_path / "b.bin"
    codebundle.write(MODULES, str(bundle))
    stamp, entries = marshal.loads(bundle.read_bytes())
    rel, mtime_ns, size, package, code, _ = entries["handler.core.manifest"]
    # as if edited since: another mtime, and a hash that is not the source's
    entries["handler.core.manifest"] = (rel, mtime_ns - 1, size, package, code, codebundle.source_hash(b"other"))
    bundle.write_bytes(marshal.dumps((stamp, entries)))
    seen = _probe(bundle, MODULES)
    assert seen["modules"]["handler.core.manifest"]["loader"] == "SourceFileLoader"
    assert seen["modules"]["handler.core.errors"]["loader"] == "BundleLoader"
    assert seen["report"] == {"modules": 2, "stale": ["handler.core.manifest"], "hashed": 0}


def test_another_mtime_with_the_same_source_is_used_after_its_hash(tmp_path: Path) -> None:
    """What a zip layer gives (mtimes to 2 s, or the extraction's time): the source unchanged, its mtime not."""
    bundle = tmp_path / "b.bin"
    codebundle.write(MODULES, str(bundle))
    stamp, entries = marshal.loads(bundle.read_bytes())
    rel, mtime_ns, *rest = entries["handler.core.manifest"]
    entries["handler.core.manifest"] = (rel, mtime_ns - 10**9, *rest)
    bundle.write_bytes(marshal.dumps((stamp, entries)))
    seen = _probe(bundle, MODULES)
    assert {m["loader"] for m in seen["modules"].values()} == {"BundleLoader"}
    assert seen["report"] == {"modules": 3, "stale": [], "hashed": 1}


def test_a_changed_source_is_never_run_from_the_bundle(tmp_path: Path) -> None:
    # A module copied under a temporary root, bundled, then edited: the edit is what runs.
    pkg = tmp_path / "bundled_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("VALUE = 1\n")
    bundle = tmp_path / "b.bin"
    codebundle.write(["bundled_pkg", "bundled_pkg.mod"], str(bundle), root=str(tmp_path))
    (pkg / "mod.py").write_text("VALUE = 22\n")  # another size: stale whatever the clock's resolution
    assert _run_bundled(tmp_path, bundle) == ["22", "SourceFileLoader", "['bundled_pkg.mod']"]
    # The same size, another mtime (as a zip layer's): the source's hash is what tells the edit apart.
    codebundle.write(["bundled_pkg", "bundled_pkg.mod"], str(bundle), root=str(tmp_path))
    (pkg / "mod.py").write_text("VALUE = 33\n")
    stat = (pkg / "mod.py").stat()
    os.utime(pkg / "mod.py", ns=(stat.st_atime_ns, stat.st_mtime_ns + 2 * 10**9))
    assert _run_bundled(tmp_path, bundle) == ["33", "SourceFileLoader", "['bundled_pkg.mod']"]


def _run_bundled(tmp_path: Path, bundle: Path) -> list[str]:
    code = (
        "import sys; from handler.runtime import codebundle\n"
        f"f = codebundle.install({str(bundle)!r}); f.root = {str(tmp_path)!r}\n"
        "import bundled_pkg.mod as m; print(m.VALUE, type(m.__spec__.loader).__name__, f.stale)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return proc.stdout.split()


def test_a_malformed_entry_is_imported_the_ordinary_way(tmp_path: Path) -> None:
    bundle = tmp_path / "b.bin"
    codebundle.write(MODULES, str(bundle))
    stamp, entries = marshal.loads(bundle.read_bytes())
    entries["handler.core.errors"] = ("handler/core/errors.py", 1)  # not this layout's five fields
    bundle.write_bytes(marshal.dumps((stamp, entries)))
    seen = _probe(bundle, MODULES)
    assert seen["modules"]["handler.core.errors"]["loader"] == "SourceFileLoader"
    assert seen["modules"]["handler.core.manifest"]["loader"] == "BundleLoader"


@pytest.mark.parametrize("how", ["another python", "off", "absent", "garbage"])
def test_a_bundle_that_does_not_fit_is_not_used_at_all(tmp_path: Path, how: str) -> None:
    bundle = tmp_path / "b.bin"
    codebundle.write(MODULES, str(bundle))
    env = {}
    if how == "another python":
        stamp, entries = marshal.loads(bundle.read_bytes())
        bundle.write_bytes(marshal.dumps(((stamp[0], "cpython-30", *stamp[2:]), entries)))
    elif how == "off":
        env["WARMSTART_CODE_BUNDLE"] = "off"
    elif how == "absent":
        bundle.unlink()
    else:
        bundle.write_bytes(b"\x00not marshal")
    seen = _probe(bundle, MODULES, **env)
    assert not seen["installed"]
    assert {m["loader"] for m in seen["modules"].values()} == {"SourceFileLoader"}
    assert seen["report"]["modules"] == 0 and seen["report"]["why"]


def test_init_loads_its_chain_from_the_bundle_and_takes_the_finder_off(model_dir: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "b.bin"
    names = codebundle.modules_of_init(str(model_dir))
    assert "handler.runtime.invocation" in names and "handler.app" not in names
    # The prefetch's reader (imported by prefetch.start on init's thread; the listing start runs without a prefetch).
    assert "handler.runtime.startfiles" in names
    codebundle.write(names, str(bundle))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("WARMSTART_", "OPENBLAS_", "AWS_"))}
    env = {**base, "WARMSTART_MODEL": str(model_dir), "WARMSTART_WARMUP": "0", "WARMSTART_CODE_BUNDLE": str(bundle)}
    code = (
        "import json, sys, handler.app\n"
        "print(json.dumps({'report': handler.app.runtime.init_report['coldstart']['code_bundle'],"
        " 'finder': [type(f).__name__ for f in sys.meta_path],"
        " 'loader': type(sys.modules['handler.runtime.invocation'].__spec__.loader).__name__,"
        " 'prefetch': type(sys.modules['handler.runtime.startfiles'].__spec__.loader).__name__}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["report"] == {"modules": len(names), "stale": [], "hashed": 0}
    assert seen["loader"] == seen["prefetch"] == "BundleLoader"
    assert "BundleFinder" not in seen["finder"]
