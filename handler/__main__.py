"""One entrypoint, `python -m handler`: Lambda mode when `AWS_LAMBDA_RUNTIME_API` is set (the process becomes
`python -m awslambdaric handler.app.lambda_handler`), the HTTP host on `$PORT` (default 8080) otherwise."""

from __future__ import annotations

import os
import sys

HANDLER = "handler.app.lambda_handler"


def main(argv: list[str] | None = None) -> None:
    if os.environ.get("AWS_LAMBDA_RUNTIME_API"):
        # exec, not import: the runtime client owns the process exactly as with `python -m awslambdaric`.
        os.execv(sys.executable, [sys.executable, "-m", "awslambdaric", HANDLER])
        return  # only reached where execv is stubbed (tests)
    port = int(os.environ.get("PORT", "8080"))
    # Deferred: uvicorn and starlette are the HTTP host's dependencies, never loaded in Lambda mode.
    import uvicorn

    from handler.http import create_app

    # One process, one event loop: the runtime's worker pool is the concurrency; more processes would each
    # load the model and split the CPUs between sessions.
    uvicorn.run(
        create_app(),
        # All interfaces by default, on purpose: in a container (SageMaker, Cloud Run, Knative) requests arrive
        # on the container's own interface, never on its loopback. HOST=127.0.0.1 keeps it to this machine.
        host=os.environ.get("HOST", "0.0.0.0"),
        port=port,
        workers=1,
        access_log=False,
        log_level=os.environ.get("WARMSTART_LOG_LEVEL", "warning"),
        timeout_graceful_shutdown=10,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
