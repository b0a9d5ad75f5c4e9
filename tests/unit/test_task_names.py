"""A task is named in one place: its own module (its `TaskSpec`) and the catalog's table. Anywhere else in
handler/, a string that is a built-in task's name is a registry that wants to exist (the manifest's task tuple,
TEI's kinds on the host, `POST /`'s pick, "if the task is tensor"): each of those now reads the task's spec."""

from __future__ import annotations

import ast
from pathlib import Path

from handler.tasks.catalog import BUILTIN_TASKS
from tests.conftest import ROOT

HANDLER = ROOT / "handler"
# Where the tasks are declared: each built-in's module, and the table naming them.
DECLARED = {
    "tasks/catalog.py",
    "tasks/embedding.py",
    "tasks/scored.py",
    "tasks/tensor.py",
    "tasks/generate.py",
    "tasks/image_text.py",
    "tasks/multivector.py",
    "tasks/sparse.py",
    "tasks/hybrid.py",
}
# OpenAI's answer names its items `{"object": "embedding", "embedding": [...]}`: that API's words, not our task.
# The inference protocol's output tensor of an embedding model is named `embedding` (`handler.tasks.oip_io`).
API_WORDS = {("api/compat.py", "embedding"), ("api/schemas.py", "embedding"), ("tasks/oip_io.py", "embedding")}


def task_names_in(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """Each string constant in `path` that is one of `names` (docstrings and messages are longer strings)."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
    ]


def found(root: Path, names: set[str]) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in DECLARED:
            continue
        out += [f"{rel}:{line}: {name!r}" for line, name in task_names_in(path, names) if (rel, name) not in API_WORDS]
    return out


def test_nothing_outside_the_task_modules_names_a_task() -> None:
    assert found(HANDLER, set(BUILTIN_TASKS)) == []


def test_the_rule_catches_a_task_named_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "invocation.py").write_text(
        '"""tensor models read .npy"""\nif name != "tensor":\n    pass\n'
    )
    assert found(tmp_path, set(BUILTIN_TASKS)) == ["runtime/invocation.py:2: 'tensor'"]
