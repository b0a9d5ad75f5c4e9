"""A pack of several graphs (an image-text model's text and image towers) served as one backend.

The manifest's main entry describes the first graph (inputs, outputs, `backends`); each entry of its `towers`
describes another, with its own `backends`, `inputs` and `outputs`. `with_towers` builds one backend of the
chosen kind per extra graph, with the same settings, and `Towers.run` sends each run to the graph whose inputs
the feeds name (feeds a graph does not take are dropped: SigLIP's text tower has no attention mask).
A pack without `towers` gets its backend back untouched.

The extra graphs are built on their first run, not at init: a text-only instance of an image-text pack never
pays for the vision tower's session (its load, its memory). The first image request pays for it instead
(`describe()["loaded"]` and `tower_ms` say which graphs are built and what each cost).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from handler.backends.contract import Backend, BackendSettings, create_backend
from handler.backends.registry import BackendSpec, Needs
from handler.core.manifest import Manifest, TensorSpec
from handler.core.records import replace
from handler.core.types import Arrays
from handler.observability.report import PhaseTimer


def tower_manifests(manifest: Manifest) -> dict[str, Manifest]:
    """Each extra graph's view of the manifest (its backends, inputs, outputs); ValueError when malformed."""
    towers = manifest.raw.get("towers") or {}
    if not isinstance(towers, dict):
        raise ValueError("towers must be an object of tower name → {backends, inputs, outputs}")
    out = {}
    for name, raw in towers.items():
        if not isinstance(raw, dict) or not isinstance(raw.get("backends"), dict):
            raise ValueError(f"towers.{name}: expected an object with backends, inputs and outputs")
        out[str(name)] = replace(
            manifest,
            backends={str(k): dict(v) for k, v in raw["backends"].items()},
            inputs=tuple(TensorSpec.parse(t, f"towers.{name}.inputs") for t in raw.get("inputs") or ()),
            outputs=tuple(TensorSpec.parse(t, f"towers.{name}.outputs") for t in raw.get("outputs") or ()),
        )
    return out


class Towers:
    """Several backends, one per graph; a run goes to the graph whose first input the feeds hold. The main graph
    is built; each other is built (`build(threads)`) on the first run that needs it."""

    def __init__(
        self,
        main: tuple[Backend, tuple[str, ...]],
        lazy: dict[str, tuple[Callable[[int | None], Backend], tuple[str, ...]]],
    ) -> None:
        self.parts: dict[str, tuple[Backend, tuple[str, ...]]] = {"main": main}
        self.lazy = lazy
        self.order = ["main", *lazy]
        self.threads: int | None = None  # set_threads before a tower is built: it is built with these
        self.tower_ms: dict[str, float] = {}
        self._lock = threading.Lock()
        self.name = main[0].name
        self.coldstart = getattr(main[0], "coldstart", {})

    def _inputs(self, name: str) -> tuple[str, ...]:
        return self.parts[name][1] if name in self.parts else self.lazy[name][1]

    def part(self, name: str) -> Backend:
        """The graph `name`'s backend, built now if it was not (once: concurrent first runs wait for it)."""
        if name not in self.parts:
            with self._lock:
                if name not in self.parts:
                    build, inputs = self.lazy[name]
                    t0 = time.perf_counter()
                    backend = build(self.threads)
                    self.tower_ms[name] = round((time.perf_counter() - t0) * 1000, 3)
                    self.parts[name] = (backend, inputs)
        return self.parts[name][0]

    def run(self, feeds: Arrays) -> Arrays:
        for name in self.order:
            inputs = self._inputs(name)
            if inputs and inputs[0] in feeds:
                return self.part(name).run({n: feeds[n] for n in inputs})
        raise ValueError(f"no graph of this pack takes {sorted(feeds)}")

    def initialize(self, manifest: Manifest, settings: BackendSettings[Any], timer: PhaseTimer) -> None:
        pass  # the main graph was initialized before with_towers; the others are built on their first run

    def warm_device(self) -> dict[str, Any]:
        return {name: backend.warm_device() for name, (backend, _) in self.parts.items()}

    def set_threads(self, threads: int) -> int:
        self.threads = threads
        return min(backend.set_threads(threads) for backend, _ in list(self.parts.values()))

    def describe(self) -> dict[str, Any]:
        first = self.parts["main"][0]
        return {**first.describe(), "graphs": self.order, "loaded": list(self.parts), "tower_ms": dict(self.tower_ms)}


def with_towers(
    backend: Backend,
    spec: BackendSpec,
    manifest: Manifest,
    settings: BackendSettings[Any],
    timer: PhaseTimer,
    gives: Sequence[Needs] = ("arrays",),
) -> Backend:
    """`backend` (initialized on the main graph) alone, or with one more backend per tower of the pack, each
    built on its first run."""
    towers = tower_manifests(manifest)
    if not towers:
        return backend
    lazy: dict[str, tuple[Callable[[int | None], Backend], tuple[str, ...]]] = {}
    for name, view in towers.items():

        def build(threads: int | None, view: Manifest = view, name: str = name) -> Backend:
            other = create_backend(spec, view, gives)
            chosen = settings if threads is None else replace(settings, threads=threads)
            other.initialize(view, chosen, PhaseTimer())
            return other

        lazy[name] = (build, tuple(i.name for i in view.inputs))
    return Towers((backend, tuple(i.name for i in manifest.inputs)), lazy)
