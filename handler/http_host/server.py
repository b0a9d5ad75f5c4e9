"""The HTTP host's process: settings from the host it runs on, uvicorn, and SIGTERM wired to the drain.

Only `python -m handler` in HTTP mode imports this module (uvicorn is never on Lambda's import chain).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

import uvicorn

from handler.core import numpy_gate
from handler.core.cpu import cpu_budget
from handler.core.errors import WarmstartError
from handler.http_host.access import AccessLog, PlainStartupFailure
from handler.http_host.drain import CloseWhileDraining, Drain
from handler.http_host.host import Host
from handler.http_host.protocol import HostProtocol
from handler.http_host.routes import create_app
from handler.http_host.settings import HostSettings, accept_backlog
from handler.models import loader
from handler.observability import logs
from handler.runtime.invocation import Runtime
from handler.runtime.workers import WorkerPool, sizing_from_environ

UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with the drain started the moment a signal arrives (uvicorn itself only notices
    at its next tick, up to 0.1 s later, and then closes the listening socket and waits for connections).

    The listening socket closes as the drain begins, in the same turn of the loop: before any answer says
    `Connection: close`, so no client reconnects into a backlog that closing would reset. Connections the
    kernel already completed are accepted first and answered (503)."""

    def __init__(self, config: uvicorn.Config, drain: Drain, host: Host | None = None) -> None:
        super().__init__(config)
        self.drain = drain
        self.host = host
        self.accepting: set[asyncio.Task[object]] = set()
        self.sagemaker = False  # started as `serve` (SageMaker's command): said in the startup line
        drain.on_begin.append(self.stop_listening)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.host is not None:
            listening(self)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.drain.begin_threadsafe()
        super().handle_exit(sig, frame)

    def stop_listening(self) -> None:
        loop = asyncio.get_running_loop()
        for server in getattr(self, "servers", []):
            for listener in server.sockets:
                # A duplicate of the listening socket (the same queue): what the kernel accepted, we accept.
                with socket.socket(fileno=os.dup(listener.fileno())) as queue:
                    queue.setblocking(False)
                    while True:
                        try:
                            conn, _ = queue.accept()
                        except OSError:  # BlockingIOError: the queue is empty; or out of files
                            break
                        task = loop.create_task(loop.connect_accepted_socket(self.protocol, conn))
                        self.accepting.add(task)
                        task.add_done_callback(self.accepting.discard)
            server.close()

    def protocol(self) -> asyncio.Protocol:
        return self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )


def route_uvicorn_logs(level: int) -> None:
    """uvicorn's own lines (start, stop, protocol warnings) as our JSON lines, at the function's level."""
    handler = logs.json_handler()
    for name in UVICORN_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.propagate = False
        logger.setLevel(level)


def server(
    start: Callable[[], Runtime], environ: Mapping[str, str] | None = None, sagemaker: bool = False
) -> DrainingServer:
    """uvicorn serving the host's app; `start` builds the runtime (the entry point's: importing handler.app)."""
    env = os.environ if environ is None else environ
    numpy_gate.refuse()  # before init (handler.app's import): no start of the host is lean (numpy_gate)
    settings = HostSettings.from_environ(env, serve=sagemaker)
    cpus = cpu_budget(env).cpus
    workers = WorkerPool(sizing_from_environ(env, cpus), cpus, name="warmstart-http")
    # Before init sizes the session's threads (init is `start`, handler.app's import: it takes no arguments):
    # each worker's run gets its share of the CPUs, so workers x intra-op threads stay within the quota.
    loader.host_runs = loader.HostRuns(workers.sizing.max_workers, pool_plan(workers))
    host = Host(start, workers, settings)
    # uvicorn's lines at WARMSTART_LOG_LEVEL (warnings by default: start and stop are INFO).
    level = logs.LEVELS[logs.threshold(env)] if env.get("WARMSTART_LOG_LEVEL", "").strip() else logging.WARNING
    route_uvicorn_logs(level)
    config = uvicorn.Config(
        PlainStartupFailure(
            AccessLog(CloseWhileDraining(create_app(host), host.drain), host.default_model), lambda: host.init_error
        ),
        # All interfaces by default, on purpose: in a container (SageMaker, Cloud Run, Knative) requests arrive
        # on the container's own interface, never on its loopback. HOST=127.0.0.1 keeps it to this machine.
        host=env.get("HOST", "0.0.0.0"),
        port=settings.port,
        # One process, one event loop: the runtime's worker pool is the concurrency; more processes would
        # each load the model and split the CPUs between sessions.
        workers=1,
        # h11, with JSON for protocol errors, header timeouts, a connection cap and the drain's idle connections.
        http=HostProtocol.bind(settings, host.drain),
        backlog=accept_backlog(settings.max_connections),
        access_log=False,
        log_config=None,  # uvicorn's loggers are ours (route_uvicorn_logs), not its dictConfig's
        log_level=None,
        lifespan="on",
        # A backstop only: the drain answers every request by drain_s, so uvicorn never has to cancel one.
        timeout_graceful_shutdown=settings.drain_s + 1,
    )
    uvicorn_server = DrainingServer(config, host.drain, host)
    uvicorn_server.sagemaker = sagemaker
    return uvicorn_server


