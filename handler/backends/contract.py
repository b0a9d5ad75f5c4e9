"""The accelerator contract (initialize / run or submit / describe), the settings every backend gets, and
`create_backend`, which imports the chosen backend's implementation module (handler.backends.registry: only the
one chosen, when chosen) and checks that the task and the backend fit each other.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar

from handler.backends.device import CudaProbe
from handler.backends.registry import BUILTIN_BACKENDS, NEEDS, BackendSpec, Needs
from handler.core.errors import ConfigError
from handler.core.manifest import Manifest
from handler.core.records import record
from handler.core.types import JSON, Arrays, Protocol
from handler.observability.report import PhaseTimer

Own = TypeVar("Own")


@record
class BackendSettings(Generic[Own]):
    """What every backend gets, and its own settings (`BackendSpec.settings`' reading of the environment)."""

    threads: int
    cuda: CudaProbe
    spin: bool  # let intra-op threads spin between ops: faster, but burns billed CPU time on Lambda
    own: Own


class BackendBase(Protocol):
    """What every backend does. Optional: a `coldstart` attribute, a dict of its own cold-start facts for the init
    report (ONNX Runtime: whether its pre-optimized model was used)."""

    name: str

    def initialize(self, manifest: Manifest, settings: BackendSettings[Any], timer: PhaseTimer) -> None:
        """Map the weights and build what runs them; record sub-phases on `timer`."""

    def warm_device(self) -> dict[str, Any]:
        """Initialize the accelerator for real (context, an allocation, a kernel); say what was done."""

    def set_threads(self, threads: int) -> int:
        """Change the intra-op thread count after init (a restored snapshot); returns the count in effect."""

    def describe(self) -> dict[str, Any]:
        """Facts for the init report and status: providers, device, threads, versions."""


class Backend(BackendBase, Protocol):
    """needs "arrays": the task tokenizes, batches and shapes the answer; the backend runs the model."""

    def run(self, feeds: Arrays) -> Arrays:
        """Named inputs → named outputs, as the manifest's spec says."""


class Engine(BackendBase, Protocol):
    """needs "request": an engine that owns tokenization, scheduling and its KV cache (onnxruntime-genai, vLLM)
    takes the whole validated request; the task only checks it and shapes what comes back."""

    def submit(self, request: JSON) -> JSON | Iterator[JSON]:
        """The answer to one request, or for a streamed task its pieces in order (stopped when not iterated)."""


# The method each kind of backend must have: a plugin without it fails init here, not at its first request.
_ENTRY = {"arrays": "run", "request": "submit"}


class IncompatibleBackendError(ConfigError):
    """The configured task and backend do not fit: the backend needs what the task does not give."""


def check_pairing(task: str, gives: Sequence[Needs], spec: BackendSpec) -> None:
    """A task gives its backend arrays, the whole request, or either; the backend needs one of them."""
    unknown = [g for g in gives if g not in NEEDS]
    if unknown:
        raise ConfigError(f"task {task!r} gives {unknown[0]!r}; valid: {', '.join(NEEDS)}")
    if spec.needs not in gives:
        raise IncompatibleBackendError(
            f"backend {spec.name!r} needs {spec.needs} from its task (BackendSpec.needs); task {task!r} gives "
            f"{' or '.join(gives)}: choose a backend that takes {' or '.join(gives)} (WARMSTART_BACKEND)"
        )


def create_backend(spec: BackendSpec, manifest: Manifest, gives: Sequence[Needs] = ("arrays",)) -> Backend:
    """The backend `spec` names, for `manifest`'s model and task (`gives`: what the task hands a backend).
    Every refusal comes before the implementation module is imported. For a spec that needs "request" the
    object is an `Engine`."""
    name = spec.name
    if name in manifest.unsupported_backends:
        raise ConfigError(
            f"model {manifest.key} cannot run on backend {name!r}: {manifest.unsupported_backends[name]}; "
            f"it is packed for: {', '.join(sorted(manifest.backends))}"
        )
    if name not in manifest.backends:
        raise ConfigError(
            f"model {manifest.key} is not packed for backend {name!r}; it is packed for: "
            f"{', '.join(sorted(manifest.backends))}"
        )
    check_pairing(manifest.task, gives, spec)
    try:
        module = importlib.import_module(spec.module)
    except ImportError as e:
        if name in BUILTIN_BACKENDS:
            raise
        raise ConfigError(f"backend {name!r}: its module {spec.module} cannot be imported: {e}") from None
    create = getattr(module, "create", None)
    if not callable(create):
        raise ConfigError(f"backend {name!r}: its module {spec.module} has no create()")
    backend: Backend = create()
    if not callable(getattr(backend, _ENTRY[spec.needs], None)):
        raise ConfigError(
            f"backend {name!r} needs {spec.needs} but {type(backend).__name__} has no {_ENTRY[spec.needs]}()"
        )
    return backend
