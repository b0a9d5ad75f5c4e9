"""One entrypoint for every host, `python -m handler [serve | MODULE.FUNCTION]`:

- `AWS_LAMBDA_RUNTIME_API` set (Lambda, or its Runtime Interface Emulator): the process becomes
  `python -m awslambdaric MODULE.FUNCTION` (default `handler.app.lambda_handler`; an image's CMD names it);
- `serve` (SageMaker starts containers with it), or no runtime API: the HTTP host (`handler.serve`).
"""

from __future__ import annotations

import os
import sys

HANDLER = "handler.app.lambda_handler"
USAGE = "usage: python -m handler [serve | MODULE.FUNCTION]"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    serve = args[:1] == ["serve"]
    if len(args) > 1 or (args and not serve and "." not in args[0]):
        # SageMaker runs `train` for training jobs: an inference image has no answer for that.
        sys.exit(f"{USAGE}\n  got {' '.join(args)!r}")
    if os.environ.get("AWS_LAMBDA_RUNTIME_API") and not serve:
        # exec, not import: the runtime client owns the process exactly as with `python -m awslambdaric`.
        os.execv(sys.executable, [sys.executable, "-m", "awslambdaric", args[0] if args else HANDLER])
        return  # only reached where execv is stubbed (tests)
    # Deferred: uvicorn and starlette are the HTTP host's dependencies, never loaded in Lambda mode.
    from handler.serve import serve_http

    serve_http(sagemaker=serve)


if __name__ == "__main__":
    main()
