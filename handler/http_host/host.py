"""What one HTTP host process owns: the runtime, its worker pool, the drain and `/metrics`' registry."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

from handler.core.cpu import cpu_budget
from handler.http_host.budget import BodyBudget
from handler.http_host.drain import Drain
from handler.http_host.settings import HostSettings
from handler.http_host.standby import Standby
from handler.observability.prometheus import Prometheus
from handler.runtime.invocation import Runtime
from handler.runtime.workers import WorkerPool, sizing_from_environ


class Host:
    """The runtime and its worker pool, both made once by `start()` (at startup, or on first need).

    `start` builds the runtime: the entry point passes one that imports `handler.app`, so the init phase runs
    exactly as on Lambda and once per process; tests pass a prepared runtime.
    """

    def __init__(
        self,
        start: Callable[[], Runtime],
        workers: WorkerPool | None = None,
        settings: HostSettings | None = None,
    ) -> None:
        self._make_runtime = start
        self._runtime: Runtime | None = None
        self._workers = workers
        self.settings = settings or HostSettings()
        self.drain = Drain(self.settings.drain_s)
        self.bodies = BodyBudget(self.settings.body_budget)
        self.prometheus: Prometheus | None = None  # GET /metrics; made with the runtime
        self.init_error: BaseException | None = None  # why init failed, for the startup failure's plain line
        self.standby: Standby | None = None  # WARMSTART_STANDBY_AFTER_S: made with the runtime, run by the app

    def start(self) -> Runtime:
        """The runtime, its worker pool and the Prometheus registry: made on the first call, then the same."""
        if self._runtime is None:
            if self._workers is None:
                cpus = cpu_budget(os.environ).cpus
                self._workers = WorkerPool(sizing_from_environ(os.environ, cpus), cpus, name="warmstart-http")
            try:
                runtime = self._make_runtime()
                self.standby = Standby.for_backend(runtime.backend, self.settings.standby_after_s)
            except BaseException as e:
                self.init_error = e
                raise
            # The pool was sized before the model loaded: it groups requests by the model's derived batch tokens.
            tokens = runtime.init_report.get("limits", {}).get("batch_tokens")
            if tokens:
                self._workers.sizing = replace(self._workers.sizing, batch_tokens=tokens)
            # An engine whose own thread runs every stream's steps: a worker per stream it takes, each only waiting.
            streams = getattr(runtime.backend, "concurrent_streams", 0)
            if isinstance(streams, int) and streams > 0:
                self._workers.reserve(streams + self._workers.sizing.max_workers)
            runtime.workers = self._workers
            self.prometheus = Prometheus(runtime.backend.name)
            self.prometheus.init_report(runtime.init_report)
            runtime.metrics = self.prometheus
            self._runtime = runtime
        return self._runtime

    def models(self) -> list[str]:
        """The keys (`id@version`) of the models this instance serves, the default first; [] before init."""
        if self._runtime is None:
            return []
        return [m["key"] for m in self._runtime.model_list()["data"]]

    def default_model(self) -> str | None:
        return None if self._runtime is None else self._runtime.manifest.key

    @property
    def runtime(self) -> Runtime:
        return self.start()

    @property
    def workers(self) -> WorkerPool:
        self.start()
        assert self._workers is not None
        return self._workers

    def close(self) -> None:
        if self._workers is not None:
            self._workers.shutdown()
