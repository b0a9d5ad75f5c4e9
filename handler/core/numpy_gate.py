"""Whether this process serves without numpy for now: a Lambda start of a plain embedding model leaves numpy out.

numpy's import is ~1/3 of such a start (callgrind: 305 M of ~830 M instructions to the first answer; 48 ms of a
~145 ms start) and a direct invoke of a model that pools and normalizes in its graph needs none of it: token ids go
to ONNX Runtime's C API as `array('q')` buffers, the float32 output comes back as bytes and is written as JSON by
`handler.core.f32`, byte for byte what the numpy path writes. So `handler.app` starts lean (`begin`) where the
start qualifies, the embedding task takes its numpy-free path while `lean()` holds, and once the first answer is
made numpy is imported on a thread of its own (`load_later`); when that import has finished (a flag, not
`sys.modules`, which holds a half-imported module meanwhile) `lean()` is False and every later request takes the
numpy path, whose warm calls are faster (orjson writes float32 arrays ~100x faster than `f32`). A request the
numpy-free path does not serve (`dimensions`, base64, a compatible API's route) calls `need()`: numpy is imported
there, on the calling thread, and the process is no longer lean. Stdlib only: read before anything else.
"""

from __future__ import annotations

import threading

_lean = False
_loading: threading.Thread | None = None
_lock = threading.Lock()


def lean() -> bool:
    """True while this process serves without numpy (from `begin` until numpy's import has finished)."""
    return _lean


def begin() -> None:
    """This start leaves numpy out (handler.app, before init)."""
    global _lean
    _lean = True


def need() -> None:
    """numpy, now, on this thread (waits for a background import under way: the import lock); not lean after."""
    global _lean
    if _lean:
        import numpy  # noqa: F401  (deferred: the point of this module)

        _lean = False


def _load() -> None:
    global _lean
    try:
        import numpy  # noqa: F401  (deferred: the point of this module)
    except BaseException:  # stays lean: the numpy-free path keeps serving; a request needing numpy reports it
        return
    _lean = False


def load_later() -> threading.Thread | None:
    """numpy imported on a daemon thread, once (None: not lean, or already started); `lean()` turns False when
    it is done. Called after a lean answer is made, so the import does not run before it."""
    global _loading
    with _lock:
        if not _lean or _loading is not None:
            return None
        _loading = threading.Thread(target=_load, name="warmstart-numpy", daemon=True)
        _loading.start()
        return _loading


def reset() -> None:
    """Back to the state of a process that never started lean (tests)."""
    global _lean, _loading
    with _lock:
        if _loading is not None:
            _loading.join()
        _lean, _loading = False, None
