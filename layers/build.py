"""Build the zip + SnapStart path's artifacts: function code, dependency layer, model layer.

    python -m layers.build [--out build/layers] [--model DIR] [--wheels DIR] [--limit-mb 250]

- function.zip: the `handler` package only (so `handler.app.lambda_handler` resolves at /var/task), with the init
                chain's compiled modules in one file (handler/runtime/codebundle.py) when this Python is the
                layer's (a Lambda zip holds no `.pyc`: without it every start compiles each module);
- deps.zip:     `python/...` (on sys.path from /opt/python), manylinux wheels for cp312 x86_64, pruned;
- model.zip:    `models/default/...` (the handler's fallback /opt/models/default);
- warmer.zip:   the `warmers` package, for the warmer function.

Reproducible: entries sorted, one fixed timestamp, permissions normalized, so the same inputs give the same
zip SHA-256. The unzipped total (function + layers) is checked against Lambda's 250 MB before any zip is
written; past it the build stops with `LayerSizeError` and the size table.
"""

from __future__ import annotations

import argparse
import calendar
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MB = 1024 * 1024
# Function code plus all its layers, unzipped (Lambda quotas: "250 MB").
LAMBDA_UNZIPPED_LIMIT = 250 * MB
PYTHON_VERSION = "3.12"
LAMBDA_TASK_ROOT = "/var/task"  # where Lambda unpacks function.zip: the name the bundle's frames carry
# python3.12 runs on Amazon Linux 2023 (glibc 2.34): any manylinux wheel from 2014 (glibc 2.17) to 2.34 fits.
# Listed one by one because pip does not widen `--platform` to older glibc tags (numpy >= 2.3 ships 2_28 only).
PLATFORMS = ("manylinux2014_x86_64", *(f"manylinux_2_{minor}_x86_64" for minor in range(17, 35)))
# ZIP's epoch: every entry gets it, so rebuilding never changes the hash.
FIXED_DATE = (1980, 1, 1, 0, 0, 0)
# Already dense: deflating weights costs seconds per build and saves a few percent.
STORED_SUFFIXES = (".onnx.data", ".safetensors")
PRUNE_DIRS = frozenset({"__pycache__", "tests", "test"})
# The managed runtime brings boto3 (and the function never imports it); pip's bookkeeping and console
# scripts name the build machine's paths, so they would make the layer irreproducible.
PRUNE_TOP = ("boto3", "botocore", "s3transfer", "bin")
PRUNE_DIST_INFO = frozenset({"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"})
PRUNE_SUFFIXES = (".pyc", ".pyo", ".pyi")


class LayerBuildError(RuntimeError):
    """A layer cannot be built (pip failed, the model is broken, or it does not fit)."""


class LayerSizeError(LayerBuildError):
    """The unzipped total passes Lambda's limit."""


@dataclass(frozen=True)
class Artifact:
    name: str
    files: int
    unzipped: int
    zipped: int = 0
    sha256: str = ""


def install_wheels(requirements: Path, target: Path, wheels: Path | None = None) -> None:
    """pip-install manylinux cp312 wheels into `target`; `--no-deps`: the requirements file is the closure."""
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"]
    cmd += ["--no-deps", "--only-binary=:all:", "--implementation", "cp", "--python-version", PYTHON_VERSION]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    if wheels is not None:
        cmd += ["--no-index", "--find-links", str(wheels)]
    cmd += ["--target", str(target), "-r", str(requirements)]
    if subprocess.run(cmd).returncode != 0:
        raise LayerBuildError(
            f"pip could not install {requirements} for cp312 manylinux x86_64 (pip's output is above)"
        )


