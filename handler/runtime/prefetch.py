"""Overlap init's disk reads with its CPU work: started at the first line of init, a thread asks the kernel to
read (`posix_fadvise(WILLNEED)`: asynchronous readahead into the page cache) the files init will touch, in the
order it touches them: the code (the pages of the import chain and its libraries a start reads, recorded at build
time by handler.runtime.startfiles; without a list, the shared libraries of numpy, ONNX Runtime and tokenizers
whole), then the packed model's files (the session maps the weights, the tokenizer file is read last).

On a warm page cache (sampled: startfiles.warm) nothing is issued. On a cold one (a new Lambda container reads its
image's chunks lazily from the network) every page fault of an import or of the session would otherwise wait
for its own small read while the CPU idles; here the reads run ahead of them. Measured in docs/coldstart.md.

Stdlib only, and of handler only `startfiles`, the manifest reader (handler.core.manifest) and the backend's spec
(handler.backends.registry: spec modules import nothing heavy; handler.core.numpy_gate for `lean_start`): it
runs before numpy is imported. Switch:
WARMSTART_PREFETCH = all (default) | model (the model's files only) | off. `numpy_at_start` and `lean_start` say
whether handler.app imports numpy first, or leaves it until the first answer (the latter reads the task's spec).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping
from importlib.util import find_spec
from pathlib import Path
from typing import Any

MODES = ("all", "model", "off")
# The shared libraries a start loads, in import order, as globs under site-packages (targeted: walking numpy's
# whole tree would cost the CPU this is meant to save): the shim's own (numpy, tokenizers) around the chosen
# backend's (its BackendSpec.libraries). CUDA/TensorRT providers load only with a device (and are hundreds of MB),
# so they are never prefetched.
_NUMPY = ("numpy", ("numpy.libs/*.so*", "numpy/_core/_multiarray_umath*.so", "numpy/linalg/_umath_linalg*.so"))
_TOKENIZERS = ("tokenizers", ("tokenizers/*.so",))
_SKIP = ("providers_cuda", "providers_tensorrt")
# The values that turn a switch off, as handler.core.config.env_bool reads them.
_OFF = ("0", "false", "no", "off")

_started: Prefetch | None = None


# A file and the [offset, length] ranges to read from it (None: all of it).
Item = tuple[Path, "list[list[int]] | None"]


class Prefetch:
    def __init__(self, files: list[Item], mode: str, backend: str = "", task: str = "") -> None:
        self.files = files  # the model's
        self.mode = mode
        self.backend = backend
        self.task = task  # the manifest's
        self.code: list[Item] = []  # the libraries, or the start's recorded code files (startfiles)
        self.code_source = "off"
        self.bytes = 0
        self.issued_ms = 0.0
        self.error: str | None = None
        self.skipped: str | None = None  # why nothing was issued
        self.t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="warmstart-prefetch", daemon=True)

    def _code(self) -> list[Item]:
        """The recorded start list when it fits this interpreter and backend, else the libraries' globs. On
        this thread, not init's: reading and resolving the list costs ~1 ms of CPU."""
        from handler.runtime import startfiles

        if getattr(sys, startfiles.ISSUED, False):
            self.code_source = "recorded, issued at interpreter start"
            return []
        try:
            recorded, why = startfiles.load(self.backend)
        except Exception as e:  # never fail a start over a hint; the report says what happened
            recorded, why = None, f"unreadable: {type(e).__name__}"
        if recorded is not None:
            self.code_source = f"recorded ({len(recorded)} files)"
            return recorded
        self.code_source = f"libraries (start list: {why})"
        # numpy's by the backend's spec alone (a lean start's decision imports the task's module: not on this thread)
        return [(p, None) for p in _libraries(self.backend)]

    def _run(self) -> None:
        from handler.runtime.startfiles import issue

        if self.mode == "all":
            self.code = self._code()
        self.bytes, self.error = issue([*self.code, *self.files])
        self.issued_ms = round((time.perf_counter() - self.t0) * 1000, 3)

    def report(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "code": self.code_source,
            "files": len(self.code) + len(self.files),
            "mb": round(self.bytes / 2**20, 1),
            "issued_ms": self.issued_ms,
            **({"error": self.error} if self.error else {}),
            **({"skipped": self.skipped} if self.skipped else {}),
        }


