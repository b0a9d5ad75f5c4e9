"""A pack of several graphs (an image-text model's text and image towers) served as one backend.

The manifest's main entry describes the first graph (inputs, outputs, `backends`); each entry of its `towers`
describes another, with its own `backends`, `inputs` and `outputs`. `with_towers` builds one backend of the
chosen kind per extra graph, with the same settings, and `Towers.run` sends each run to the graph whose inputs
the feeds name (feeds a graph does not take are dropped: SigLIP's text tower has no attention mask).
A pack without `towers` gets its backend back untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    """Several backends, one per graph; a run goes to the graph whose first input the feeds hold."""

    def __init__(self, parts: dict[str, tuple[Backend, tuple[str, ...]]]) -> None:
        self.parts = parts
        first = next(iter(parts.values()))[0]
        self.name = first.name
        self.coldstart = getattr(first, "coldstart", {})

    def run(self, feeds: Arrays) -> Arrays:
        for backend, inputs in self.parts.values():
            if inputs and inputs[0] in feeds:
                return backend.run({n: feeds[n] for n in inputs})
        raise ValueError(f"no graph of this pack takes {sorted(feeds)}")

    def initialize(self, manifest: Manifest, settings: BackendSettings[Any], timer: PhaseTimer) -> None:
        pass  # each part was initialized by with_towers

    def warm_device(self) -> dict[str, Any]:
        return {name: backend.warm_device() for name, (backend, _) in self.parts.items()}

    def set_threads(self, threads: int) -> int:
        return min(backend.set_threads(threads) for backend, _ in self.parts.values())

    def describe(self) -> dict[str, Any]:
        first = next(iter(self.parts.values()))[0]
        return {**first.describe(), "graphs": list(self.parts)}


def with_towers(
    backend: Backend,
    spec: BackendSpec,
    manifest: Manifest,
    settings: BackendSettings[Any],
    timer: PhaseTimer,
    gives: Sequence[Needs] = ("arrays",),
) -> Backend:
    """`backend` (initialized on the main graph) alone, or with one more backend per tower of the pack."""
    towers = tower_manifests(manifest)
    if not towers:
        return backend
    parts: dict[str, tuple[Backend, tuple[str, ...]]] = {"main": (backend, tuple(i.name for i in manifest.inputs))}
    for name, view in towers.items():
        other = create_backend(spec, view, gives)
        with timer.phase(f"tower {name}"):
            other.initialize(view, settings, timer)
        parts[name] = (other, tuple(i.name for i in view.inputs))
    return Towers(parts)
