"""The `warmstart` command. Each subcommand lives in its own module, imported only when that command runs."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NamedTuple

from handler.core.version import VERSION


class Command(NamedTuple):
    module: str  # exposes `register(subparsers)`; each parser it registers sets `func(args) -> int`
    help: str  # what `warmstart --help` lists; the module's own parser says the same (tests/unit/test_cli.py)


# Registered without importing their modules: a run imports only its own command's module, so `warmstart pack`
# (the image's pack stage, which copies handler/ and infra/ only) never imports `warmers` or uvicorn, and
# `warmstart local` never onnx.
COMMANDS: dict[str, Command] = {
    "pack": Command("infra.cli.pack", "pack a model into warmstart's format (manifest + mmap-friendly weights)"),
    "optimize": Command("infra.cli.optimize", "pre-optimize a packed ONNX model (prepacked weights) for this machine"),
    "local": Command("infra.cli.local", "run the local Lambda (Runtime API + Invoke API, many instances)"),
    "invoke": Command("infra.cli.local", "send one event to a running local Lambda and show the REPORT line"),
    "warm": Command("infra.cli.warm", "keep-warm pings: N parallel, held, verified by distinct instance ids"),
    "demo": Command("infra.cli.demo", "cold start then warm calls of the default model through the local Lambda"),
    "tune": Command("infra.cli.tune", "pick a memory size: cold/warm latency under each size's CPU quota, and cost"),
}
DESCRIPTION = (
    "Serve ML models from AWS Lambda, SageMaker, Cloud Run or Knative with cold starts at the floor of the stack: "
    "pack a model, run it on a local Lambda, invoke it, keep it warm, pick its memory size."
)
EPILOG = "`warmstart COMMAND --help` for a command's options. Docs: README.md and docs/ in the repository."
COMMAND_MODULES = tuple(dict.fromkeys(c.module for c in COMMANDS.values()))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, every command module imported, when `command` is None; otherwise only `command`'s
    module is imported (none for "" or an unknown name) and the other commands are listed by name and help."""
    parser = argparse.ArgumentParser(prog="warmstart", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"warmstart {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = COMMAND_MODULES if command is None else [COMMANDS[command].module] if command in COMMANDS else []
    for name, (module, help_) in COMMANDS.items():
        if name in sub.choices:
            continue  # registered with a sibling (local and invoke share a module)
        if module in wanted:
            importlib.import_module(module).register(sub)
        else:
            sub.add_parser(name, help=help_, add_help=False)
    return parser


def command_in(argv: Sequence[str]) -> str:
    """The subcommand an argument list names: the first argument not an option ("" when there is none)."""
    return next((arg for arg in argv if not arg.startswith("-")), "")


# Commands people try that are another program's: what to run instead (not argparse's "invalid choice").
ELSEWHERE = {
    "serve": "the HTTP host is `python -m handler` (`python -m handler serve` for SageMaker's command): "
    "WARMSTART_MODEL=DIR PORT=8080 python -m handler; `warmstart local` runs the local Lambda",
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if command_in(argv) in ELSEWHERE:
        print(f"warmstart {command_in(argv)}: not a warmstart command; {ELSEWHERE[command_in(argv)]}", file=sys.stderr)
        return 2
    try:
        args = build_parser(command_in(argv)).parse_args(argv)
        rc: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`warmstart invoke ... | head`): not our error, and no traceback. Point stdout at
        # devnull so the interpreter's flush at exit does not raise again (Python's documented recipe).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return rc
