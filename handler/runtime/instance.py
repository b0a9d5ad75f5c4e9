"""What one function instance holds between invocations: its models, identity, counters, workers and
observability, and the one way a request reaches a model (`serve`, under a lease).

The request paths (`handler.runtime.invocation`) and control replies (`handler.runtime.control`) build on it;
init (`handler.runtime.init`) fills it.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable, Generator, Mapping
from typing import TYPE_CHECKING, Any

from handler.backends.contract import Backend
from handler.backends.pool import BufferPool
from handler.core.config import Config
from handler.core.errors import UnsupportedRequestError
from handler.core.manifest import Manifest
from handler.core.types import JSON
from handler.models.loader import Loaded
from handler.models.registry import Registry, requested_model, weights_bytes
from handler.observability import logs, metrics, report, trace
from handler.tasks.catalog import Task
from handler.tasks.streaming import collect, streams

if TYPE_CHECKING:
    # Reload, status and the worker pool load on first use: a single-model function serving plain requests
    # never imports them (~10 ms of init here, measured with -X importtime; docs/coldstart.md).
    from opentelemetry.trace import Tracer

    from handler.models.reloader import Reloader
    from handler.models.watcher import Watcher
    from handler.runtime.status import Diagnostics
    from handler.runtime.workers import WorkerPool

Run = Callable[[Any, JSON], dict[str, Any]]  # a route's call of the model's task object with a native request
Check = Callable[[str, str], None]  # a route's check of (task name, model key): raises when it is not served


class Instance:
    def __init__(
        self,
        config: Config,
        manifest: Manifest,
        backend: Backend,
        task: Task,
        init: dict[str, Any],
        pool: BufferPool | None = None,
        workers: WorkerPool | None = None,
        registry: Registry | None = None,
        reloader: Reloader | None = None,
        watcher: Watcher | None = None,
        make_reloader: Callable[[Registry], Reloader] | None = None,
    ) -> None:
        self.config = config
        self.init_report = init
        self.pool = pool or getattr(task, "pool", None) or BufferPool()
        if registry is None:
            facts = {"threads": {"intra_op": 0}}
            loaded = Loaded(manifest, backend, task, self.pool, 1, facts, weights_bytes(manifest, backend.name))
            registry = Registry(loaded, str(manifest.root))
        # The models this instance serves, keyed id@version; `manifest`, `backend` and `task` are the default's.
        # Always there: its leases are what keep a running request's model alive through a reload.
        self.registry = registry
        # The reloader is built on first use (an admin or status event) when nothing at init needs it: a plain
        # single-model function never imports handler.models.reloader.
        self._reloader = reloader
        self._make_reloader = make_reloader
        self._diagnostics: Diagnostics | None = None
        # The timer thread for idle unload and the S3 pointer; None unless either is configured.
        # SnapStart: `watcher.before_snapshot()` / `watcher.after_restore()`.
        self.watcher = watcher
        # Set when several requests may run at once (the HTTP host, Lambda Managed Instances): inference
        # goes through it, bounded; pings and status never do.
        self.workers = workers
        self.instance_id = uuid.uuid4().hex
        self.started = time.monotonic()
        self.invocations = 0
        self.counts = {"inference": 0, "ping": 0, "status": 0, "rejected": 0, "failed": 0}
        self._lock = threading.Lock()
        # Observability (handler.observability: metrics, logs, trace): off unless init or the HTTP host sets
        # them; an OpenTelemetry tracer only where OpenTelemetry is already in use.
        self.metrics: metrics.Recorder = metrics.NoMetrics()
        self.tracer: Tracer | None = None

    @property
    def reloader(self) -> Reloader:
        if self._reloader is None:
            with self._lock:
                if self._reloader is None:
                    if self._make_reloader is None:
                        from handler.models.reloader import Reloader

                        self._reloader = Reloader(self.registry, self.config, {})
                    else:
                        self._reloader = self._make_reloader(self.registry)
        return self._reloader

    @property
    def diagnostics(self) -> Diagnostics:
        if self._diagnostics is None:
            from handler.runtime.status import Diagnostics

            self._diagnostics = Diagnostics()
        return self._diagnostics

    def _tick(self) -> None:
        # Tracing only runs once diagnostics exist (a status request, WARMSTART_TRACEMALLOC_S): before that there
        # is nothing to stop, and the status module stays unimported.
        if self._diagnostics is not None:
            self._diagnostics.tick()

    def observe(self, env: Mapping[str, str], init: dict[str, Any]) -> None:
        """JSON logs at the function's level, the metrics recorder (EMF on Lambda), OpenTelemetry spans for
        init when OpenTelemetry is in use."""
        logs.configure(env)
        self.metrics = report.metrics = metrics.Emf.from_environ(env, self.manifest.key, self.backend.name)
        self.tracer = trace.otel_tracer(env)
        if self.tracer is not None:
            attributes = {"warmstart.model": self.manifest.key, "warmstart.init_type": str(init.get("init_type"))}
            trace.init_spans(self.tracer, init.get("phases_ms", {}), init.get("total_ms", 0.0), attributes)

    @property
    def manifest(self) -> Manifest:
        return self.registry.default.manifest

    @property
    def backend(self) -> Backend:
        return self.registry.default.backend

    @property
    def task(self) -> Task:
        return self.registry.default.task

    # -- snapshot support (handler.runtime.snapshot calls these) -------------------------------------------

    @property
    def threads(self) -> int:
        return int(self.backend.describe().get("threads", 0))

    def uses_cuda(self) -> bool:
        return self.backend.describe().get("device") == "cuda"

    def set_threads(self, threads: int) -> int:
        """Intra-op threads from now on; returns what the backend could apply."""
        return self.backend.set_threads(threads)

    def release_for_snapshot(self) -> list[str]:
        """Drop what must not be frozen into a snapshot; each comes back after restore (lazily or rebuilt)."""
        released = []
        if self.workers is not None:
            self.workers.shutdown()  # its threads would not survive a fork
            released.append("workers")
        s3 = sys.modules.get("handler.models.s3fetch")
        if s3 is not None and s3.drop_clients():  # only if a model came from S3: never import boto3 for this
            released.append("s3-client")
        if self.watcher is not None:  # idle-unload / S3-pointer thread: stopped, restarted after restore
            released += self.watcher.before_snapshot()
        return released

    def reopen_after_restore(self) -> list[str]:
        reopened = []
        if self.workers is not None:
            from handler.runtime.workers import WorkerPool

            self.workers = WorkerPool(self.workers.sizing, self.workers.cpus)
            reopened.append("workers")
        if self.watcher is not None:
            reopened += self.watcher.after_restore()
        return reopened

    def renew_identity(self, instance_id: str) -> None:
        """A restored copy is a new instance: its own id, uptime and counters."""
        with self._lock:
            self.instance_id = instance_id
            self.started = time.monotonic()
            self.invocations = 0
            self.counts = dict.fromkeys(self.counts, 0)

    def restored(self, restore: dict[str, Any]) -> None:
        self.init_report["restore"] = restore
        self.init_report["instance_id"] = self.instance_id

    # -- counters and the model ----------------------------------------------------------------------------

    def count(self, kind: str) -> None:
        with self._lock:
            self.counts[kind] += 1

    def counted(self) -> dict[str, int]:
        """Invocations so far, in total and by kind (status and health show it)."""
        with self._lock:
            return {"total": self.invocations, **self.counts}

    def next_invocation(self) -> int:
        """Count one more invocation; its number (1: this instance's first, its cold one)."""
        with self._lock:
            self.invocations += 1
            return self.invocations

    def infer(
        self, payload: JSON, inv: logs.Invocation | None = None, check: Check | None = None, run: Run | None = None
    ) -> dict[str, Any]:
        """The task, on a worker when several requests may run at once. `check`: a compatible route's check of
        the model's task; `run`: how the route calls the task (None: `task(payload)`)."""
        self.count("inference")
        # The native path calls serve as it always has.
        args: tuple[Any, ...] = (payload,) if check is None and run is None else (payload, check, run)
        workers = self.workers
        reply = workers.call(self.serve, *args) if workers is not None else self.serve(*args)
        if inv is not None:
            usage(inv, payload, reply)
        return reply

    def serve(self, payload: JSON, check: Check | None = None, run: Run | None = None) -> dict[str, Any]:
        """The named (or default) model's task, under a lease: a reload or eviction never pulls the model
        out from under a running request. `check`: a compatible route's (does the model's task serve it?);
        `run`: how the route calls it (`/tokenize` calls its tokenizer)."""
        with self.registry.lease(requested_model(payload)) as model:
            if check is not None:
                check_served(check, model.task.name, model.key, self.registry.tasks)
            if run is None and streams(model.task):  # one buffered answer (Lambda, or "stream" not asked)
                return collect(model.task, model.task.stream(payload))  # type: ignore[attr-defined]
            return model.task(payload) if run is None else run(model.task, payload)

    def serve_stream(self, payload: JSON, check: Check | None = None) -> Generator[dict[str, Any], None, None]:
        """A streaming task's pieces, as `serve` runs a task: under a lease held until the stream ends or is
        closed (a reload never pulls the model out from under it). Checked before the first piece: the model
        is found, has the route's task, and streams."""
        with self.registry.lease(requested_model(payload)) as model:
            if check is not None:
                check_served(check, model.task.name, model.key, self.registry.tasks)
            if not streams(model.task):
                raise UnsupportedRequestError(f'{model.key} answers one value; "stream": true is for streaming tasks')
            yield from model.task.stream(payload)  # type: ignore[attr-defined]

    def task_name(self, payload: JSON) -> str:
        """The task of the model a (native) request names, or of the default model."""
        with self.registry.lease(requested_model(payload)) as model:
            return model.task.name

    def find(self, model_id: str) -> str | None:
        return self.registry.find(model_id)

    def served_key(self, payload: JSON) -> str:
        """The key (`id@version`) of the model a native request names, or of the default model."""
        named = requested_model(payload)
        if named is not None and "@" not in named:
            named = self.find(named)
        return named or self.registry.default_key

    def model_list(self) -> JSON:
        """`GET /v1/models`: every model this instance serves (the default first), in OpenAI's list shape."""
        default = self.registry.default_key
        pairs = sorted(self.registry.tasks().items(), key=lambda pair: pair[0] != default)
        created = int(time.time() - (time.monotonic() - self.started))  # when this instance started
        from handler.api.compat import model_list  # deferred: see check_served

        return model_list(pairs, created)


def check_served(check: Check, task: str, key: str, tasks: Callable[[], dict[str, str]]) -> None:
    # Deferred: the compatible APIs (handler.api.compat and what it imports) load with the first request on
    # one of their routes, never on a plain Lambda init (bench/coldstart/instr.py counts what that saves).
    from handler.api import compat

    compat.check_served(check, task, key, tasks)


def usage(inv: logs.Invocation, payload: JSON, reply: JSON) -> None:
    """Batch size and tokens of a served request, for its metrics (read from what is already there)."""
    inputs = payload.get("inputs") if isinstance(payload, dict) else None
    inv.batch = len(inputs) if isinstance(inputs, list) else 1
    usage = reply.get("usage") if isinstance(reply, dict) else None
    tokens = usage.get("tokens") if isinstance(usage, dict) else None
    inv.tokens = tokens if isinstance(tokens, int) else 0
    model = reply.get("model") if isinstance(reply, dict) else None
    if isinstance(model, str):
        inv.model = model
