"""One function instance: the init phase (once) and the per-invocation path.

`Runtime.start()` is Lambda's init phase: import only the chosen backend, check the manifest, map the
weights, build the session with the threads the CPU quota allows, warm the device, run a warm-up
inference, then print one JSON init report line.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from handler.api.compat import LAMBDA_PATHS, NATIVE, ROUTES, Route
from handler.api.media import MEDIA_TYPES, Kind, UnsupportedMediaTypeError, npy_answer
from handler.api.ping import hold_ms, is_ping
from handler.api.sources import decode_body, infer_source
from handler.backends.contract import Backend
from handler.backends.pool import BufferPool
from handler.core.config import LAMBDA_PAYLOAD_LIMIT, Config, snapshot_mode
from handler.core.errors import RequestError, UnsupportedRequestError
from handler.core.manifest import Manifest
from handler.core.types import JSON, Event
from handler.models.loader import Loaded, load_model, max_concurrency
from handler.models.registry import Registry, requested_model, weights_bytes
from handler.observability import logs, metrics, report, trace
from handler.tasks.catalog import Task

if TYPE_CHECKING:
    # Reload, status, snapshot hooks and the worker pool load on first use: a single-model function serving
    # plain requests never imports them (~10 ms of init here, measured with -X importtime; docs/coldstart.md).
    from handler.models.reloader import Reloader, Sources, Watcher
    from handler.runtime.status import Diagnostics
    from handler.runtime.workers import WorkerPool

log = logging.getLogger("warmstart")


class Runtime:
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
        # Observability (handler.observability: metrics, logs, trace): off unless `start` or the HTTP host sets
        # them; an OpenTelemetry tracer only where OpenTelemetry is already in use.
        self.metrics: metrics.Recorder = metrics.NoMetrics()
        self.tracer: Any = None

    @classmethod
    def start(
        cls,
        config: Config | None = None,
        environ: Mapping[str, str] | None = None,
        emit: Callable[[dict[str, Any]], None] | None = report.emit,
        sources: Sources | None = None,
    ) -> Runtime:
        env = os.environ if environ is None else environ
        config = config or Config.from_environ(env)
        timer = report.PhaseTimer()
        age_at_start = report.process_age_ms()
        threads, bound_by = None, None
        snapshot = snapshot_mode(env)
        if snapshot == "fork":
            # fork() copies only the calling thread: the template holds no thread pool (one intra-op thread,
            # no tokenizer pool); torch's threads are created after restore, ORT's session keeps one.
            threads, bound_by = 1, "fork-snapshot"
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        # Where the default model comes from: a directory (no S3, no boto3, no reload module), or s3:// / the
        # pointer, fetched.
        source, pointer_etag, model_dir = str(config.model_dir), None, config.model_dir
        if sources is not None or config.model_uri or config.model_pointer:
            from handler.models.reloader import Sources, initial_source

            sources = sources or Sources(environ=env, backend=config.backend)
            source, pointer_etag = initial_source(config, env, sources)
            if source != str(config.model_dir):
                with timer.phase("fetch"):
                    model_dir = sources.resolve(source)
        loaded = load_model(model_dir, config, env, timer, threads=threads, bound_by=bound_by)
        manifest, slots = loaded.manifest, max_concurrency(env)
        init = {
            "warmstart": "init",
            "model": manifest.key,
            "task": manifest.task,
            "init_type": env.get("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand"),
            "snapshot": snapshot,
            **loaded.facts,
            "phases_ms": dict(timer.phases),
            "total_ms": timer.total_ms(),
            "process_age_at_init_ms": age_at_start,
            **report.memory_mb(),
            "weights_mb": round(loaded.weights_bytes / 2**20, 1),
            "coldstart": coldstart_report(loaded.coldstart),
        }
        workers = None
        if "AWS_LAMBDA_MAX_CONCURRENCY" in env:
            from handler.runtime.workers import WorkerPool, sizing_from_environ

            workers = WorkerPool(sizing_from_environ(env, max(1, loaded.cpus // slots)), loaded.cpus)
            init["workers"] = {"max_concurrency": slots, **workers.stats()}
        if loaded.warmup_error:
            init["warmup_error"] = loaded.warmup_error
        # A fork template must hold no thread pool: extra models then load on first use, after restore.
        eager = snapshot != "fork"
        reloader = watcher = None
        if config.models or source != str(config.model_dir) or _watched(config):
            registry, reloader, watcher = _models(loaded, source, pointer_etag, config, env, sources, init, eager)
        else:  # a plain single-model function: the reloader (and its module) only if an admin event comes
            registry = _registry(loaded, source, config, env)
        runtime = cls(
            config,
            manifest,
            loaded.backend,
            loaded.task,
            init,
            loaded.pool,
            workers,
            registry,
            reloader,
            watcher,
            make_reloader=lambda registry: _reloader(registry, pointer_etag, config, env, sources),
        )
        init["instance_id"] = runtime.instance_id
        if config.tracemalloc_s:  # the operator's leak hunt: from here, so init's own allocations are not in it
            runtime.diagnostics.start_tracing(config.tracemalloc_s)
            init["tracemalloc_s"] = config.tracemalloc_s
        runtime.observe(env, init)
        if emit:
            emit(init)
        return runtime

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

    # -- snapshot support (handler.runtime.snapshot calls these) -----------------------------------------------

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

    def ping(self, payload: dict[str, Any], context: Any, cold: bool, count: int) -> dict[str, Any]:
        remaining = context.get_remaining_time_in_millis() if context is not None else None
        held = hold_ms(payload, self.config.max_hold_ms, remaining)
        if held:
            time.sleep(held / 1000)
        reply = {
            "warm": True,
            "instance_id": self.instance_id,
            "cold": cold,
            "init_ms": self.init_report["total_ms"],
            "invocations": count,
            "held_ms": held,
            "model": self.manifest.key,
        }
        if "correlation_id" in payload:
            reply["correlation_id"] = payload["correlation_id"]
        return reply

    def status(self, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        """Instance facts for `{"warmstart": "status"}` and `GET /status`: never touches the model."""
        leaks = self.diagnostics.tracemalloc(payload or {})
        with self._lock:
            counts = {"total": self.invocations, **self.counts}
        reply: dict[str, Any] = {
            "warmstart": "status",
            "instance_id": self.instance_id,
            "model": self.manifest.key,
            "init_type": self.init_report.get("init_type"),
            "restore": self.init_report.get("restore"),
            "uptime_s": round(time.monotonic() - self.started, 3),
            "invocations": counts,
            **self.diagnostics.facts(),
            "pool": self.pool.stats(),
            "workers": self.workers.stats() if self.workers else None,
            "models": self.registry.describe(),
            "reload": self.reloader.describe(),
            "cache": self.reloader.sources.describe_cache(),  # None unless a model came from S3
        }
        if leaks is not None:
            reply["tracemalloc"] = leaks
        if payload and payload.get("golden") is True:  # the PreTraffic hook's question (warmers.pretraffic)
            reply["golden"] = self.manifest.raw.get("golden")
        return reply

    def health(self) -> dict[str, Any]:
        """What `GET /status` shows whoever reaches the HTTP port: counts and health only. No model sources
        (s3:// URIs, paths), reload errors or pointer; tracing cannot be started from there."""
        with self._lock:
            counts = {"total": self.invocations, **self.counts}
        last = self.reloader.last
        return {
            "warmstart": "status",
            "detail": "basic",
            "instance_id": self.instance_id,
            "model": self.manifest.key,
            "uptime_s": round(time.monotonic() - self.started, 3),
            "invocations": counts,
            "models": self.registry.counts(),
            "reload": {"running": self.reloader.running, "last_ok": None if last is None else last["ok"]},
            "workers": self.workers.stats() if self.workers else None,
            "threads": threading.active_count(),
            "tracemalloc": self.diagnostics.tracing,
            **report.memory_mb(),
        }

    def count(self, kind: str) -> None:
        with self._lock:
            self.counts[kind] += 1

    def infer(self, payload: JSON, inv: logs.Invocation | None = None, task: str | None = None) -> dict[str, Any]:
        """The task, on a worker when several requests may run at once. `task`: what a compatible route needs."""
        self.count("inference")
        args = (payload,) if task is None else (payload, task)  # the native path calls serve as it always has
        workers = self.workers
        reply = workers.call(self.serve, *args) if workers is not None else self.serve(*args)
        if inv is not None:
            _usage(inv, payload, reply)
        return reply

    def serve(self, payload: JSON, task: str | None = None) -> dict[str, Any]:
        """The named (or default) model's task, under a lease: a reload or eviction never pulls the model
        out from under a running request. `task`: the one a compatible route needs the model to have."""
        with self.registry.lease(requested_model(payload)) as model:
            if task is not None and model.task.name != task:
                raise UnsupportedRequestError(f"this route needs a {task} model; {model.key} is {model.task.name}")
            return model.task(payload)

    def find(self, model_id: str) -> str | None:
        return self.registry.find(model_id)

    def handle(self, event: Event, context: Any = None) -> JSON:
        """One invocation: served by `_handle`, measured, logged in its context, and recorded as metrics."""
        started = time.perf_counter()
        with self._lock:
            self.invocations += 1
            count = self.invocations
        self._tick()
        inv = logs.Invocation(
            getattr(context, "aws_request_id", None), trace.lambda_trace_id(), count == 1, self.manifest.key
        )
        logs.enter(inv)
        try:
            if self.tracer is None:
                return self._handle(event, context, count, inv)
            with trace.span(self.tracer, "warmstart.invoke", {"warmstart.model": inv.model}):
                return self._handle(event, context, count, inv)
        except Exception as e:
            if inv.error is None:
                inv.error, inv.fault = type(e).__name__, not isinstance(e, RequestError)
            raise
        finally:
            self.metrics.invocation(inv, (time.perf_counter() - started) * 1000, "restore" in self.init_report)
            logs.enter(None)

    def _handle(self, event: Event, context: Any, count: int, inv: logs.Invocation) -> JSON:
        source = infer_source(event)
        try:
            payload = source.payload(event)
            # Status and admin events carry "warmstart"; only they load the status and reload modules.
            control = isinstance(payload, dict) and "warmstart" in payload
            if not source.http:
                if is_ping(payload):
                    inv.kind = "ping"
                    self.count("ping")
                    return self.ping(payload, context, count == 1, count)
                if control and _status().is_status(payload):
                    inv.kind = "status"
                    self.count("status")
                    return self.status(payload)
                if control and _reload().admin_action(payload):
                    inv.kind = "status"
                    self.count("status")  # an admin event is a status-like request: no model run
                    remaining = context.get_remaining_time_in_millis() if context is not None else None
                    return self.reloader.admin(payload, remaining)
            elif control and _reload().admin_action(payload):
                raise _reload().AdminNotAllowedError("model admin events are accepted from direct invokes only")
            else:  # a Function URL or API Gateway path naming a compatible API (any other path: native)
                path = source.path(event)  # type: ignore[attr-defined]
                if path in LAMBDA_PATHS:
                    route = ROUTES[path]
                    answer = self.infer(route.request(payload, self.find), inv, route.task)
                    return source.respond(event, route.response(answer, payload))
            return source.respond(event, self.infer(payload, inv))
        except Exception as e:
            status, body = self._failure(e, source.name, log_internal=source.http)
            if not source.http:
                # A direct invoke reports the error's class name as errorType (awslambdaric logs it with its
                # stack trace): a request error is raised from here, without our frames behind it.
                if isinstance(e, RequestError):
                    raise e.with_traceback(None) from None
                raise
            return source.respond(event, body, status)

    def handle_body(self, raw: bytes, trace_id: str | None = None, request_id: str | None = None) -> tuple[int, bytes]:
        """A POSTed JSON body → (status, JSON bytes): `handle_http` on the native route."""
        status, body, _ = self.handle_http(raw, trace_id=trace_id, request_id=request_id)
        return status, body

    def handle_http(
        self,
        raw: bytes,
        route: Route = NATIVE,
        content: Kind = "json",
        accept: Kind = "json",
        limit: int = LAMBDA_PAYLOAD_LIMIT,
        trace_id: str | None = None,
        request_id: str | None = None,
    ) -> tuple[int, bytes, str]:
        """A POSTed body → (status, body bytes, media type): the HTTP host's path, run on a worker. The same
        task and the same error contract as an HTTP event through `handle`; a ping-shaped body is an ordinary
        request. `content`/`accept`: the negotiated media kinds (`handler.api.media`); errors are always JSON."""
        started = time.perf_counter()
        with self._lock:
            self.invocations += 1
            count = self.invocations
        inv = logs.Invocation(request_id, trace_id, count == 1, self.manifest.key)
        logs.enter(inv)
        self._tick()
        try:
            payload = self._npy_request(raw) if content == "npy" else decode_body(raw, limit)
            if isinstance(payload, dict) and "warmstart" in payload and _reload().admin_action(payload):
                raise _reload().AdminNotAllowedError("model admin events are accepted from direct invokes only")
            native = route.request(payload, self.find)
            if accept == "npy" and isinstance(native, dict) and isinstance(native.get("inputs"), dict):
                native = {**native, "output_format": "npy"}  # a tensor request: outputs come back as .npy
            self.count("inference")
            answer = self.serve(native, route.task)
            _usage(inv, native, answer)
            if accept == "npy":
                return 200, npy_answer(answer), MEDIA_TYPES["npy"]
            body: JSON = route.response(answer, payload)
            status = 200
        except Exception as e:
            status, body = self._failure(e, "http")
        finally:
            self.metrics.invocation(inv, (time.perf_counter() - started) * 1000, "restore" in self.init_report)
            logs.enter(None)
        return status, json.dumps(body, separators=(",", ":")).encode(), MEDIA_TYPES["json"]

    def _npy_request(self, raw: bytes) -> JSON:
        """An `application/x-npy` body as the default tensor model's one input."""
        inputs = getattr(self.task, "inputs", None)
        if self.task.name != "tensor" or not isinstance(inputs, dict):
            raise UnsupportedMediaTypeError(f"a {self.task.name} model reads JSON only; .npy is for tensor models")
        if len(inputs) != 1:
            raise UnsupportedMediaTypeError(f"this model takes inputs {sorted(inputs)}: send JSON with each named")
        (name,) = inputs
        return {"inputs": {name: raw}}  # parsed by the task, header and size checked before any allocation

    def _failure(self, error: Exception, source: str, log_internal: bool = True) -> tuple[int, JSON]:
        """Count and log a failed request; the HTTP status and error body it maps to. (A direct invoke's
        internal error is logged by the runtime client when it re-raises: `log_internal=False`.)"""
        inv = logs.current()
        if inv is not None:
            inv.error, inv.fault = type(error).__name__, not isinstance(error, RequestError)
        if isinstance(error, RequestError):
            self.count("rejected")
            log.warning("rejected request from %s: %s: %s", source, type(error).__name__, error)
            return error.status, error.to_body()
        self.count("failed")
        if log_internal:
            log.error("internal error", exc_info=error)
        return 500, {"error": {"type": "InternalError", "message": f"{type(error).__name__}: {error}"}}


def _usage(inv: logs.Invocation, payload: JSON, reply: JSON) -> None:
    """Batch size and tokens of a served request, for its metrics (read from what is already there)."""
    inputs = payload.get("inputs") if isinstance(payload, dict) else None
    inv.batch = len(inputs) if isinstance(inputs, list) else 1
    usage = reply.get("usage") if isinstance(reply, dict) else None
    tokens = usage.get("tokens") if isinstance(usage, dict) else None
    inv.tokens = tokens if isinstance(tokens, int) else 0
    model = reply.get("model") if isinstance(reply, dict) else None
    if isinstance(model, str):
        inv.model = model


def coldstart_report(facts: Mapping[str, Any]) -> dict[str, Any]:
    """Which cold-start savings this start used (docs/coldstart.md): BLAS threads pinned before numpy, the
    background prefetch, the pre-optimized model, the tokenizer shortcut; and any deferred module that got
    imported anyway (something pulled it onto the init path)."""
    import handler
    from handler.runtime import prefetch

    deferred = (
        "handler.models.reloader",
        "handler.runtime.status",
        "handler.runtime.workers",
        "handler.runtime.snapshot",
        "hashlib",
        "shutil",
    )
    return {
        "blas_threads": handler.BLAS_THREADS,
        "prefetch": prefetch.report(),
        **facts,
        "deferred_imports_loaded": [m for m in deferred if m in sys.modules],
    }


def _status() -> Any:
    from handler.runtime import status

    return status


def _reload() -> Any:
    from handler.models import reloader as reload

    return reload


def _watched(config: Config) -> bool:
    """Idle unload or an S3 pointer: a timer thread (reload's Watcher) runs from init."""
    return bool(config.idle_unload_s or config.model_pointer)


def _registry(loaded: Loaded, source: str, config: Config, env: Mapping[str, str]) -> Registry:
    pool = loaded.pool  # not `loaded` itself: the closure would keep the first default alive after a swap

    def load(path: Any) -> Loaded:
        return load_model(path, config, env, report.PhaseTimer(), pool=pool)

    return Registry(
        loaded,
        source,
        load=load,
        backend=config.backend,
        budget_mb=config.model_budget_mb,
        idle_unload_s=config.idle_unload_s,
    )


def _reloader(
    registry: Registry, etag: str | None, config: Config, env: Mapping[str, str], sources: Sources | None
) -> Reloader:
    from handler.models.reloader import Reloader, Sources

    sources = sources or Sources(environ=env, backend=config.backend)
    sources.attach(registry.paths)  # what the S3 cache keeps from now on
    return Reloader(registry, config, env, sources, etag)


def _models(
    loaded: Loaded,
    source: str,
    pointer_etag: str | None,
    config: Config,
    env: Mapping[str, str],
    sources: Sources | None,
    init: dict[str, Any],
    eager: bool = True,
) -> tuple[Registry, Reloader, Watcher | None]:
    """The registry around the default model, extra models (WARMSTART_MODELS), the reloader and, when idle
    unload or a pointer is configured, its timer thread. Nothing here runs for a plain single-model init."""
    from handler.models.reloader import Reloader, Sources, Watcher

    sources = sources or Sources(environ=env, backend=config.backend)
    registry = _registry(loaded, source, config, env)
    if config.models:
        t0 = time.perf_counter()
        init["models"] = [registry.add(extra, sources.resolve(extra), load_now=eager) for extra in config.models]
        init["models_ms"] = round((time.perf_counter() - t0) * 1000, 3)
    sources.attach(registry.paths)  # what the S3 cache keeps from now on
    sources.settle()
    reloader = Reloader(registry, config, env, sources, pointer_etag)
    watcher = None
    if Watcher.wanted(config):
        watcher = Watcher(reloader)
        watcher.start()
    return registry, reloader, watcher
