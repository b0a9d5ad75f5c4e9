"""The Lambda entry point: `handler.app.lambda_handler`.

Importing this module IS the init phase (awslambdaric imports it before the first invocation), so the
model is loaded and warmed here, once per instance.
"""

from __future__ import annotations

from typing import Any

from handler.runtime import prefetch

# First, before the imports below take the CPU: the kernel reads the libraries and model files meanwhile.
prefetch.start()

from handler.core.config import snapshot_mode  # noqa: E402 (after the prefetch starts, on purpose)
from handler.core.types import Event  # noqa: E402
from handler.runtime.invocation import Runtime  # noqa: E402

runtime = Runtime.start()
if snapshot_mode() is not None:
    # SnapStart (AWS_LAMBDA_INITIALIZATION_TYPE=snap-start): awslambdaric runs these around the snapshot.
    # Deferred: an on-demand start never imports the hooks (snapshot_restore_py, uuid, random).
    from handler.runtime import snapshot

    snapshot.register(runtime)


def lambda_handler(event: Event, context: Any) -> bytes:
    # JSON bytes, which awslambdaric posts as they are: the answer is encoded once, here (not again by it).
    return runtime.lambda_reply(event, context)
