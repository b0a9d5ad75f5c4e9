"""Whether this process serves without numpy for now: a Lambda start of a plain embedding model leaves numpy out.

numpy's import is ~1/3 of such a start (callgrind: 305 M of ~830 M instructions to the first answer; 48 ms of a
~145 ms start) and a direct invoke of a model that pools and normalizes in its graph needs none of it: token ids go
to ONNX Runtime's C API as `array('q')` buffers, the float32 output comes back as bytes and is written as JSON by
`handler.core.f32`, byte for byte what the numpy path writes. So `handler.app` starts lean (`begin`) where the
start qualifies, the embedding task takes its numpy-free path while `lean()` holds, and once the first answer is
written numpy is imported on a thread of its own (`load_later`, from `Runtime.lambda_reply`); when that import has
finished (a flag, not `sys.modules`, which holds a half-imported module meanwhile) `lean()` is False and every
later request takes the numpy path, whose warm calls are faster (orjson writes 384 float32s in 0.0076 ms, `f32`
in ~0.55). A request the numpy-free path does not serve (`dimensions`, base64, a compatible API's route) calls
`need()`: numpy is imported there, on the calling thread, and the process is no longer lean. Stdlib only.
"""

from __future__ import annotations

import _thread
import threading

_lean = False
_refused = False  # refuse(): never lean
_loading = False  # the background import was started
_loaded = threading.Event()  # ... and has finished
_lock = threading.Lock()


def lean() -> bool:
    """True while this process serves without numpy (from `begin` until numpy's import has finished)."""
    return _lean


def begin() -> None:
    """This start leaves numpy out (handler.app, before init, where handler.runtime.prefetch.lean_start says so)."""
    global _lean
    _lean = True


def refuse() -> None:
    """No start of this process is lean (the HTTP host: it serves batches and the compatible APIs through numpy,
    whatever the environment says, a Lambda runtime API included): prefetch.lean_start reads it."""
    global _refused
    _refused = True


def refused() -> bool:
    """Whether `refuse` was called."""
    return _refused


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
        pass
    else:
        _lean = False
    finally:
        _loaded.set()


def load_later() -> bool:
    """numpy imported on a thread of its own, once (False: not lean, or already started); `lean()` turns False when
    it is done. Called once a lean answer is made: the caller returns it at once. A bare thread (`_thread`), not
    `threading.Thread`, whose `start()` waits until the new thread runs, and the new thread, importing, held the
    GIL: 2-14 ms before the answer could go (measured); this one asks for the GIL only while the caller posts."""
    global _loading
    with _lock:
        if not _lean or _loading:
            return False
        _loading = True
    _thread.start_new_thread(_load, ())
    return True


def wait(timeout: float | None = None) -> bool:
    """Whether a background import that was started has finished (waits up to `timeout`; tests, benches)."""
    return _loaded.wait(timeout) if _loading else False


def reset() -> None:
    """Back to the state of a process that never started lean (tests)."""
    global _lean, _loading, _refused
    wait()
    with _lock:
        _lean, _loading, _refused = False, False, False
        _loaded.clear()
