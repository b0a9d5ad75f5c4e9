"""The HTTP host's process: settings from the host it runs on, uvicorn, and SIGTERM wired to the drain.

Only `python -m handler` in HTTP mode imports this module (uvicorn is never on Lambda's import chain).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from types import FrameType

import uvicorn

from handler.http_host.drain import Drain
from handler.http_host.host import Host
from handler.http_host.routes import create_app
from handler.http_host.settings import HostSettings
from handler.runtime.invocation import Runtime


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with the drain started the moment a signal arrives (uvicorn itself only notices
    at its next tick, up to 0.1 s later, and then closes the listening socket and waits for connections)."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.drain.begin_threadsafe()
        super().handle_exit(sig, frame)


def server(
    start: Callable[[], Runtime], environ: Mapping[str, str] | None = None, sagemaker: bool = False
) -> DrainingServer:
    """uvicorn serving the host's app; `start` builds the runtime (the entry point's: importing handler.app)."""
    env = os.environ if environ is None else environ
    settings = HostSettings.from_environ(env, serve=sagemaker)
    host = Host(start, settings=settings)
    config = uvicorn.Config(
        create_app(host),
        # All interfaces by default, on purpose: in a container (SageMaker, Cloud Run, Knative) requests arrive
        # on the container's own interface, never on its loopback. HOST=127.0.0.1 keeps it to this machine.
        host=env.get("HOST", "0.0.0.0"),
        port=settings.port,
        # One process, one event loop: the runtime's worker pool is the concurrency; more processes would
        # each load the model and split the CPUs between sessions.
        workers=1,
        access_log=False,
        log_level=env.get("WARMSTART_LOG_LEVEL", "warning"),
        lifespan="on",
        # A backstop only: the drain answers every request by drain_s, so uvicorn never has to cancel one.
        timeout_graceful_shutdown=settings.drain_s + 1,
    )
    return DrainingServer(config, host.drain)


def serve_http(start: Callable[[], Runtime], environ: Mapping[str, str] | None = None, sagemaker: bool = False) -> None:
    server(start, environ, sagemaker).run()