def start(environ: Mapping[str, str] | None = None) -> Prefetch | None:
    """Start the prefetch thread once per process (None: switched off, or nothing to read)."""
    global _started
    if _started is not None:
        return _started
    env = os.environ if environ is None else environ
    mode = (env.get("WARMSTART_PREFETCH") or "all").strip()
    if mode not in MODES:
        mode = "all"  # never fail init over a hint; `report()` shows what ran
    if mode == "off" or not hasattr(os, "posix_fadvise"):
        return None
    try:
        backend, task, files = _plan(env)
    except Exception:  # a missing or broken manifest is init's error to report, with its own message
        return None
    if not files:
        return None
    # The code files (libraries or the recorded start list) are found on the thread: see Prefetch._code.
    _started = Prefetch(files, mode, backend, task)
    if _warm(files, mode, backend):
        # Nothing to read ahead, and no thread: on a warm cache its Python work (~2 ms of CPU) contended with
        # the imports for the GIL and cost ~13 ms of a 1 vCPU start (measured: docs/coldstart.md).
        _started.skipped = "page cache warm (sampled pages resident)"
        _started.code_source = "not read (page cache warm)"
        _started.issued_ms = round((time.perf_counter() - _started.t0) * 1000, 3)
        return _started
    _started._thread.start()
    return _started


def _warm(files: list[Item], mode: str, backend: str) -> bool:
    """The model's files and, when the code is ours to prefetch, a sample of the start list (startfiles.warm);
    without a list (or with a stale one) the model's files decide."""
    from handler.runtime import startfiles

    code: list[Item] = []
    if mode == "all" and not getattr(sys, startfiles.ISSUED, False):
        try:
            code = startfiles.load(backend, count=startfiles.PROBE)[0] or []
        except Exception:  # never fail a start over a hint
            return False
    return startfiles.warm([*code, *files])


def report() -> dict[str, Any]:
    return _started.report() if _started is not None else {"mode": "off"}


def plan(env: Mapping[str, str], libs: bool = True) -> list[Item]:
    """The files (and for the pre-optimized data, the ranges the session reads), in the order init touches
    them: the libraries (whole; the thread reads the recorded start list instead when there is one), then the
    model's."""
    backend, _, files = _plan(env)
    return [(p, None) for p in _libraries(backend, numpy_at_start(environ=env))] + files if libs and files else files


def _plan(env: Mapping[str, str]) -> tuple[str, str, list[Item]]:
    """The backend, the manifest's task and the model's files, in the order init touches them."""
    model_dir = _model_dir(env)
    if model_dir is None:
        return "", "", []
    from handler.core.errors import ModelLoadError
    from handler.core.manifest import read_early

    # Never a plain open (a FIFO there would hang init); the parse is handed to init's manifest load, which takes
    # it while the file is unchanged instead of reading it again.
    try:
        raw = read_early(model_dir / "manifest.json")
    except ModelLoadError as e:  # absent, or not a regular file: as before, init's error to report
        raise FileNotFoundError(str(e)) from None
    backend = env.get("WARMSTART_BACKEND") or raw["default_backend"]
    task = raw.get("task") if isinstance(raw.get("task"), str) else ""
    entry = raw["backends"].get(backend)
    if entry is None:
        return backend, task, []
    from handler.backends.registry import spec as backend_spec

    files: list[Item] = []
    names, ranges = backend_spec(backend).files(entry, env)
    tokenizer = raw.get("tokenizer") or {}
    shortcut = tokenizer.get("shortcut") or {}
    shortcut_on = (env.get("WARMSTART_TOKENIZER_SHORTCUT") or "1").strip().lower() not in _OFF
    if shortcut.get("vocab") in raw.get("files", {}) and shortcut_on:
        names.append(shortcut["vocab"])  # init builds the tokenizer from the vocabulary (if the proof holds)
    elif tokenizer.get("file"):
        names.append(tokenizer["file"])
    return backend, task, files + [(model_dir / n, ranges.get(n)) for n in names if n in raw.get("files", {})]


