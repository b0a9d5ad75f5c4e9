"""The `warmstart` command registers its subcommands without importing them: a run imports its own command's
module only (the images' pack stage has handler/ and infra/, no `warmers`), and `--help` still lists them all."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.cli import COMMANDS, build_parser, command_in
from tests.conftest import ROOT

PROBE = """
import json, sys
from infra.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {"warmers", "infra", "uvicorn", "starlette",
      "boto3", "onnx", "torch"})))
"""


def run_cli(*argv: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}  # one line per command in --help
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    return done, set(json.loads(done.stdout.strip().splitlines()[-1]))


def subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action


def subcommands(parser: argparse.ArgumentParser) -> dict[str, str | None]:
    return {choice.dest: choice.help for choice in subparsers(parser)._choices_actions}


@pytest.mark.parametrize("command", ["pack", "optimize"])
def test_pack_and_optimize_never_import_the_warmer_or_the_http_host(command: str) -> None:
    done, modules = run_cli(command, "--help")
    assert done.returncode == 0, done.stderr
    assert f"usage: warmstart {command}" in done.stdout
    assert not {m for m in modules if m.split(".")[0] in {"warmers", "uvicorn", "starlette", "boto3", "torch"}}
    assert {m for m in modules if m.startswith("infra.cli.")} == {COMMANDS[command].module}


def test_help_lists_every_command_without_importing_any() -> None:
    done, modules = run_cli("--help")
    assert done.returncode == 0, done.stderr
    for name, command in COMMANDS.items():
        assert name in done.stdout and command.help in done.stdout
    assert not {m for m in modules if m.startswith("infra.cli.")}


def test_listed_help_is_each_modules_own() -> None:
    """The table `--help` reads from says what each module's parser says (every module imported here)."""
    assert subcommands(build_parser()) == {name: c.help for name, c in COMMANDS.items()}
    for name in COMMANDS:
        lazy = build_parser(name)
        assert subcommands(lazy) == {n: c.help for n, c in COMMANDS.items()}  # same order and words
        real = {n for n, p in subparsers(lazy).choices.items() if p._actions}  # listed-only ones have no options
        assert real == {n for n, c in COMMANDS.items() if c.module == COMMANDS[name].module}


def test_unknown_command_is_refused_with_the_list() -> None:
    done, modules = run_cli("nope")
    assert "invalid choice: 'nope'" in done.stderr and "pack" in done.stderr
    assert not {m for m in modules if m.startswith("infra.cli.")}


def test_command_in() -> None:
    assert command_in(["--help"]) == ""
    assert command_in(["pack", "--default"]) == "pack"
    assert command_in(["-h", "tune"]) == "tune"


def test_pack_records_the_checkers_tolerance() -> None:
    """infra.pack.golden writes the tolerance the PreTraffic checker (warmers.golden) defaults to, without
    importing it."""
    from infra.pack import golden as recorded
    from warmers import golden as checker

    assert recorded.TOLERANCE == checker.TOLERANCE


def test_version_and_a_help_that_speaks_to_users() -> None:
    import tomllib

    out = subprocess.run([sys.executable, "-m", "infra.cli", "--version"], capture_output=True, text=True, check=True)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert out.stdout.strip() == f"warmstart {version}"
    text = subprocess.run(
        [sys.executable, "-m", "infra.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "Lambda" in text and "--version" in text
    assert "module" not in text.lower()  # once opened with "Each subcommand lives in its own module ..."


def test_a_reader_that_went_away_is_not_a_traceback(tmp_path: Path) -> None:
    # `warmstart invoke ... | head`: the pipe's reader is gone when the command prints its answer. (argparse's own
    # --help and --version output already swallow the error; a command's print() did not.)
    read, write = os.pipe()
    os.close(read)
    argv = ["pack", "--default", "--backends", "onnx", "--out", str(tmp_path / "m")]
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "infra.cli", *argv], stdout=write, stderr=subprocess.PIPE, text=True, timeout=300
        )
    finally:
        os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0
    assert (tmp_path / "m" / "manifest.json").is_file()  # the work was done; only its report had no reader


def test_local_backend_names_come_from_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    # Was a `choices=("onnx", "torch")` of its own: a plugin's backend could not be named here.
    from infra.cli import local

    parser = argparse.ArgumentParser()
    local.register(parser.add_subparsers())
    assert parser.parse_args(["local", "--backend", "torch"]).backend == "torch"
    with pytest.raises(SystemExit):
        parser.parse_args(["local", "--backend", "tensorrt"])
    assert "unknown backend 'tensorrt'; valid backends: onnx, torch" in capsys.readouterr().err
