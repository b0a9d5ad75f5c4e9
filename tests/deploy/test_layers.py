"""layers/build.py offline: pip installs from wheels made here (no index), the model layer is the packed
default model, two builds give identical zips, and an unzipped total over the limit stops with a clear error."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest

from layers import build as layers

WHEELS = {
    # name -> files; `tests/`, stubs and boto3 must not reach the layer.
    "tinydep": {
        "tinydep/__init__.py": "VALUE = 1\n",
        "tinydep/__init__.pyi": "VALUE: int\n",
        "tinydep/tests/test_tiny.py": "def test(): pass\n",
    },
    "boto3": {"boto3/__init__.py": "raise ImportError('the managed runtime brings its own')\n"},
}


def make_wheel(directory: Path, name: str, files: dict[str, str]) -> None:
    """A minimal py3-none-any wheel (pip accepts it for any --platform)."""
    dist_info = f"{name}-1.0.dist-info"
    files = {
        **files,
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist_info}/RECORD,,")
    with zipfile.ZipFile(directory / f"{name}-1.0-py3-none-any.whl", "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
        zf.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    wheels = tmp_path_factory.mktemp("wheels")
    for name, files in WHEELS.items():
        make_wheel(wheels, name, files)
    requirements = wheels / "requirements.txt"
    requirements.write_text("tinydep==1.0\nboto3==1.0\n")
    return wheels, requirements


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_build_is_reproducible_pruned_and_fits(
    tmp_path: Path, wheelhouse: tuple[Path, Path], model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheels, requirements = wheelhouse
    first = layers.build(tmp_path / "a", model_dir, requirements, wheels)
    second = layers.build(tmp_path / "b", model_dir, requirements, wheels)
    assert [a.name for a in first] == ["function.zip", "deps.zip", "model.zip"]
    assert [a.sha256 for a in first] == [a.sha256 for a in second]
    assert all(a.sha256 == sha256(tmp_path / "a" / a.name) for a in first)

    deps = zipfile.ZipFile(tmp_path / "a" / "deps.zip")
    names = deps.namelist()
    assert "python/tinydep/__init__.py" in names and "python/tinydep-1.0.dist-info/METADATA" in names
    assert not [n for n in names if "/tests/" in n or n.endswith((".pyi", "RECORD", "INSTALLER")) or "boto3" in n]
    assert names == sorted(names)
    assert {i.date_time for i in deps.infolist()} == {layers.FIXED_DATE}
    assert {i.external_attr >> 16 for i in deps.infolist()} <= {0o100644, 0o100755}

    # The model layer is the packed model as the handler finds it at /opt/models/default: manifest + its files.
    from handler.core.manifest import load_manifest

    manifest = load_manifest(model_dir)
    model = zipfile.ZipFile(tmp_path / "a" / "model.zip")
    shipped = json.loads(model.read("models/default/manifest.json"))
    # `make setup` optimizes models/default; beside both backends' weights that copy passes the limit and
    # stays out (test_the_optimized_model_ships_where_it_fits...), every other file ships.
    gone = (
        set()
        if "optimized" in shipped["backends"]["onnx"]
        else set(manifest.backends["onnx"].get("optimized", {}).get("files", []))
    )
    listed = {f"models/default/{n}": e.size for n, e in manifest.files.items() if n not in gone}
    assert {i.filename: i.file_size for i in model.infolist() if not i.filename.endswith("manifest.json")} == listed
    code = zipfile.ZipFile(tmp_path / "a" / "function.zip").namelist()
    assert "handler/app.py" in code and not [n for n in code if "__pycache__" in n]

    print(layers.size_table(first, layers.LAMBDA_UNZIPPED_LIMIT))
    assert "limit" in capsys.readouterr().out
    assert sum(a.unzipped for a in first) <= layers.LAMBDA_UNZIPPED_LIMIT


def test_over_the_limit_stops_with_a_clear_error(
    tmp_path: Path, wheelhouse: tuple[Path, Path], model_dir: Path
) -> None:
    wheels, requirements = wheelhouse
    with pytest.raises(layers.LayerSizeError, match=r"passes Lambda's 1 MB limit.*model\.zip"):
        layers.build(tmp_path, model_dir, requirements, wheels, limit=1 * layers.MB)
    assert not list(tmp_path.glob("*.zip"))  # nothing half-written


def test_cli_reports_the_limit_and_exits_1(
    tmp_path: Path, wheelhouse: tuple[Path, Path], model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheels, requirements = wheelhouse
    argv = ["--out", str(tmp_path), "--model", str(model_dir), "--requirements", str(requirements)]
    assert layers.main([*argv, "--wheels", str(wheels), "--limit-mb", "1"]) == 1
    err = capsys.readouterr().err
    assert "passes Lambda's 1 MB limit" in err and "deps.zip" in err


def test_pip_failure_is_a_clear_error(tmp_path: Path, wheelhouse: tuple[Path, Path], model_dir: Path) -> None:
    wheels, _ = wheelhouse
    missing = tmp_path / "requirements.txt"
    missing.write_text("not-a-wheel-here==1.0\n")
    with pytest.raises(layers.LayerBuildError, match="pip could not install"):
        layers.build(tmp_path, model_dir, missing, wheels)


@pytest.fixture(scope="module")
def tiny_optimized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A packed tiny ONNX model with its pre-optimized copy (`warmstart optimize`)."""
    from infra.pack import pack_onnx
    from infra.pack.optimize import optimize
    from tests.conftest import write_tiny_onnx

    tmp = tmp_path_factory.mktemp("tiny-optimized")
    write_tiny_onnx(tmp / "tiny.onnx", 4)
    packed = pack_onnx(tmp / "tiny.onnx", tmp / "packed", "tiny", "1.0")
    optimize(packed)
    return packed


