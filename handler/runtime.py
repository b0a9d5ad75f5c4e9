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
from handler.backends import Backend, BackendSettings, create_backend
from handler.config import Config
from handler.cpu import cpu_budget
from handler.device import probe_cuda
from handler.errors import RequestError
from handler.manifest import Manifest, load_manifest, verify_sha256
from handler.ping import hold_ms, is_ping
from handler.pool import BufferPool
from handler.snapshot import snapshot_mode
from handler.sources import decode_body, infer_source
from handler.status import Diagnostics, is_status
from handler.tasks import TASKS, Task
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
    ) -> None:
        self.config = config
        self.manifest = manifest
        self.backend = backend
        self.task = task
        self.init_report = init
        self.pool = pool or getattr(task, "pool", None) or BufferPool()
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
    ) -> Runtime:
        env = os.environ if environ is None else environ
        config = config or Config.from_environ(env)
        timer = report.PhaseTimer()
        age_at_start = report.process_age_ms()
        with timer.phase("manifest"):
            manifest = load_manifest(config.model_dir)
        name = config.backend or manifest.default_backend
        with timer.phase("imports"):
            backend = create_backend(name, manifest)
        files = manifest.files_for(name)
        if config.verify_sha256:
            with timer.phase("sha256"):
                verify_sha256(manifest, files)
        budget = cpu_budget(env)
        # Lambda Managed Instances: awslambdaric forks one process per concurrency slot, each with its own
        # session; their intra-op threads share the CPUs, so each gets its share instead of all of them.
        slots = _max_concurrency(env)
        threads = config.threads or max(1, budget.cpus // slots)
        bound_by = budget.source
        snapshot = snapshot_mode(env)
        if snapshot == "fork":
            # fork() copies only the calling thread: the template holds no thread pool (one intra-op thread,
            # no tokenizer pool); torch's threads are created after restore, ORT's session keeps one.
            threads, bound_by = 1, "fork-snapshot"
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        on_lambda = "AWS_LAMBDA_FUNCTION_NAME" in env
        cuda = probe_cuda(config.device)
        settings = BackendSettings(
            threads=threads,
            cuda=cuda,
            spin=not on_lambda and threads > 1,
            prepack=env.get("WARMSTART_ORT_PREPACK", "1") != "0",
        )
        backend.initialize(manifest, settings, timer)
        with timer.phase("device"):
            device = backend.warm_device()
        with timer.phase("task"):
            # Pinned host buffers only where a device will copy from them.
            pool = BufferPool.for_device(cuda.usable)
            task: Task = TASKS[manifest.task](manifest, backend, config, pool)
        warmup_error = None
        if config.warmup:
            with timer.phase("warmup"):
                try:
                    task.warmup()
                except Exception as e:
                    if manifest.task == "embedding":
                        raise
                    # A generic model may reject all-zero inputs; that is not a reason to refuse to serve.
                    warmup_error = f"{type(e).__name__}: {e}"
        init = {
            "warmstart": "init",
            "model": manifest.key,
            "task": manifest.task,
            "init_type": env.get("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand"),
            "snapshot": snapshot,
            **backend.describe(),
            "threads": {"intra_op": threads, "cpus": budget.cpus, "bound_by": bound_by, **budget.detail},
            "device_warmup": device,
            "phases_ms": dict(timer.phases),
            "total_ms": timer.total_ms(),
            "process_age_at_init_ms": age_at_start,
            **report.memory_mb(),
            "weights_mb": round(sum(manifest.files[n].size for n in files) / 2**20, 1),
        }
        workers = None
        if "AWS_LAMBDA_MAX_CONCURRENCY" in env:
            workers = WorkerPool(sizing_from_environ(env, max(1, budget.cpus // slots)), budget.cpus)
            init["workers"] = {"max_concurrency": slots, **workers.stats()}
        if warmup_error:
            init["warmup_error"] = warmup_error
        runtime = cls(config, manifest, backend, task, init, pool, workers)
        init["instance_id"] = runtime.instance_id
        if emit:
            emit(init)
        return runtime

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
        if s3 is not None:  # only if a model came from S3: never import boto3 for this
            s3.drop_clients()
            released.append("s3-client")
        return released

    def reopen_after_restore(self) -> list[str]:
        reopened = []
        if self.workers is not None:
            self.workers = WorkerPool(self.workers.sizing, self.workers.cpus)
            reopened.append("workers")
        if "handler.s3fetch" in sys.modules:
            reopened.append("s3-client (on next use)")
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
        }
        if leaks is not None:
            reply["tracemalloc"] = leaks
        return reply

    def count(self, kind: str) -> None:
        with self._lock:
            self.counts[kind] += 1

    def infer(self, payload: JSON) -> dict[str, Any]:
        """The task, on a worker when several requests may run at once."""
        self.count("inference")
        if self.workers is not None:
            return self.workers.call(self.task, payload)
        return self.task(payload)

    def handle(self, event: Event, context: Any = None) -> JSON:
        with self._lock:
            self.invocations += 1
            count = self.invocations
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
        try:
            payload = decode_body(raw)
            self.count("inference")
            body: JSON = self.task(payload)
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


def _max_concurrency(env: Mapping[str, str]) -> int:
    raw = env.get("AWS_LAMBDA_MAX_CONCURRENCY", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1
