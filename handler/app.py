"""The Lambda entry point: `handler.app.lambda_handler`.

Importing this module IS the init phase (awslambdaric imports it before the first invocation), so the
model is loaded and warmed here, once per instance.
"""

from __future__ import annotations

from typing import Any

from handler.config import snapshot_mode
from handler.runtime import Runtime
from handler.types import JSON, Event

runtime = Runtime.start()
if snapshot_mode() is not None:
    # SnapStart (AWS_LAMBDA_INITIALIZATION_TYPE=snap-start): awslambdaric runs these around the snapshot.
    # Deferred: an on-demand start never imports the hooks (snapshot_restore_py, uuid, random).
    from handler import snapshot

    snapshot.register(runtime)


def lambda_handler(event: Event, context: Any) -> JSON:
    return runtime.handle(event, context)