def zipped_manifest(path: Path) -> dict[str, Any]:
    with zipfile.ZipFile(path) as zf:
        manifest: dict[str, Any] = json.loads(zf.read("models/default/manifest.json"))
        names = zf.namelist()
    manifest["_zip_names"] = names
    return manifest


def test_the_optimized_model_ships_where_it_fits_and_is_dropped_where_it_does_not(
    tmp_path: Path, wheelhouse: tuple[Path, Path], tiny_optimized: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheels, requirements = wheelhouse
    full = layers.build(tmp_path / "a", tiny_optimized, requirements, wheels)
    kept = zipped_manifest(tmp_path / "a" / "model.zip")
    opt = kept["backends"]["onnx"]["optimized"]
    assert opt["files"] and all(f"models/default/{n}" in kept["_zip_names"] for n in opt["files"])
    assert "dropped" not in capsys.readouterr().out
    # A limit the portable model fits under and the optimized copy beside it passes: the portable model ships.
    limit = sum(a.unzipped for a in full) - 1
    small = layers.build(tmp_path / "b", tiny_optimized, requirements, wheels, limit=limit)
    assert sum(a.unzipped for a in small) <= limit
    assert "would pass the limit; the portable one ships" in capsys.readouterr().out
    dropped = zipped_manifest(tmp_path / "b" / "model.zip")
    assert "optimized" not in dropped["backends"]["onnx"]
    assert not [n for n in dropped["_zip_names"] if ".opt." in n]
    assert set(dropped["files"]) == set(kept["files"]) - set(opt["files"])
    # what shipped is a model init loads; the source directory still has its optimized copy
    from handler.core.manifest import load_manifest

    with zipfile.ZipFile(tmp_path / "b" / "model.zip") as zf:
        zf.extractall(tmp_path / "unzipped")
    assert load_manifest(tmp_path / "unzipped" / "models" / "default").backends["onnx"].get("optimized") is None
    assert "optimized" in load_manifest(tiny_optimized).backends["onnx"]
    assert all((tiny_optimized / n).is_file() for n in opt["files"])


def test_the_default_model_is_optimized_unless_asked_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_dir: Path
) -> None:
    asked: list[bool] = []

    def default_model(work: Path, optimize: bool = False, requirements: Path | None = None) -> Path:
        asked.append(optimize)
        return model_dir

    monkeypatch.setattr(layers, "default_model", default_model)
    monkeypatch.setattr(layers, "build", lambda *a, **k: [])
    monkeypatch.setattr(layers, "build_warmer", lambda out: None)
    assert layers.main(["--out", str(tmp_path)]) == 0
    assert layers.main(["--out", str(tmp_path), "--no-optimize"]) == 0
    assert asked == [True, False]


