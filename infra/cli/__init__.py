"""The `warmstart` command. Each subcommand lives in its own module and registers itself here."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence

# module -> it exposes `register(subparsers)`; each registered parser sets `func(args) -> int`.
# Imported lazily per run so `warmstart pack` never pays for uvicorn and `warmstart local` never for onnx.
COMMAND_MODULES = (
    "infra.cli.pack",
    "infra.cli.optimize",
    "infra.cli.local",
    "infra.cli.warm",
    "infra.cli.demo",
    "infra.cli.tune",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="warmstart", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rc: int = args.func(args)
    return rc
