"""The models' timer thread (`warmstart-models`): idle unload and the S3 pointer check, off the request path.

On Lambda the process is frozen between invocations, so the thread advances only while some invocation runs.
"""

from __future__ import annotations

import logging
import threading
import time

from handler.core.config import Config
from handler.models.registry import release_memory
from handler.models.reloader import Reloader

log = logging.getLogger("warmstart")


class Watcher:
    """The timer thread: idle unload and the pointer check. Started only when either is configured.

    For SnapStart: `before_snapshot()` stops it (a snapshot must not capture a thread in the middle of an
    S3 read) and `after_restore()` starts it again with a pointer check at once: a snapshot may be restored
    long after it was taken, and the pointer may have moved since."""

    def __init__(self, reloader: Reloader, interval_s: float | None = None) -> None:
        self.reloader = reloader
        config = reloader.config
        intervals = [float(config.pointer_check_s)] if config.model_pointer else []
        if config.idle_unload_s:
            intervals.append(max(1.0, config.idle_unload_s / 4))
        self.interval_s = interval_s or min(intervals, default=60.0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_pointer = time.monotonic() + (config.pointer_check_s if reloader.pointer_etag else 0)
        self.errors = 0

    @staticmethod
    def wanted(config: Config) -> bool:
        return bool(config.model_pointer or config.idle_unload_s)

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="warmstart-models", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def before_snapshot(self) -> list[str]:
        # S3 clients are dropped by Runtime.release_for_snapshot, watcher or not.
        self.stop()
        return ["models-watcher"]

    def after_restore(self) -> list[str]:
        self._next_pointer = 0.0
        self.start()
        return ["models-watcher"]

    def tick(self, check_pointer: bool = False) -> None:
        """One round: idle unload, and the pointer when it is due (or `check_pointer`). The thread's body;
        tests call it directly."""
        if self.reloader.registry.sweep_idle() or self.reloader.registry.reap():
            release_memory()
        config = self.reloader.config
        if config.model_pointer and (check_pointer or time.monotonic() >= self._next_pointer):
            self._next_pointer = time.monotonic() + config.pointer_check_s
            try:
                self.reloader.check_pointer()
            except Exception as e:  # a failed read or reload is in status; the thread goes on
                self.errors += 1
                log.warning("model pointer check failed: %s: %s", type(e).__name__, e)

    def _loop(self) -> None:
        while True:
            self.tick()
            if self._stop.wait(self.interval_s):
                return