def test_the_build_machines_start_list_stays_out_of_the_function(
    tmp_path: Path, wheelhouse: tuple[Path, Path], tiny_optimized: Path
) -> None:
    """handler/runtime/startfiles.json names this checkout's pages: a Lambda's would be other files."""
    wheels, requirements = wheelhouse
    code = tmp_path / "handler"
    shutil.copytree(layers.ROOT / "handler", code, ignore=shutil.ignore_patterns("__pycache__"))
    (code / "runtime" / "startfiles.json").write_text("{}")
    layers.build(tmp_path / "out", tiny_optimized, requirements, wheels, code=code)
    names = zipfile.ZipFile(tmp_path / "out" / "function.zip").namelist()
    assert "handler/runtime/startfiles.py" in names and "handler/runtime/startfiles.json" not in names


# Starts handler.app from an extracted function.zip and prints its init report's code bundle line.
START = (
    "import json, sys, handler.app\n"
    "print(json.dumps({'bundle': handler.app.runtime.init_report['coldstart']['code_bundle'],"
    " 'file': handler.app.__file__,"
    " 'frames': sys.modules['handler.core.manifest'].open_regular.__code__.co_filename}))"
)


def test_the_function_carries_its_code_bundle_and_an_extracted_copy_uses_it(
    tmp_path: Path, wheelhouse: tuple[Path, Path], tiny_optimized: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A zip keeps mtimes to 2 s (here: the fixed date) and an extraction may not keep them at all: the bundle's
    entries are then used after their source's hash matches, and a source edited after the build never is."""
    import calendar
    import os
    import subprocess
    import sys

    monkeypatch.setattr(layers, "PYTHON_VERSION", f"{sys.version_info.major}.{sys.version_info.minor}")  # this one's
    wheels, requirements = wheelhouse
    first = layers.build(tmp_path / "a", tiny_optimized, requirements, wheels)
    second = layers.build(tmp_path / "b", tiny_optimized, requirements, wheels)
    assert first[0].sha256 == second[0].sha256  # still reproducible, the bundle in it
    task = tmp_path / "task"
    with zipfile.ZipFile(tmp_path / "a" / "function.zip") as zf:
        assert "handler/runtime/codebundle.bin" in zf.namelist()
        zf.extractall(task)  # zipfile sets no mtimes: each file has the extraction's time

    def start() -> dict[str, Any]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("WARMSTART_", "AWS_", "PYTHON"))}
        env = {**base, "PYTHONPATH": str(task), "WARMSTART_MODEL": str(tiny_optimized), "WARMSTART_PREFETCH": "off"}
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # as Lambda's read-only task root: no .pyc beside the sources
        proc = subprocess.run([sys.executable, "-c", START], cwd=task, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        seen: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        assert seen["file"] == str(task / "handler" / "app.py")  # the extracted copy, not this checkout
        # compiled as /var/task's: a frame names the file it runs from (as a moved .pyc's does)
        assert seen["frames"] == str(task / "handler" / "core" / "manifest.py")
        return seen["bundle"]

    bundle = start()
    assert bundle["modules"] > 20 and bundle["stale"] == [] and bundle["hashed"] == bundle["modules"]
    # An extraction that keeps the zip's dates (UTC): the one-stat check, no source read.
    epoch = calendar.timegm((*layers.FIXED_DATE, 0, 0, 0))
    for path in task.rglob("*.py"):
        os.utime(path, (epoch, epoch))
    assert start() == {**bundle, "hashed": 0}
    # A module edited after the build (same size, as a one-character fix would be): imported from its source.
    errors = task / "handler" / "core" / "errors.py"
    errors.write_text(errors.read_text().replace("Typed errors.", "Typed errorz."))
    assert start()["stale"] == ["handler.core.errors"]


def test_a_bundle_that_cannot_be_made_leaves_the_build_going(
    tmp_path: Path,
    wheelhouse: tuple[Path, Path],
    tiny_optimized: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import sys

    from handler.runtime import codebundle

    def fails(model: str | None = None) -> list[str]:
        raise RuntimeError("the start that lists the modules failed:\nImportError: no numpy here")

    monkeypatch.setattr(layers, "PYTHON_VERSION", f"{sys.version_info.major}.{sys.version_info.minor}")
    monkeypatch.setattr(codebundle, "modules_of_init", fails)
    wheels, requirements = wheelhouse
    layers.build(tmp_path, tiny_optimized, requirements, wheels)
    assert "code bundle: skipped, the start that lists its modules failed" in capsys.readouterr().out
    assert "handler/runtime/codebundle.bin" not in zipfile.ZipFile(tmp_path / "function.zip").namelist()
