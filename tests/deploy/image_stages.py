"""A Dockerfile's stages run as a builder would run them, without a Docker engine (CI has none).

What is real: the Dockerfile, parsed by `dockerfile-parse`; the build context, the repository's files less what
`.dockerignore` excludes, matched by docker's own Python SDK (`docker.utils.build.PatternMatcher`, the port of
moby's matcher that `docker-py` builds with); each stage's `ARG`, `ENV` and `WORKDIR`; its `COPY` lines, from
the context or (`--from=`) another stage's files, with Docker's rules for directories and destinations; its
`RUN` lines, executed as written by `/bin/sh -c` in a fresh environment: no variable of the calling process,
no site-packages or editable install of ours, only the files the stage's COPY lines brought.

What is emulated, the base image: each stage gets its own file system root, a directory `rootfs/` under a
temporary directory, and every absolute path the stage names maps into it (`/models/default` ->
`rootfs/models/default`, `${LAMBDA_TASK_ROOT}` -> `rootfs/var/task`, in RUN lines, ENV values, COPY and
WORKDIR). The base image's Python is a fresh `python -m venv` at the prefix the image keeps it (`/var/lang` in
the Lambda image, `/usr/local` in `python:*`), so `python3` and `pip` on the image's PATH are that venv's; the
base image's ENV (`LAMBDA_TASK_ROOT`, `LAMBDA_RUNTIME_DIR`, PATH, LANG) and WORKDIR are set as the image sets
them. Nothing else of the base image is: the Lambda image's `/var/runtime` (its bootstrap, and its own
awslambdaric and boto3, which only the image's bootstrap puts on sys.path, never `python3 -m handler`), the
Runtime Interface Emulator, its system libraries (the host's are used). Base images this module does not know
(the CUDA one) are refused with `Unemulated`. The interpreter is Python 3.12, the images' minor, where this
machine has one (`stage_python`), else this one's, which `StageRun.python_version` records.

`pip install` in a RUN line installs, as written, from a local wheel directory filled beforehand by `pip
download` with the same arguments (`PIP_NO_INDEX`, `PIP_FIND_LINKS`): a builder behind a package mirror. The
directory (`build/image-stages/wheels`) is kept between runs, so only the first run on a machine downloads.
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from docker.utils.build import PatternMatcher
from dockerfile_parse import DockerfileParser
from dockerfile_parse.util import WordSplitter, extract_key_values

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / "build" / "image-stages" / "wheels"
HOST_TOOLS = "/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"  # sh, rm, ... (after the image's own PATH)
RUN_TIMEOUT_S = 900
# Two Dockerfiles build at once (tests/deploy/test_image_stages.py): their `pip download`s share the wheel directory,
# one at a time, and a download that failed (no wheel for the images' Python here) is not tried again this session.
_FETCH_LOCK = threading.Lock()
_FETCH_FAILED: dict[str, str] = {}


class Unemulated(Exception):
    """A base image or an instruction this emulation does not cover."""


class BuildError(Exception):
    """A stage failed as the build would: a missing COPY source, a RUN line that exits non-zero."""


@dataclass(frozen=True)
class Base:
    """What an emulated base image brings: where its Python lives, its ENV and WORKDIR."""

    python_prefix: str
    env: Mapping[str, str]
    workdir: str


BASES: dict[str, Base] = {
    # public.ecr.aws/lambda/python:3.12 (its image config): Python under /var/lang, the task root /var/task.
    "public.ecr.aws/lambda/python:3.12": Base(
        "/var/lang",
        {
            "LANG": "en_US.UTF-8",
            "PATH": "/var/lang/bin:/usr/local/bin:/usr/bin/:/bin:/opt/bin",
            "LAMBDA_TASK_ROOT": "/var/task",
            "LAMBDA_RUNTIME_DIR": "/var/runtime",
        },
        "/var/task",
    ),
    # python:3.12-slim (Debian): Python under /usr/local.
    "python:3.12-slim": Base(
        "/usr/local",
        {"LANG": "C.UTF-8", "PATH": "/usr/local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
        "/",
    ),
}


@dataclass
class Stage:
    index: int
    name: str | None
    base: str  # the FROM image, global ARGs substituted
    instructions: list[tuple[str, str, int]]  # (INSTRUCTION, raw value, line number from 1), FROM first


@dataclass
class Dockerfile:
    path: Path
    global_args: dict[str, str]
    preamble: list[tuple[str, str, int]]  # the ARG lines before the first FROM
    stages: list[Stage]

    @classmethod
    def parse(cls, path: Path) -> Dockerfile:
        with path.open("rb") as f:
            structure = DockerfileParser(fileobj=f, env_replace=False).structure
        global_args: dict[str, str] = {}
        preamble: list[tuple[str, str, int]] = []
        stages: list[Stage] = []
        for item in structure:
            word, value, line = item["instruction"], item["value"], item["startline"] + 1
            if word == "COMMENT":
                continue
            if word == "FROM":
                image, *alias = WordSplitter(value, args=global_args).dequote().split()
                name = alias[1] if len(alias) == 2 and alias[0].lower() == "as" else None
                stages.append(Stage(len(stages), name, image, [(word, value, line)]))
            elif not stages:
                if word != "ARG":
                    raise BuildError(f"{path.name}:{line}: {word} before the first FROM")
                global_args.update(extract_key_values(True, global_args, {}, value))
                preamble.append((word, value, line))
            else:
                stages[-1].instructions.append((word, value, line))
        return cls(path, global_args, preamble, stages)

    def stage(self, ref: str) -> Stage:
        for stage in self.stages:
            if stage.name == ref or str(stage.index) == ref:
                return stage
        raise BuildError(f"{self.path.name}: no stage {ref!r}")

    def instructions(self) -> list[tuple[str, str, int]]:
        """Every instruction in order, as written (continuation lines joined by the parser)."""
        return [*self.preamble, *(i for stage in self.stages for i in stage.instructions)]


def dockerignore_patterns(context: Path) -> list[str]:
    """The file's rules as the docker SDK reads them: stripped lines, blanks and `#` comments dropped."""
    path = context / ".dockerignore"
    lines = path.read_text().splitlines() if path.is_file() else []
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def build_context(context: Path = ROOT) -> set[str]:
    """The regular files (POSIX paths relative to `context`) a builder sends: all but what .dockerignore drops."""
    matcher = PatternMatcher(dockerignore_patterns(context))
    return {p for p in matcher.walk(str(context)) if (context / p).is_file() and not (context / p).is_symlink()}


