"""The task contract and the catalog of tasks: a task's spec (`handler.tasks.spec.TaskSpec`) found by its name,
a built-in's from `BUILTIN_TASKS`, any other from an installed package's `warmstart.tasks` entry point
(`handler.core.plugins`). This table is the one place in handler/ that lists the tasks.

A spec's module is imported when its task is first asked for: an instance serving an embedding model never
imports the other tasks' modules (and, with built-in names, never reads entry points).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from handler.core import manifest as _manifest
from handler.core import plugins
from handler.core.errors import ConfigError
from handler.core.manifest import Manifest
from handler.tasks.spec import Task, TaskFactory, TaskSpec

__all__ = ["BUILTIN_TASKS", "Task", "TaskFactory", "TaskSpec", "load_manifest", "spec"]

BUILTIN_TASKS = {
    "embedding": "handler.tasks.embedding:SPEC",
    "rerank": "handler.tasks.scored:RERANK",
    "classify": "handler.tasks.scored:CLASSIFY",
    "tensor": "handler.tasks.tensor:SPEC",
    "generate": "handler.tasks.generate:SPEC",
    "image-text": "handler.tasks.image_text:SPEC",
    "multivector": "handler.tasks.multivector:SPEC",
    "sparse": "handler.tasks.sparse:SPEC",
    "hybrid": "handler.tasks.hybrid:SPEC",
}


_specs: dict[str, TaskSpec] = {}  # name → spec, once loaded (a request's route check reads it)


def spec(name: str) -> TaskSpec:
    """The spec of task `name`; ConfigError listing the valid tasks for an unknown one."""
    found = _specs.get(name)
    if found is None:
        found = plugins.load("task", name, BUILTIN_TASKS)
        if not isinstance(found, TaskSpec) or found.name != name:
            raise ConfigError(f"task {name!r}: its entry point names {found!r}, not a TaskSpec named {name!r}")
        _specs[name] = found
    return found


def names() -> tuple[str, ...]:
    """Every task: the built-ins, then the installed ones (reads entry points: not for the init path)."""
    return plugins.names("task", BUILTIN_TASKS)


def having(predicate: Callable[[TaskSpec], bool]) -> list[str]:
    """The tasks whose spec satisfies `predicate`, for an error message that says which would do (every spec
    imported, entry points read: never on a good path). A plugin that cannot be loaded is left out."""
    out = []
    for name in names():
        try:
            if predicate(spec(name)):
                out.append(name)
        except ConfigError:
            continue
    return out


def specs() -> list[TaskSpec]:
    """Every task's spec, for the OpenAPI document (each module imported; reads entry points). A plugin that
    cannot be loaded is left out: it fails the init of a model that names it, not the document."""
    return [spec(name) for name in having(lambda _: True)]


def task_fields(task: str, raw: dict[str, Any]) -> dict[str, Any]:
    """A manifest's task-specific fields, checked by its task's spec (`load_manifest`'s hook). An unknown task
    is a ValueError listing the valid ones, so the manifest's error names it."""
    try:
        found = spec(task)
    except ConfigError as e:
        raise ValueError(str(e)) from None
    return found.fields(raw)


def load_manifest(root: Path) -> Manifest:
    """`handler.core.manifest.load_manifest` with the task's own fields checked: what a model load reads."""
    return _manifest.load_manifest(root, task_fields)