def numpy_at_start(backend: str | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a start of `backend` (None: the one this start plans, from the manifest the prefetch read, and not a
    lean start: `lean_start`) imports numpy first (its spec's `numpy`); True where that is not known (no model, a
    broken manifest or spec): as before."""
    if backend is None:
        try:
            backend, task = _planned(os.environ if environ is None else environ)
        except Exception:  # init reports a broken manifest with its own message
            return True
        if _lean(backend, task, os.environ if environ is None else environ):
            return False
    from handler.backends.registry import spec as backend_spec

    try:
        return bool(backend_spec(backend).numpy) if backend else True
    except Exception:  # an unknown backend: init's error to report
        return True


def lean_start(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this start answers its first requests without numpy and imports it after (handler.core.numpy_gate):
    an embedding model on a backend that serves one without numpy (its spec's `lean`), where init neither warms up
    nor is snapshotted (both run the numpy path at init: they import it first, as before). WARMSTART_LEAN_START=0
    turns it off. False where any of it is not known."""
    env = os.environ if environ is None else environ
    try:
        return _lean(*_planned(env), env)
    except Exception:  # init reports a broken manifest with its own message
        return False


def _planned(env: Mapping[str, str]) -> tuple[str, str]:
    """This start's backend and task: the prefetch's, else read now."""
    if _started is not None:
        return _started.backend, _started.task
    backend, task, _ = _plan(env)
    return backend, task


def _lean(backend: str, task: str, env: Mapping[str, str]) -> bool:
    from handler.core import numpy_gate
    from handler.core.config import init_type, lean_start_on, snapshot_mode, warmup_at_init

    # A Lambda runtime's on-demand start only: the HTTP host serves batches and the compatible APIs through numpy
    # (warm-up off or not; it refuses before init, under a Lambda runtime API too), and a warm-up or a snapshot runs
    # the numpy path at init.
    if init_type(env) != "on-demand" or numpy_gate.refused():
        return False
    try:
        if not backend or not lean_start_on(env) or snapshot_mode(env) is not None or warmup_at_init(env):
            return False
    except Exception:  # a value config refuses: init reports it (ConfigError, with the valid values)
        return False
    from handler.backends.registry import spec as backend_spec

    try:
        if not backend_spec(backend).lean:
            return False
    except Exception:  # an unknown backend: init's error to report
        return False
    # The task's spec: its module is imported here rather than by init's manifest load just after (the same
    # modules, none of them numpy's). A plugin's task (entry points read: slow) is never lean.
    from handler.tasks import catalog

    try:
        return task in catalog.BUILTIN_TASKS and catalog.spec(task).lean
    except Exception:  # a broken task module: init's error to report
        return False


def _model_dir(env: Mapping[str, str]) -> Path | None:
    # The same rule as handler.core.config (a local WARMSTART_MODEL, else the embedded default), without importing
    # it here; an s3:// model is fetched by init, nothing to prefetch before that.
    raw = env.get("WARMSTART_MODEL", "").strip()
    if "://" in raw:
        return None
    if raw:
        return Path(raw)
    root = Path(__file__).resolve().parents[2]  # handler/runtime/prefetch.py → the code root
    for candidate in (root / "models" / "default", Path("/opt/models/default")):
        if candidate.is_dir():
            return candidate
    return None


def _libraries(backend: str, numpy: bool | None = None) -> list[Path]:
    """The shared libraries a start of `backend` loads; numpy's where `numpy` (None: where `backend` imports it)."""
    from handler.backends.registry import spec as backend_spec

    try:
        own = backend_spec(backend).libraries
    except Exception:  # an unknown or broken backend is init's error to report; the shim's own libraries still help
        own = ()
    out: list[Path] = []
    numpy = numpy_at_start(backend) if numpy is None else numpy
    for package, patterns in ((_NUMPY,) if numpy else ()) + (*own, _TOKENIZERS):
        spec = find_spec(package)  # locates the package without importing it
        if spec is None or not spec.submodule_search_locations:
            continue
        site = Path(next(iter(spec.submodule_search_locations))).parent
        for pattern in patterns:
            out += [p for p in sorted(site.glob(pattern)) if not any(s in p.name for s in _SKIP)]
    return out
