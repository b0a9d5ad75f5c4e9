"""The Lambda entry point: `handler.app.lambda_handler`.

Importing this module IS the init phase (awslambdaric imports it before the first invocation), so the
model is loaded and warmed here, once per instance.
"""

from __future__ import annotations

import gc
from typing import Any

# The cyclic GC paused while init runs: the imports and the model load allocate hundreds of thousands of
# objects and free few, so each collection they would set off walks a growing heap to find almost nothing.
# What init made is then frozen (later collections skip it) and the GC is back on before the first request.
_gc_was_on = gc.isenabled()
gc.disable()

# The init chain's modules from one file of compiled code written at build time (stale entries are skipped):
# one read instead of ~45 .pyc lookups, ~10 system calls each. Taken off sys.meta_path when init ends.
from handler.runtime import codebundle  # noqa: E402

codebundle.install()

from handler.runtime import prefetch  # noqa: E402

# First, before the imports below take the CPU: the kernel reads the libraries and model files meanwhile.
prefetch.start()

# numpy here, from this module's frame, not from where the chain below first needs it (eight imports deeper):
# CPython 3.11 keeps frames in 16 KiB chunks and frees a chunk as soon as the frame at its base returns, so an
# import tree that runs across a chunk's end maps and unmaps it for each call there. From that depth numpy's
# own imports did it ~650 times (a mmap, a munmap and a page fault each: kernel time no instruction count
# shows); from here, the depth the tuned floor imports it at, none. Every start whose backend computes with
# numpy imports it (backends.pool, the tasks' arrays); a genai start does not (its spec's `numpy`), and a lean start
# (an embedding model on the C API, no warm-up, no snapshot: prefetch.lean_start) imports it once its first answer is
# written (Runtime.lambda_reply), on a thread of its own (handler.core.numpy_gate), from that thread's base frame.
if prefetch.numpy_at_start():
    import numpy  # noqa: F401
elif prefetch.lean_start():
    from handler.core import numpy_gate

    numpy_gate.begin()

from handler.core.config import snapshot_mode  # noqa: E402 (after the prefetch starts, on purpose)
from handler.core.types import Event  # noqa: E402
from handler.runtime.invocation import Runtime  # noqa: E402

try:
    runtime = Runtime.start()
    if snapshot_mode() is not None:
        # SnapStart (AWS_LAMBDA_INITIALIZATION_TYPE=snap-start): awslambdaric runs these around the snapshot.
        # Deferred: an on-demand start never imports the hooks (snapshot_restore_py, uuid, random).
        from handler.runtime import snapshot

        snapshot.register(runtime)
    gc.freeze()
finally:
    codebundle.uninstall()
    if _gc_was_on:  # a failed init too: whatever runs next in this process gets its GC back
        gc.enable()


def lambda_handler(event: Event, context: Any) -> bytes:
    # JSON bytes, which awslambdaric posts as they are: the answer is encoded once, here (not again by it).
    return runtime.lambda_reply(event, context)
