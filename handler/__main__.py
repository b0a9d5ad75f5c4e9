"""One entrypoint for every host, `python -m handler [serve | MODULE.FUNCTION]`:

- `AWS_LAMBDA_RUNTIME_API` set (Lambda, or its Runtime Interface Emulator): the runtime client runs
  `MODULE.FUNCTION` (default `handler.app.lambda_handler`; an image's CMD names it), in this process: our own
  loop when the model's task streams (it can post a response stream), else awslambdaric
  (`WARMSTART_LAMBDA_LOOP` = auto | awslambdaric | streaming);
- `serve` (SageMaker starts containers with it), or no runtime API: the HTTP host (`handler.http_host.server`).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from handler.runtime.invocation import Runtime

HANDLER = "handler.app.lambda_handler"
USAGE = "usage: python -m handler [serve | MODULE.FUNCTION | --help | --version]"
HELP = f"""{USAGE}

Serve a packed model on whichever host started this process:
  AWS_LAMBDA_RUNTIME_API set (Lambda, its emulator): the runtime client runs MODULE.FUNCTION
                          (default {HANDLER}), in this process; a streaming model's answers
                          stream (WARMSTART_LAMBDA_LOOP=auto|awslambdaric|streaming)
  serve, or no runtime API: the HTTP host on $PORT (default 8080): POST /invocations, /v1/embeddings,
                          /embed, /rerank, /predict; GET /ping, /health, /info, /metrics
Exit status (HTTP host): SIGTERM's own (143) after its drain; 130 on Ctrl-C (SIGINT), after the same
                          drain, with one line; 3 when it cannot start (stderr's first line says why and the fix).
Settings are environment variables (WARMSTART_MODEL, WARMSTART_BACKEND, ...): docs/configuration.md."""


def lambda_runtime() -> Runtime:
    """The process's one runtime: importing `handler.app` is the init phase, exactly as on Lambda."""
    from handler import app  # deferred: the import runs init (seconds), when the host starts

    return app.runtime


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    # By hand, not argparse: this runs on every cold start of the image, and argparse is ~6 ms of imports.
    if args[:1] in (["-h"], ["--help"]):
        print(HELP)
        return
    if args[:1] == ["--version"]:
        from handler.core.version import VERSION

        print(f"warmstart {VERSION}")
        return
    serve = args[:1] == ["serve"]
    if len(args) > 1 or (args and not serve and "." not in args[0]):
        # SageMaker runs `train` for training jobs: an inference image has no answer for that.
        sys.exit(f"{USAGE}\n  got {' '.join(args)!r}")
    if os.environ.get("AWS_LAMBDA_RUNTIME_API") and not serve:
        # In this process, not exec'd: a second interpreter start would add ~30 ms to every cold start of the
        # image on Lambda. The runtime client then owns the process exactly as `python -m awslambdaric` does;
        # or, for a model whose task streams, our own loop, which can stream (handler.runtime.lambda_loop).
        from handler.core.errors import ConfigError
        from handler.runtime import lambda_loop

        handler = args[0] if args else HANDLER
        try:
            loop = lambda_loop.choose()
        except ConfigError as e:
            sys.exit(f"warmstart: {e}")
        if loop == "awslambdaric":
            from awslambdaric.__main__ import main as runtime_client

            runtime_client(["awslambdaric", handler])
            return
        lambda_loop.run(handler, loop)
        return
    # Deferred: uvicorn and starlette are the HTTP host's dependencies, never loaded in Lambda mode.
    from handler.http_host.server import serve_http

    serve_http(lambda_runtime, sagemaker=serve)


if __name__ == "__main__":
    main()
