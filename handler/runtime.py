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
from typing import Any

from handler import report
from handler.backends import Backend
from handler.config import Config, snapshot_mode
from handler.errors import RequestError
from handler.loader import Loaded, load_model, max_concurrency
from handler.manifest import Manifest
from handler.ping import hold_ms, is_ping
from handler.pool import BufferPool
from handler.registry import Registry, requested_model, weights_bytes
from handler.reload import AdminNotAllowedError, Reloader, Sources, Watcher, admin_action, initial_source
from handler.sources import decode_body, infer_source
from handler.status import Diagnostics, is_status
from handler.tasks import Task
from handler.types import JSON, Event
from handler.workers import WorkerPool, sizing_from_environ

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
    ) -> None:
        self.config = config
        self.init_report = init
        self.pool = pool or getattr(task, "pool", None) or BufferPool()
        if registry is None:
            facts = {"threads": {"intra_op": 0}}
            loaded = Loaded(manifest, backend, task, self.pool, 1, facts, weights_bytes(manifest, backend.name))
            registry = Registry(loaded, str(manifest.root))
        # The models this instance serves, keyed id@version; `manifest`, `backend` and `task` are the default's.
        self.registry = registry
        self.reloader = reloader or Reloader(registry, config, {})
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
        self.diagnostics = Diagnostics()
        self._lock = threading.Lock()

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
        # Where the default model comes from: a directory (no S3, no boto3), or s3:// / the pointer, fetched.
        sources = sources or Sources(environ=env, backend=config.backend)
        source, pointer_etag = initial_source(config, env, sources)
        model_dir = config.model_dir
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
        }
        workers = None
        if "AWS_LAMBDA_MAX_CONCURRENCY" in env:
            workers = WorkerPool(sizing_from_environ(env, max(1, loaded.cpus // slots)), loaded.cpus)
            init["workers"] = {"max_concurrency": slots, **workers.stats()}
        if loaded.warmup_error:
            init["warmup_error"] = loaded.warmup_error
        # A fork template must hold no thread pool: extra models then load on first use, after restore.
        eager = snapshot != "fork"
        registry, reloader, watcher = _models(loaded, source, pointer_etag, config, env, sources, init, eager)
        runtime = cls(
            config, manifest, loaded.backend, loaded.task, init, loaded.pool, workers, registry, reloader, watcher
        )
        init["instance_id"] = runtime.instance_id
        if config.tracemalloc_s:  # the operator's leak hunt: from here, so init's own allocations are not in it
            runtime.diagnostics.start_tracing(config.tracemalloc_s)
            init["tracemalloc_s"] = config.tracemalloc_s
        if emit:
            emit(init)
        return runtime

    @property
    def manifest(self) -> Manifest:
        return self.registry.default.manifest

    @property
    def backend(self) -> Backend:
        return self.registry.default.backend

    @property
    def task(self) -> Task:
        return self.registry.default.task

    # -- snapshot support (handler.snapshot calls these) -----------------------------------------------

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
        s3 = sys.modules.get("handler.s3fetch")
        if s3 is not None and s3.drop_clients():  # only if a model came from S3: never import boto3 for this
            released.append("s3-client")
        if self.watcher is not None:  # idle-unload / S3-pointer thread: stopped, restarted after restore
            released += self.watcher.before_snapshot()
        return released

    def reopen_after_restore(self) -> list[str]:
        reopened = []
        if self.workers is not None:
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

    def infer(self, payload: JSON) -> dict[str, Any]:
        """The task, on a worker when several requests may run at once."""
        self.count("inference")
        if self.workers is not None:
            return self.workers.call(self.serve, payload)
        return self.serve(payload)

    def serve(self, payload: JSON) -> dict[str, Any]:
        """The named (or default) model's task, under a lease: a reload or eviction never pulls the model
        out from under a running request."""
        with self.registry.lease(requested_model(payload)) as model:
            return model.task(payload)

    def handle(self, event: Event, context: Any = None) -> JSON:
        with self._lock:
            self.invocations += 1
            count = self.invocations
        self.diagnostics.tick()
        source = infer_source(event)
        try:
            payload = source.payload(event)
            if not source.http:
                if is_ping(payload):
                    self.count("ping")
                    return self.ping(payload, context, count == 1, count)
                if is_status(payload):
                    self.count("status")
                    return self.status(payload)
                if admin_action(payload):
                    self.count("status")  # an admin event is a status-like request: no model run
                    remaining = context.get_remaining_time_in_millis() if context is not None else None
                    return self.reloader.admin(payload, remaining)
            elif admin_action(payload):
                raise AdminNotAllowedError("model admin events are accepted from direct invokes only")
            return source.respond(event, self.infer(payload))
        except Exception as e:
            status, body = self._failure(e, source.name, log_internal=source.http)
            if not source.http:
                raise  # a direct invoke reports the error's class name as errorType
            return source.respond(event, body, status)

    def handle_body(self, raw: bytes) -> tuple[int, bytes]:
        """A POSTed body → (status, JSON bytes): the HTTP host's path, run on a worker. The same task and the
        same error contract as an HTTP event through `handle`; a ping-shaped body is an ordinary request."""
        with self._lock:
            self.invocations += 1
        self.diagnostics.tick()
        try:
            payload = decode_body(raw)
            if admin_action(payload):
                raise AdminNotAllowedError("model admin events are accepted from direct invokes only")
            self.count("inference")
            body: JSON = self.serve(payload)
            status = 200
        except Exception as e:
            status, body = self._failure(e, "http")
        return status, json.dumps(body, separators=(",", ":")).encode()

    def _failure(self, error: Exception, source: str, log_internal: bool = True) -> tuple[int, JSON]:
        """Count and log a failed request; the HTTP status and error body it maps to. (A direct invoke's
        internal error is logged by the runtime client when it re-raises: `log_internal=False`.)"""
        if isinstance(error, RequestError):
            self.count("rejected")
            log.warning("rejected request from %s: %s: %s", source, type(error).__name__, error)
            return error.status, error.to_body()
        self.count("failed")
        if log_internal:
            log.error("internal error", exc_info=error)
        return 500, {"error": {"type": "InternalError", "message": f"{type(error).__name__}: {error}"}}


def _models(
    loaded: Loaded,
    source: str,
    pointer_etag: str | None,
    config: Config,
    env: Mapping[str, str],
    sources: Sources,
    init: dict[str, Any],
    eager: bool = True,
) -> tuple[Registry, Reloader, Watcher | None]:
    """The registry around the default model, extra models (WARMSTART_MODELS), the reloader and, when idle
    unload or a pointer is configured, its timer thread. Nothing here runs for a plain single-model init."""

    pool = loaded.pool  # not `loaded` itself: the closure would keep the first default alive after a swap

    def load(path: Any) -> Loaded:
        return load_model(path, config, env, report.PhaseTimer(), pool=pool)

    registry = Registry(
        loaded,
        source,
        load=load,
        backend=config.backend,
        budget_mb=config.model_budget_mb,
        idle_unload_s=config.idle_unload_s,
    )
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