def listening(server: DrainingServer) -> None:
    """The startup line: where the host listens, what it serves, which host kind (a JSON log record at INFO)."""
    assert server.host is not None
    ports = [s.getsockname()[:2] for srv in getattr(server, "servers", []) for s in srv.sockets]
    address, port = ports[0] if ports else (server.config.host, server.config.port)
    models = server.host.models()
    kind = "sagemaker (serve)" if server.sagemaker else "http"
    fields = {"address": address, "port": port, "models": models, "host": kind}
    message = f"listening on http://{address}:{port}: {', '.join(models) or 'no model'} (host {kind}); Ctrl-C stops"
    logging.getLogger(logs.LOGGER).info(message, extra={"fields": fields})


# Exit codes of `python -m handler` in HTTP mode (its --help lists them).
EXIT_STARTUP_FAILURE = 3  # uvicorn's: init failed (the first stderr line says why and what fixes it)
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT): requests in flight were answered first (the drain), as for SIGTERM


def serve_http(start: Callable[[], Runtime], environ: Mapping[str, str] | None = None, sagemaker: bool = False) -> None:
    try:
        host_server = server(start, environ, sagemaker)
    except WarmstartError as e:  # a setting out of range (PORT=0): the sentence names it
        print(f"warmstart: the HTTP host cannot start: {e}", file=sys.stderr, flush=True)
        sys.exit(EXIT_STARTUP_FAILURE)
    try:
        host_server.run()
    except KeyboardInterrupt:
        # uvicorn raises the SIGINT again once its shutdown (our drain) is done, so that the process "dies of
        # it": asyncio then answers with a CancelledError and KeyboardInterrupt traceback. Ctrl-C is no error.
        stopped_by_ctrl_c()
    except SystemExit:
        error = host_server.host.init_error if host_server.host is not None else None
        if isinstance(error, WarmstartError):  # expected (no model, unpacked, configured twice): its sentence
            print(f"warmstart: the HTTP host cannot start: {error}", file=sys.stderr, flush=True)
            sys.exit(EXIT_STARTUP_FAILURE)
        raise
    # asyncio's own SIGINT handler can take uvicorn's re-raised signal as a cancel of a task that has just
    # finished, and run() then returns (seen once under load: exit 0, no line): the captured signal decides.
    if signal.SIGINT in getattr(host_server, "_captured_signals", ()):
        stopped_by_ctrl_c()


def stopped_by_ctrl_c() -> None:
    print("warmstart: stopped (Ctrl-C); requests in flight were answered first", file=sys.stderr, flush=True)
    sys.exit(EXIT_INTERRUPTED)


def pool_plan(workers: WorkerPool) -> dict[str, Any]:
    """The host's choices for the init report's `http_workers` (init adds the threads they were sized with)."""
    sizing = workers.sizing
    return {
        "max_workers": sizing.max_workers,
        "min_workers": sizing.min_workers,
        "cpus": workers.cpus,
        "max_batch": sizing.max_batch,
        "batch_tokens": sizing.batch_tokens,
        "batch_wait_ms": round(sizing.batch_wait_s * 1000, 3),
        "max_queue": sizing.max_queue,
        # A closed loop of this many clients never finds the queue full, and none waits past one batch.
        "no_503_up_to": min(sizing.max_queue, sizing.max_workers * sizing.max_batch),
        "why": "workers: one per CPU unless WARMSTART_WORKERS_MAX (queued requests share a worker's model run, "
        "so more workers would only split the CPUs); intra-op threads: the CPUs' share per worker",
    }