_ABSOLUTE = re.compile(r"""(?:(?<=[\s"'=:(])|^)/(?=[\w.])""", re.MULTILINE)


def stage_python() -> str:
    """A Python of the images' minor (3.12) on this machine, else this interpreter (recorded by each run)."""
    wanted = os.environ.get("WARMSTART_STAGE_PYTHON")
    candidates = [wanted] if wanted else []
    candidates += [shutil.which("python3.12") or ""]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")), reverse=True)
    candidates += ["/usr/bin/python3.12", "/usr/local/bin/python3.12"]
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-c", "import ensurepip, venv, ssl, sys; print(sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip() == "(3, 12)":
            return candidate
    return getattr(sys, "_base_executable", sys.executable)


@dataclass
class StageRun:
    """One stage's result: its file system root and the image config it leaves (ENV, WORKDIR, ENTRYPOINT)."""

    dockerfile: Path
    stage: Stage
    rootfs: Path
    env: dict[str, str]
    workdir: str
    python_version: str
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)  # one line per instruction: what ran, how long
    executed: bool = True  # False: a base image not emulated, RUN lines checked and not run

    def host(self, path: str) -> Path:
        """An absolute path of the image, in this emulation."""
        return self.rootfs / path.lstrip("/")

    def host_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The stage's environment for a process on this machine: image paths mapped, nothing inherited."""
        env = {k: map_paths(v, self.rootfs) for k, v in self.env.items()}
        env["PATH"] = f"{env.get('PATH', '')}:{HOST_TOOLS}".lstrip(":")
        env.setdefault("HOME", str(self.host("/root")))
        env["PYTHONNOUSERSITE"] = "1"  # the image runs as root: no user site-packages there either
        env.update(extra or {})
        return env

    def run(
        self, argv: list[str], env: Mapping[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """A command in the built stage (cwd its WORKDIR, env its ENV): `python3 -c ...` sees what the image has."""
        full_env = self.host_env(env)
        exe = str(self.host(argv[0])) if argv[0].startswith("/") else shutil.which(argv[0], path=full_env["PATH"])
        if exe is None:
            raise BuildError(f"{argv[0]}: not on the image's PATH")
        return subprocess.run(
            [exe, *argv[1:]],
            cwd=self.host(self.workdir),
            env=full_env,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )

    def entrypoint_argv(self, *args: str) -> list[str]:
        """ENTRYPOINT + (args or CMD), its executable resolved on the image's PATH."""
        argv = [*self.entrypoint, *(args or self.cmd)]
        env = self.host_env()
        exe = str(self.host(argv[0])) if argv[0].startswith("/") else shutil.which(argv[0], path=env["PATH"])
        if exe is None:
            raise BuildError(f"ENTRYPOINT {argv[0]}: not on the image's PATH")
        return [exe, *argv[1:]]


def map_paths(text: str, rootfs: Path) -> str:
    """Absolute paths in a shell line or an ENV value, into the stage's root (`/tmp/x` -> `rootfs/tmp/x`)."""
    return _ABSOLUTE.sub(str(rootfs).rstrip("/") + "/", text)


def _copy_tree_or_file(src: Path, dest: Path, dest_is_dir: bool, allowed: set[Path] | None) -> list[Path]:
    """Docker's COPY for one source: a directory's contents into `dest`; a file to `dest` (or into it when it
    is a directory). `allowed`: the context's files (a directory brings only those); None: every file."""
    copied = []
    if src.is_dir():
        files = sorted(p for p in src.rglob("*") if p.is_file() and (allowed is None or p in allowed))
        for f in files:
            target = dest / f.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target)
            copied.append(target)
        dest.mkdir(parents=True, exist_ok=True)
        return copied
    target = dest / src.name if dest_is_dir or dest.is_dir() else dest
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, target)
    return [target]


