"""The reference pages say what the code does: the error table lists every error type an answer can carry, and
configuration.md every environment variable the function's code reads (once lost in a rewrite: the bind
address). Both directions: nothing missing, nothing stale."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import handler
from handler.core.errors import RequestError, WarmstartError
from tests.conftest import ROOT

DOCS = ROOT / "docs"
# Variables read by code that is not the function's (the local Lambda, the warmer, the CLI) have their own pages.
ENV_RECEIVERS = {"env", "environ", "os.environ"}
ENV_CALLS = {"env_int", "env_bool"}
KEY = re.compile(r"[A-Z][A-Z0-9_]*_[A-Z0-9_]+|PORT|HOST")


def error_classes() -> set[str]:
    for info in pkgutil.walk_packages(handler.__path__, "handler."):
        if info.name not in ("handler.__main__", "handler.app"):  # app runs init on import
            importlib.import_module(info.name)
    found: set[str] = set()
    todo: list[type] = [WarmstartError]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__module__.startswith("handler.") and cls not in (WarmstartError, RequestError):
            found.add(cls.__name__)
    return found


def error_strings() -> set[str]:
    """Error types written as strings where an answer is built (a fault of ours, starlette's and h11's errors):
    every string argument of a call in handler/ that is a bare `...Error` name."""
    found: set[str] = set()
    for path in (ROOT / "handler").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                strings = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                found |= {s for s in strings if re.fullmatch(r"[A-Z]\w*Error", s)}
    return found


def table_names(page: Path, heading: str) -> set[str]:
    text = page.read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(\w+)` \|", section, re.M))


def test_the_error_table_lists_every_error_type_and_only_those() -> None:
    documented = table_names(DOCS / "events.md", "Errors")
    strings = error_strings()
    assert "InternalError" in strings  # the scanner sees what it must
    raised = error_classes() | strings
    assert sorted(raised - documented) == [], "error types missing from docs/events.md#errors"
    assert sorted(documented - raised) == [], "rows in docs/events.md#errors that no code raises"


def _receiver(node: ast.expr) -> str:
    return ast.unparse(node)


def env_keys(root: Path) -> dict[str, set[str]]:
    """Environment variables the code under `root` reads: `env.get("X")`, `environ["X"]`, `os.environ.get`,
    `env_int(env, "X", ...)`, `env_bool(env, "X", ...)`, `os.getenv("X")`."""
    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            key = None
            if isinstance(node, ast.Call):
                f = node.func
                args = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                if isinstance(f, ast.Attribute) and f.attr in ("get", "setdefault", "pop", "getenv"):
                    if _receiver(f.value) in ENV_RECEIVERS | {"os"} and args:
                        key = args[0]
                elif isinstance(f, ast.Name) and f.id in ENV_CALLS and args:
                    key = args[0]
            elif (
                isinstance(node, ast.Subscript)
                and _receiver(node.value) in ENV_RECEIVERS
                and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str)
            ):
                key = node.slice.value
            if key and KEY.fullmatch(key):
                found.setdefault(key, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_variable_the_function_reads_is_in_configuration_md() -> None:
    doc = (DOCS / "configuration.md").read_text()
    read = env_keys(ROOT / "handler")
    assert "HOST" in read and "WARMSTART_MODEL" in read  # the scanner sees what it must
    missing = {k: sorted(v) for k, v in read.items() if f"`{k}`" not in doc}
    assert missing == {}, "read by handler/ but not in docs/configuration.md"


def test_every_warmstart_variable_in_configuration_md_is_read_somewhere() -> None:
    documented = set(re.findall(r"^\| `(WARMSTART_\w+)`", (DOCS / "configuration.md").read_text(), re.M))
    source = "\n".join(p.read_text() for pkg in ("handler", "infra", "warmers") for p in (ROOT / pkg).rglob("*.py"))
    stale = sorted(k for k in documented if k not in source and not any(k.startswith(p) for p in _PREFIXES(source)))
    assert stale == [], "documented in configuration.md but read nowhere"


def _PREFIXES(source: str) -> set[str]:
    return set(re.findall(r'f"(WARMSTART_[A-Z_]+)\{', source))


def test_reference_pages_keep_no_history() -> None:
    # Readers cannot see our issues, and a table row about how it was "before" is history, not reference.
    found = []
    for page in sorted(DOCS.glob("*.md")):
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if re.search(r"\bthe issue\b|\bissue \d+\b", line, re.I) or re.match(r"\| before\b", line, re.I):
                found.append(f"{page.name}:{n}: {line.strip()[:100]}")
    assert found == []
