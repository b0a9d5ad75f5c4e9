"""A backend from outside: tests/fixtures/toy_plugin, a package with `warmstart.backends` entry points,
pip-installed into a directory of its own (never into the project's environment) and put on the path. Nothing in
handler/ names it; it serves through a Lambda event on the local Lambda (real awslambdaric instances), the HTTP host
(`python -m handler`) and `/openapi.json`, and its own setting reaches it from the environment. Its task
(`warmstart.tasks`): tests/integration/test_plugin_task.py."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the fixtures live under tests/, which is not an installed package
    sys.path.insert(0, str(ROOT))

from handler.api.compat import NATIVE  # noqa: E402
from handler.core.manifest import FORMAT, FORMAT_VERSION  # noqa: E402
from tests.fixtures.drain_scenario import free_port  # noqa: E402
from tests.fixtures.local_support import invoke, running  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
PLUGIN = ROOT / "tests" / "fixtures" / "toy_plugin"
REAL = "handler.app.lambda_handler"
X = [[0.5, -1.0, 2.0, 0.25], [1.0, 0.0, -0.5, 3.0]]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin installed as pip installs any package (its entry points in its .dist-info), offline: no index,
    no build isolation (the project's setuptools builds it), no dependencies (numpy is the project's)."""
    work = tmp_path_factory.mktemp("plugin")
    shutil.copytree(PLUGIN, work / "src")  # pip builds in the source tree: keep the repository's clean
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(work / "site"), str(work / "src")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert list((work / "site").glob("warmstart_toy-*.dist-info/entry_points.txt"))
    return work / "site"


def weights() -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    rng = np.random.default_rng(33)
    return rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)


@pytest.fixture(scope="module")
def toy_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A packed model for the `toy` backend and the built-in `tensor` task: a .npz and a manifest."""
    out = tmp_path_factory.mktemp("toy") / "model"
    out.mkdir()
    w, b = weights()
    np.savez(out / "toy.npz", w=w, b=b)
    data = (out / "toy.npz").read_bytes()
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "id": "toy",
        "version": "1",
        "task": "tensor",
        "default_backend": "toy",
        "backends": {"toy": {"weights": "toy.npz", "files": ["toy.npz"]}},
        "inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 4]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": ["batch", 3]}],
        "files": {"toy.npz": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}},
    }
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def expected(activation: str) -> npt.NDArray[np.float32]:
    w, b = weights()
    y = np.asarray(X, np.float32) @ w + b
    return np.tanh(y) if activation == "tanh" else np.maximum(y, 0)


def env_for(site: Path, model: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WARMSTART_", "AWS_LAMBDA_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(site)]), WARMSTART_MODEL=str(model), **extra)
    return env


def test_a_plugin_backend_serves_a_lambda_event(site: Path, toy_model: Path) -> None:
    environment = {"WARMSTART_MODEL": str(toy_model), "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}
    with running(handler=REAL, environment=environment) as (_, client):
        result, body, _ = invoke(client, {"inputs": {"x": X}})
        assert "FunctionError" not in result, body
        assert body["model"] == "toy@1"
        np.testing.assert_allclose(body["outputs"]["y"], expected("tanh"), rtol=1e-6)
        _, status, _ = invoke(client, {"warmstart": "status"})
        assert [(m["backend"], m["task"]) for m in status["models"]["loaded"]] == [("toy", "tensor")]
        result, error, _ = invoke(client, {"inputs": {"x": [[1.0, 2.0]]}})  # the task checks shapes, not the plugin
        assert result["FunctionError"] == "Unhandled" and error["errorType"] == "InvalidInputError", error


@contextmanager
def serving(env: dict[str, str], log_path: Path) -> Iterator[int]:
    """A real `python -m handler` on a free port, once it answers /ping; stopped on leaving."""
    port = free_port()
    env = {**env, "PORT": str(port), "HOST": "127.0.0.1"}
    with log_path.open("w+") as log:
        proc = subprocess.Popen([sys.executable, "-m", "handler"], cwd=ROOT, env=env, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 120
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"python -m handler exited at startup: {log.read()[-3000:]}")
                try:
                    if get(port, "/ping")[0] == 200:
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, "python -m handler did not answer /ping"
                time.sleep(0.1)
            yield port
        finally:
            proc.terminate()
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def http_host(site: Path, toy_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """`python -m handler` with the plugin on its path and the plugin's own setting in its environment."""
    env = env_for(site, toy_model, WARMSTART_TOY_ACTIVATION="relu")
    with serving(env, tmp_path_factory.mktemp("host") / "host.log") as port:
        yield port


def get(port: int, path: str) -> tuple[int, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
        return r.status, json.loads(r.read())


def post(port: int, path: str, body: Any) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_plugin_backend_serves_the_http_host_with_its_own_setting(http_host: int) -> None:
    status, body = post(http_host, NATIVE.path, {"inputs": {"x": X}})
    assert status == 200, body
    np.testing.assert_allclose(body["outputs"]["y"], expected("relu"), rtol=1e-6)  # WARMSTART_TOY_ACTIVATION
    status, body = post(http_host, NATIVE.path, {"inputs": {"y": X}})
    assert status == 400 and body["error"]["type"] == "InvalidInputError"


def test_the_http_hosts_openapi_document_serves_with_a_plugin(http_host: int) -> None:
    status, document = get(http_host, "/openapi.json")
    assert status == 200 and NATIVE.path in document["paths"]
    # The plugin's task (`toy-scores`) in this document: tests/integration/test_plugin_task.py.


def test_a_bad_plugin_setting_fails_init_with_the_valid_values(site: Path, toy_model: Path) -> None:
    code = "import handler.app"
    env = env_for(site, toy_model, WARMSTART_TOY_ACTIVATION="gelu")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "WARMSTART_TOY_ACTIVATION='gelu'; valid values: tanh, relu, none" in proc.stderr


PROBE = """
import json, sys
from handler.backends import registry
try:
    registry.spec("nope")
except Exception as e:
    error = f"{type(e).__name__}: {e}"
from handler.runtime import prefetch
planned = [p.name for p, _ in prefetch.plan({"WARMSTART_MODEL": sys.argv[1]})]
print(json.dumps({"names": registry.names(), "error": error, "toy": registry.spec("toy").module, "plan": planned}))
"""


def test_an_unknown_name_lists_the_installed_plugins_and_the_prefetch_reads_a_plugin(
    site: Path, toy_model: Path
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(toy_model)],
        cwd=ROOT,
        env=env_for(site, toy_model),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["names"] == ["onnx", "torch", "genai", "vllm", "toy"] and got["toy"] == "warmstart_toy.backend"
    assert got["error"] == "ConfigError: unknown backend 'nope'; valid backends: onnx, torch, genai, vllm, toy"
    # The prefetch reads the plugin's spec too: the shim's libraries, then the model's file.
    assert got["plan"][-1] == "toy.npz" and any(n.startswith("_multiarray_umath") for n in got["plan"])