class Builder:
    """Builds the stages of one Dockerfile under `tmp`, each in its own root (`tmp/<stage>/rootfs`)."""

    def __init__(self, dockerfile: Path, tmp: Path, context: Path = ROOT, python: str | None = None) -> None:
        self.file = Dockerfile.parse(dockerfile)
        self.tmp = tmp
        self.context = context
        self.context_files = {context / p for p in build_context(context)}
        self.python = python or stage_python()
        self.runs: dict[int, StageRun] = {}

    def build(self, target: str | None = None, closure_only: bool = False) -> StageRun:
        """Every stage up to `target` (default: the last), each built once (COPY --from builds its source).
        `closure_only`: a stage on a base image not emulated here still gets its ENV, WORKDIR and COPY lines,
        and its RUN lines are checked, not run: each file they name with `-r`/`-c` was copied in before."""
        stage = self.file.stage(target) if target else self.file.stages[-1]
        for earlier in self.file.stages[: stage.index]:  # in order, as a builder would (the log reads in order)
            self._build(earlier, closure_only)
        return self._build(stage, closure_only)

    def _build(self, stage: Stage, closure_only: bool = False) -> StageRun:
        if stage.index in self.runs:
            return self.runs[stage.index]
        try:
            return self._build_with(stage, closure_only, self.python)
        except BuildError as e:
            # A wheel for the images' Python that this machine cannot fetch (torch's CPU build for 3.12 comes only
            # from the PyTorch index): the stage is built again with this machine's Python, whose wheels its pip
            # configuration does reach, and the log says so. The stage's files do not depend on the minor version.
            machine = getattr(sys, "_base_executable", sys.executable)
            if "pip download" not in str(e) or os.path.realpath(machine) == os.path.realpath(self.python):
                raise
            run = self._build_with(stage, closure_only, machine)
            why = str(e).splitlines()[0][:120]
            run.log.insert(1, f"  (Python {run.python_version}: the images' Python could not fetch `{why}` here)")
            return run

    def _build_with(self, stage: Stage, closure_only: bool, python: str) -> StageRun:
        parent = next((s for s in self.file.stages[: stage.index] if s.name and s.name == stage.base), None)
        if parent is not None:
            return self._build_on(stage, self._build(parent, closure_only))
        base = BASES.get(stage.base)
        if base is None and not closure_only:
            raise Unemulated(f"{self.file.path.name}: stage {stage.name or stage.index}: base image {stage.base}")
        rootfs = self.tmp / f"{self.file.path.name}-{stage.name or stage.index}" / "rootfs"
        if rootfs.exists():
            shutil.rmtree(rootfs)
        (rootfs / "tmp").mkdir(parents=True)
        (rootfs / "root").mkdir()
        started = time.perf_counter()
        if base is None:
            run = StageRun(self.file.path, stage, rootfs, {"PATH": "/usr/local/bin:/usr/bin:/bin"}, "/", "")
            run.log.append(f"FROM {stage.base}: not emulated, COPY lines only, RUN lines checked, not run")
        else:
            prefix = rootfs / base.python_prefix.lstrip("/")
            prefix.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([python, "-m", "venv", str(prefix)], check=True, capture_output=True, env=_bare_env())
            version = subprocess.run(
                [str(prefix / "bin" / "python"), "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                capture_output=True,
                text=True,
                check=True,
                env=_bare_env(),
            ).stdout.strip()
            run = StageRun(self.file.path, stage, rootfs, dict(base.env), base.workdir, version)
            run.log.append(f"FROM {stage.base}: Python {version} venv at {base.python_prefix} ({_since(started)})")
        run.executed = base is not None
        return self._instructions(stage, run)

    def _build_on(self, stage: Stage, parent: StageRun) -> StageRun:
        """`FROM <an earlier stage>`: that stage's files and image config, then this stage's instructions."""
        started = time.perf_counter()
        rootfs = self.tmp / f"{self.file.path.name}-{stage.name or stage.index}" / "rootfs"
        if rootfs.exists():
            shutil.rmtree(rootfs)
        shutil.copytree(parent.rootfs, rootfs, symlinks=True)
        run = StageRun(
            self.file.path, stage, rootfs, dict(parent.env), parent.workdir, parent.python_version,
            list(parent.entrypoint), list(parent.cmd), executed=parent.executed,
        )  # fmt: skip
        run.log.append(f"FROM {stage.base}: that stage's files and config ({_since(started)})")
        return self._instructions(stage, run)

    def _instructions(self, stage: Stage, run: StageRun) -> StageRun:
        run.host(run.workdir).mkdir(parents=True, exist_ok=True)
        args: dict[str, str] = {}
        for word, value, line in stage.instructions:
            started = time.perf_counter()
            where = f"{self.file.path.name}:{line}"
            if word == "ARG":
                for key, default in extract_key_values(True, {**self.file.global_args, **args}, run.env, value):
                    args[key] = default or self.file.global_args.get(key, "")
            elif word == "ENV":
                run.env.update(extract_key_values(True, args, run.env, value))
            elif word == "WORKDIR":
                path = WordSplitter(value, args=args, envs=run.env).dequote()
                run.workdir = os.path.normpath(os.path.join(run.workdir, path))
                run.host(run.workdir).mkdir(parents=True, exist_ok=True)
            elif word == "COPY":
                self._copy(run, value, args, where)
            elif word == "RUN" and run.executed:
                self._run(run, value, args, where)
            elif word == "RUN":
                self._check_run(run, value, where)
            elif word == "ENTRYPOINT":
                run.entrypoint = _exec_form(value, where)
                run.cmd = []  # Docker: a new ENTRYPOINT resets an inherited CMD
            elif word == "CMD":
                run.cmd = _exec_form(value, where)
            elif word in ("FROM", "EXPOSE", "LABEL"):
                pass
            else:
                raise Unemulated(f"{where}: {word}")
            if word in ("COPY", "RUN"):
                took = _since(started) if run.executed or word == "COPY" else "checked, not run"
                run.log.append(f"{word} {' '.join(value.split())[:100]} ({took})")
        self.runs[stage.index] = run
        return run

    def _copy(self, run: StageRun, value: str, args: dict[str, str], where: str) -> None:
        words = list(WordSplitter(value, args=args, envs=run.env).split(dequote=True))
        flags = [w for w in words if w.startswith("--")]
        *sources, dest = [w for w in words if not w.startswith("--")]
        source_stage = next((f.split("=", 1)[1] for f in flags if f.startswith("--from=")), None)
        if set(f.split("=", 1)[0] for f in flags) - {"--from", "--chown", "--chmod", "--link"}:
            raise Unemulated(f"{where}: COPY {flags}")
        if not sources:
            raise BuildError(f"{where}: COPY without a source")
        dest_path = dest if dest.startswith("/") else os.path.join(run.workdir, dest)
        dest_host = run.host(dest_path)
        dest_is_dir = dest.endswith("/") or len(sources) > 1
        for source in sources:
            if any(c in source for c in "*?["):
                raise Unemulated(f"{where}: COPY {source}: wildcards")
            if source_stage is not None:
                src = self._build(self.file.stage(source_stage)).host(source)
                allowed = None
            else:
                src = (self.context / source).resolve()
                allowed = self.context_files
                if not src.is_relative_to(self.context):
                    raise BuildError(f"{where}: COPY {source}: outside the build context")
                in_context = src in allowed or (src.is_dir() and any(p.is_relative_to(src) for p in allowed))
                if not in_context:
                    raise BuildError(f"{where}: COPY {source}: not found in the build context (.dockerignore?)")
            if not src.exists():
                in_stage = f" in stage {source_stage}" if source_stage else ""
                raise BuildError(f"{where}: COPY {source}: not found{in_stage}")
            _copy_tree_or_file(src, dest_host, dest_is_dir, allowed)

    def _check_run(self, run: StageRun, value: str, where: str) -> None:
        """A RUN line not run: the files it reads with `-r`/`-c` (requirements, constraints) are in the stage."""
        words = shlex.split(map_paths(value, run.rootfs))
        for flag, path in itertools.pairwise(words):
            if flag in ("-r", "--requirement", "-c", "--constraint") and not Path(path).is_file():
                raise BuildError(f"{where}: RUN reads {path.replace(str(run.rootfs), '')}, which no COPY brought")

    def _run(self, run: StageRun, value: str, args: dict[str, str], where: str) -> None:
        command = " ".join(_exec_form(value, where)) if value.lstrip().startswith("[") else value
        shell_line = map_paths(command, run.rootfs)
        env = run.host_env(
            {
                **args,
                # pip as written, from the local wheel directory instead of the index; no config of this machine.
                "PIP_CONFIG_FILE": os.devnull,
                "PIP_NO_INDEX": "1",
                "PIP_FIND_LINKS": str(WHEELS),
                "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                "PIP_NO_INPUT": "1",
            }
        )
        for download in pip_downloads(shell_line):
            fetch_wheels(run, download, env)
        done = subprocess.run(
            ["/bin/sh", "-c", shell_line],
            cwd=run.host(run.workdir),
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=RUN_TIMEOUT_S,
        )
        if done.returncode != 0:
            raise BuildError(
                f"{where}: RUN {command}\nexit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
            )


def _exec_form(value: str, where: str) -> list[str]:
    try:
        argv = json.loads(value)
    except json.JSONDecodeError as e:
        raise Unemulated(f"{where}: only the exec (JSON) form is emulated here: {value}") from e
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
        raise BuildError(f"{where}: not a JSON list of strings: {value}")
    return argv


_PIP_DROP = {"--no-cache-dir", "--no-compile", "--upgrade", "-U", "--force-reinstall", "--no-warn-script-location"}
_PIP_DROP_WITH_VALUE = {"--target", "-t", "--prefix", "--root"}


def pip_downloads(shell_line: str) -> Iterator[list[str]]:
    """For each `pip install` in a shell line, the `pip download` arguments that fetch what it installs."""
    words = shlex.split(shell_line)
    commands: list[list[str]] = [[]]
    for word in words:
        if word in ("&&", "||", ";", "|"):
            commands.append([])
        else:
            commands[-1].append(word)
    for argv in commands:
        rest: list[str] | None = None
        if len(argv) > 1 and os.path.basename(argv[0]) in ("pip", "pip3") and argv[1] == "install":
            rest = argv[2:]
        elif len(argv) > 3 and os.path.basename(argv[0]).startswith("python") and argv[1:4] == ["-m", "pip", "install"]:
            rest = argv[4:]
        if rest is None:
            continue
        keep: list[str] = []
        skip = False
        for word in rest:
            if skip:
                skip = False
            elif word in _PIP_DROP_WITH_VALUE:
                skip = True
            elif word in _PIP_DROP or word.split("=", 1)[0] in _PIP_DROP_WITH_VALUE:
                continue
            else:
                keep.append(word)
        yield keep


def fetch_wheels(run: StageRun, download: list[str], stage_env: Mapping[str, str]) -> None:
    """`pip download` into the wheel directory, once per (arguments, requirement files' text, Python): the
    stage's own pip (its platform and Python tags), this machine's pip configuration (how it reaches the index)."""
    key = hashlib.sha256(run.python_version.rsplit(".", 1)[0].encode())
    for word in download:
        key.update(word.replace(str(run.rootfs), "").encode())  # the image's path: the same in every run
        if Path(word).is_file():
            key.update(Path(word).read_bytes())
    with _FETCH_LOCK:
        _fetch_once(run, download, stage_env, key.hexdigest())


def _fetch_once(run: StageRun, download: list[str], stage_env: Mapping[str, str], key: str) -> None:
    if key in _FETCH_FAILED:
        raise BuildError(_FETCH_FAILED[key])
    marker = WHEELS / ".fetched" / key
    if marker.is_file():
        return
    WHEELS.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    python = shutil.which("python3", path=stage_env["PATH"])
    assert python is not None
    done = subprocess.run(
        [python, "-m", "pip", "download", "-q", "--no-input", "-d", str(WHEELS), *download],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=RUN_TIMEOUT_S,
    )
    if done.returncode != 0:
        _FETCH_FAILED[key] = f"pip download {' '.join(download)}\n{done.stderr[-3000:]}"
        raise BuildError(_FETCH_FAILED[key])
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(" ".join(download) + "\n")


def _bare_env() -> dict[str, str]:
    return {"PATH": HOST_TOOLS, "LANG": "C.UTF-8"}


def _since(started: float) -> str:
    return f"{time.perf_counter() - started:.1f} s"