def prune(root: Path) -> list[str]:
    """Delete what a Lambda never needs; returns the removed paths (relative, sorted)."""
    removed: list[str] = []
    for path in sorted(root.rglob("*"), reverse=True):  # children before parents
        if not path.exists() and not path.is_symlink():
            continue  # inside a directory already removed
        rel = path.relative_to(root)
        top = rel.parts[0]
        doomed = (
            (path.is_dir() and path.name in PRUNE_DIRS)
            or top in PRUNE_TOP
            or any(top.startswith(f"{name}-") and top.endswith(".dist-info") for name in PRUNE_TOP)
            or (path.parent.name.endswith(".dist-info") and path.name in PRUNE_DIST_INFO)
            or (path.is_file() and path.name.endswith(PRUNE_SUFFIXES))
        )
        if doomed:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(rel.as_posix())
    return sorted(removed)


def walk(root: Path) -> Iterator[Path]:
    """Files under root in a stable order (symlinks followed: the zip holds contents)."""
    yield from sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.relative_to(root).as_posix())


def tree_size(root: Path) -> tuple[int, int]:
    files = list(walk(root))
    return len(files), sum(p.stat().st_size for p in files)


def write_zip(root: Path, prefix: str, out: Path) -> Artifact:
    """Zip root's files under `prefix/`, byte-for-byte reproducible; returns sizes and SHA-256."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    files = unzipped = 0
    with zipfile.ZipFile(tmp, "w") as zf:
        for path in walk(root):
            info = zipfile.ZipInfo(f"{prefix}/{path.relative_to(root).as_posix()}", date_time=FIXED_DATE)
            info.create_system = 3  # unix, so external_attr carries the mode
            mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
            info.external_attr = (0o100000 | mode) << 16
            stored = path.name.endswith(STORED_SUFFIXES)
            info.compress_type = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
            with path.open("rb") as src, zf.open(info, "w", force_zip64=True) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            files += 1
            unzipped += info.file_size
    tmp.replace(out)
    digest = hashlib.sha256()
    with out.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return Artifact(out.name, files, unzipped, out.stat().st_size, digest.hexdigest())


def size_table(artifacts: Sequence[Artifact], limit: int) -> str:
    rows = [f"{'artifact':<14}{'files':>7}{'unzipped MB':>13}{'zipped MB':>11}  sha256"]
    for a in artifacts:
        zipped = f"{a.zipped / MB:11.1f}" if a.zipped else f"{'-':>11}"
        rows.append(f"{a.name:<14}{a.files:>7}{a.unzipped / MB:13.1f}{zipped}  {a.sha256 or '-'}")
    total = sum(a.unzipped for a in artifacts)
    rows.append(f"{'total':<14}{sum(a.files for a in artifacts):>7}{total / MB:13.1f}")
    rows.append(f"{'limit':<14}{'':>7}{limit / MB:13.1f}   (Lambda: function + layers, unzipped)")
    return "\n".join(rows)


def check_limit(sizes: Sequence[Artifact], limit: int) -> None:
    total = sum(a.unzipped for a in sizes)
    if total > limit:
        parts = ", ".join(f"{a.name} {a.unzipped / MB:.1f} MB" for a in sizes)
        raise LayerSizeError(
            f"unzipped total {total / MB:.1f} MB passes Lambda's {limit / MB:.0f} MB limit for a function and "
            f"its layers ({parts}). Pack the model with one backend (`warmstart pack --default --backends onnx`), "
            f"drop dependencies, or deploy the container image instead (10 GB).\n{size_table(sizes, limit)}"
        )


def default_model(work: Path, optimize: bool = True, requirements: Path = ROOT / "layers" / "requirements.txt") -> Path:
    """The embedded default model, ONNX only (both backends would not fit beside the dependencies); with
    `optimize` (the default), also pre-optimized for this machine when its onnxruntime is the layer's pinned one.
    `build` keeps the optimized files only where they fit (see `build`): the portable model is always there,
    the fallback on a host with other CPU features."""
    from infra.pack import pack_default  # pack-time deps (torch, transformers, onnx, the model package)

    out = work / "model-onnx"
    if not (out / "manifest.json").is_file():
        pack_default(out, ["onnx"], force=True)
    if optimize:
        print(optimize_for_layer(out, requirements))
    else:
        from infra.pack.optimize import remove

        remove(out)  # an earlier build's optimized files: --no-optimize means none
    return out


def optimize_for_layer(model: Path, requirements: Path) -> str:
    """Prepacked weights are valid only for the ORT version that made them: made here only when this machine's
    onnxruntime is the one the dependency layer pins (the layer's CPU features are checked at load)."""
    import onnxruntime

    from infra.pack.optimize import optimize, remove

    pins = dict(
        line.split("==", 1)
        for line in requirements.read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    pinned = pins.get("onnxruntime", "").strip()
    if pinned != onnxruntime.__version__:
        remove(model)
        return f"optimize: skipped, onnxruntime here {onnxruntime.__version__} != the layer's {pinned or 'unpinned'}"
    entry = optimize(model)
    return (
        f"optimize: prepacked for onnxruntime {entry['onnxruntime']} {entry['arch']} {','.join(entry['cpu_features'])}"
    )


def build(
    out: Path,
    model: Path,
    requirements: Path = ROOT / "layers" / "requirements.txt",
    wheels: Path | None = None,
    limit: int = LAMBDA_UNZIPPED_LIMIT,
    code: Path = ROOT / "handler",
) -> list[Artifact]:
    """Build all three zips into `out`; raises LayerSizeError (writing nothing) when over `limit`.

    A model with a pre-optimized copy that would pass `limit` goes without it (its manifest entry and files
    dropped in the layer, never in `model`; `dropped` says so): the portable model serves, as it would on a
    host the optimized one was not made for. The default model's is: 127 MB of optimized data beside the
    88 MB portable model and ~120 MB of dependencies."""
    from handler.core.manifest import load_manifest

    manifest = load_manifest(model)  # a broken model fails here, not at the first cold start
    with tempfile.TemporaryDirectory(prefix="warmstart-layers-") as tmp:
        code_dir, deps_dir, model_dir = Path(tmp) / "handler", Path(tmp) / "python", Path(tmp) / "model"
        # Only what the manifest lists (symlinked, not copied: weights are large), never strays beside it.
        model_dir.mkdir()
        for name in ["manifest.json", *manifest.files]:
            (model_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (model_dir / name).symlink_to((model / name).resolve())
        # Not the build machine's start list (its paths and pages are this checkout's): see record_start. Nor its
        # code bundle (this checkout's mtimes, maybe another Python): bundle_code writes the function's own.
        shutil.copytree(code, code_dir, ignore=shutil.ignore_patterns("startfiles.json", "codebundle.bin"))
        deps_dir.mkdir()
        install_wheels(requirements, deps_dir, wheels)
        prune(code_dir)
        prune(deps_dir)
        print(bundle_code(code_dir, model))
        plan = [
            ("function.zip", code_dir, "handler"),
            ("deps.zip", deps_dir, "python"),
            ("model.zip", model_dir, "models/default"),
        ]
        sizes = [Artifact(name, *tree_size(src)) for name, src, _ in plan]
        if sum(a.unzipped for a in sizes) > limit and "optimized" in manifest.backends.get("onnx", {}):
            dropped = drop_optimized(model_dir)
            print(f"optimize: the optimized model ({dropped / MB:.1f} MB) would pass the limit; the portable one ships")
            sizes = [Artifact(name, *tree_size(src)) for name, src, _ in plan]
        check_limit(sizes, limit)
        return [write_zip(src, prefix, out / name) for name, src, prefix in plan]


def bundle_code(code_dir: Path, model: Path) -> str:
    """The init chain's compiled modules in one file inside the function's `handler` (handler/runtime/codebundle.py),
    when this Python's bytecode is the layer's (a bundle is per magic number); returns what was done.

    Each file's mtime is first set to the zip's fixed date (as UTC), so the bundle records the mtimes the zip
    carries (and the same bytes whatever the checkout's mtimes). An extraction that keeps them (in UTC) takes
    the one-stat check; one that does not (another time zone, the extraction's own time) takes the hash check:
    the same size, the source read once and its hash compared, still no compile. A source changed after the
    build is never run from the bundle either way."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if version != PYTHON_VERSION:
        why = "compiled code is per version"
        return f"code bundle: skipped, this Python is {version}, the layer's {PYTHON_VERSION} ({why})"
    from handler.runtime import codebundle

    epoch = calendar.timegm((*FIXED_DATE, 0, 0, 0))
    for path in code_dir.rglob("*"):
        os.utime(path, (epoch, epoch), follow_symlinks=False)
    try:
        names = codebundle.modules_of_init(str(model))
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:  # the build goes on: each module imported
        return f"code bundle: skipped, the start that lists its modules failed ({str(e).splitlines()[0]})"
    out = code_dir / "runtime" / os.path.basename(codebundle.BUNDLE)
    summary = codebundle.write(names, str(out), root=str(code_dir.parent), runs_at=LAMBDA_TASK_ROOT)
    os.utime(out, (epoch, epoch))
    return f"code bundle: {summary['modules']} modules of the init chain, {summary['bytes'] / MB:.1f} MB"


def drop_optimized(model_dir: Path) -> int:
    """Take the optimized model out of a layer's model tree (symlinks to the source model: the manifest is
    replaced by a copy, the links removed, the source untouched); returns the bytes dropped."""
    from infra.pack.optimize import remove

    manifest = model_dir / "manifest.json"
    text = manifest.read_text()
    entry = json.loads(text)["backends"]["onnx"]["optimized"]
    size: int = sum((model_dir / name).stat().st_size for name in entry.get("files", []))
    manifest.unlink()
    manifest.write_text(text)
    remove(model_dir)
    return size


def build_warmer(out: Path, src: Path = ROOT / "warmers") -> Artifact | None:
    """warmer.zip for the warmer function (its own 250 MB budget); None until warmers/ has code (issue 6)."""
    if not any(src.glob("*.py")):
        return None
    with tempfile.TemporaryDirectory(prefix="warmstart-warmer-") as tmp:
        code = Path(tmp) / "warmers"
        shutil.copytree(src, code)
        prune(code)
        return write_zip(code, "warmers", out / "warmer.zip")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m layers.build", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "build" / "layers", help="output directory")
    p.add_argument("--model", type=Path, help="packed model directory (default: pack the default model, onnx)")
    p.add_argument("--requirements", type=Path, default=ROOT / "layers" / "requirements.txt")
    p.add_argument("--wheels", type=Path, help="install from this wheel directory only (offline)")
    p.add_argument("--limit-mb", type=float, default=LAMBDA_UNZIPPED_LIMIT / MB, help="unzipped limit (MB)")
    p.add_argument(
        "--no-optimize",
        action="store_true",
        help="default model: the portable ONNX model only (by default also pre-optimized where it fits)",
    )
    args = p.parse_args(argv)
    from handler.core.errors import ModelLoadError

    model = args.model or default_model(ROOT / "build", optimize=not args.no_optimize, requirements=args.requirements)
    try:
        artifacts = build(args.out, model, args.requirements, args.wheels, int(args.limit_mb * MB))
    except (LayerBuildError, ModelLoadError) as e:
        print(f"layers.build: {e}", file=sys.stderr)
        return 1
    print(size_table(artifacts, int(args.limit_mb * MB)))
    warmer = build_warmer(args.out)
    if warmer is None:
        print("warmer.zip: skipped, warmers/ has no code yet (template.yaml's WarmerFunction needs it)")
    else:
        print(f"warmer.zip: {warmer.files} files, {warmer.unzipped / MB:.1f} MB unzipped, sha256 {warmer.sha256}")
    return 0


if __name__ == "__main__":
    if not __package__:  # `python layers/build.py`: make `handler` importable as with `python -m`
        sys.path.insert(0, str(ROOT))
    sys.exit(main())
