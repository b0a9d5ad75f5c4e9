"""Extensions found by name — tasks and backends: the project's own from a table of `module:attribute` paths, any
other from an installed package's entry points (groups `warmstart.tasks` and `warmstart.backends`).

Entry points are read only for a name that is not built in, or to list every name in an error or a report:
`importlib.metadata` costs ~22 ms to import and ~6 ms to scan 170 installed distributions here (measured
2026-12-05), which a function that runs a built-in task on a built-in backend must not pay at init.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from handler.core.errors import ConfigError

GROUPS = {"task": "warmstart.tasks", "backend": "warmstart.backends"}

_found: dict[str, dict[str, str]] = {}  # kind -> name -> "module:attribute", read once per process


def discovered(kind: str) -> dict[str, str]:
    """The entry points installed packages declare for `kind` (read once, then cached)."""
    if kind not in _found:
        # Deferred: importlib.metadata and the scan of every distribution cost ~28 ms (see the module docstring).
        from importlib.metadata import entry_points

        _found[kind] = {ep.name: ep.value for ep in entry_points(group=GROUPS[kind])}
    return _found[kind]


def names(kind: str, builtins: Mapping[str, str]) -> tuple[str, ...]:
    """Every name of `kind`: the built-ins in their order, then the installed ones sorted."""
    return tuple(builtins) + tuple(sorted(n for n in discovered(kind) if n not in builtins))


def target(kind: str, name: str, builtins: Mapping[str, str]) -> str:
    """The `module:attribute` path `name` resolves to; an unknown name is a ConfigError listing the valid ones."""
    path = builtins.get(name) or discovered(kind).get(name)
    if path is None:
        raise ConfigError(f"unknown {kind} {name!r}; valid {kind}s: {', '.join(names(kind, builtins))}")
    return path


def load(kind: str, name: str, builtins: Mapping[str, str]) -> Any:
    """The object `name` names (its module imported now). A plugin that fails to import is a ConfigError naming
    its entry point, not a traceback out of init."""
    path = target(kind, name, builtins)
    module, _, attribute = path.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in filter(None, attribute.split(".")):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        if name in builtins:
            raise
        raise ConfigError(f"{kind} {name!r} ({GROUPS[kind]} entry point {path!r}) cannot be loaded: {e}") from None
    return obj


def reset() -> None:
    """Forget what was discovered (tests install and remove plugins)."""
    _found.clear()
