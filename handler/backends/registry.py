"""Backends by name. A backend is an implementation module and a `BackendSpec` naming it; the spec is found
through handler.core.plugins: a built-in from BUILTIN_BACKENDS, any other from an installed package's
`warmstart.backends` entry point (read only for a name that is not built in).

A spec is data and imports nothing heavy: the prefetch thread reads it first thing in init, before numpy is
imported (its libraries, the files its start reads). The implementation module it names is imported only when
the backend is chosen (handler.backends.contract.create_backend): `onnxruntime` costs ~0.3 s to import and
`torch` ~2.5 s, and a function pays only for the one it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeAlias

from handler.core import plugins
from handler.core.errors import ConfigError

# What a backend needs from a task: named arrays in and out (`run(feeds) -> outputs`: ONNX Runtime, the torch
# program), or the whole request, for an engine that owns tokenization, scheduling and its KV cache
# (onnxruntime-genai, vLLM: handler.backends.contract.Engine).
# The alias is a string at run time (it is only ever an annotation): subscribing typing.Literal costs ~0.06-0.09 M
# instructions a start (callgrind), as do the aliases of the same kind in core.config and observability.metrics.
Needs: TypeAlias = "Literal['arrays', 'request']"
NEEDS: tuple[Needs, ...] = ("arrays", "request")

# Shared libraries a start of this backend loads, in import order: (package, globs under its site-packages
# directory), found without importing the package.
Libraries = tuple[tuple[str, tuple[str, ...]], ...]
# Ranges ([offset, length]) a session reads of a file, when it reads only part of it.
Ranges = dict[str, list[list[int]]]


class BackendSpec:
    """A backend's declaration: what its entry point (or BUILTIN_BACKENDS) names. A plain class, not a dataclass:
    it is built in the prefetch's path, before the start's reads are issued, where a dataclass costs ~1 ms."""

    __slots__ = ("lean", "libraries", "module", "name", "needs", "numpy", "settings", "start_files")

    def __init__(
        self,
        *,
        name: str,
        module: str,
        needs: Needs = "arrays",
        libraries: Libraries = (),
        settings: Callable[[Mapping[str, str]], Any] | None = None,
        start_files: Callable[[Mapping[str, Any], Mapping[str, str]], tuple[list[str], Ranges]] | None = None,
        numpy: bool = True,
        lean: bool = False,
    ) -> None:
        if needs not in NEEDS:
            raise ConfigError(f"backend {name!r} needs {needs!r}; valid: {', '.join(NEEDS)}")
        self.name = name  # what WARMSTART_BACKEND and the manifest's `backends` call it
        self.module = module  # the implementation: its `create()` builds the backend; imported only when chosen
        self.needs = needs
        self.libraries = libraries  # beyond the shim's own (numpy, tokenizers): handler.runtime.prefetch
        # Its own settings from the environment (ConfigError when one is invalid); the generic ones (threads,
        # device, spin) come to every backend in handler.backends.contract.BackendSettings.
        self.settings = settings
        # The files of its manifest entry a start reads, in order, and the ranges read of each (default: the
        # entry's `files`, whole). Runs before numpy is imported: stdlib only.
        self.start_files = start_files
        # Whether a Lambda start of it imports numpy (handler.app then imports it first, from its own frame); False:
        # nothing on its path computes with numpy, so the start leaves it out (its import is ~8 MB of the
        # process's own memory and init's largest import). Its own code imports numpy where a path needs it.
        self.numpy = numpy
        # Whether its backend serves a plain embedding request without numpy (`run_buffers`: typed buffers in, bytes
        # out), so a Lambda start of an embedding model on it imports numpy only after its first answer
        # (handler.runtime.prefetch.lean_start, handler.core.numpy_gate).
        self.lean = lean

    def __repr__(self) -> str:
        return f"BackendSpec(name={self.name!r}, module={self.module!r}, needs={self.needs!r})"

    def own_settings(self, env: Mapping[str, str]) -> Any:
        return self.settings(env) if self.settings is not None else None

    def files(self, entry: Mapping[str, Any], env: Mapping[str, str]) -> tuple[list[str], Ranges]:
        if self.start_files is not None:
            return self.start_files(entry, env)
        return list(entry.get("files", [])), {}


BUILTIN_BACKENDS = {
    "onnx": "handler.backends.ort_spec:SPEC",
    "torch": "handler.backends.torch_spec:SPEC",
    "genai": "handler.backends.genai_spec:SPEC",
    "vllm": "handler.backends.vllm_spec:SPEC",
}


def spec(name: str) -> BackendSpec:
    """The spec `name` names; an unknown name is a ConfigError listing the valid ones (plugins included)."""
    found = plugins.load("backend", name, BUILTIN_BACKENDS)
    if not isinstance(found, BackendSpec):
        raise ConfigError(
            f"backend {name!r} ({plugins.target('backend', name, BUILTIN_BACKENDS)}) is a {type(found).__name__}, "
            "not a handler.backends.registry.BackendSpec"
        )
    if found.name != name:
        raise ConfigError(f"backend {name!r} resolves to a spec named {found.name!r}: the names must agree")
    return found


def names() -> tuple[str, ...]:
    """Every backend name: the built-ins, then the installed plugins' (reads entry points: not for init)."""
    return plugins.names("backend", BUILTIN_BACKENDS)
