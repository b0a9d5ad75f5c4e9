"""Hot reload: a new version is loaded beside the one serving, checked, warmed, then swapped in atomically.

Steps, on a background thread (`warmstart-reload`): fetch (an `s3://` source, through `handler.models.s3fetch`) →
manifest and sizes → SHA-256 of *every* file the manifest lists (always, whatever WARMSTART_VERIFY_SHA256
says: these files just arrived) → session → warm-up inference → `Registry.install`, the swap, under the
registry's lock. Requests that started on the old version hold a lease on it and finish there; it is
unloaded when the last one ends. Any failure leaves the old version serving; the reason is in the admin
reply (the typed error) and in `status` (`reload.last`).

Triggers: the admin event `{"warmstart": "reload", "model": "<dir or s3 uri>", "wait": true}` (direct
invokes only: an HTTP source can be reached by whoever reaches the endpoint), and a pointer object
(`WARMSTART_MODEL_POINTER=s3://bucket/CURRENT`) read at most every `WARMSTART_POINTER_CHECK_S` seconds.

The pointer is read on a timer thread (`warmstart-models`), never on the invocation path: an S3 GET is
tens of milliseconds that no request should wait for. On Lambda the process is frozen between
invocations, so the thread advances only while some invocation runs; a changed pointer is noticed within
one interval of traffic, and the reload runs beside requests, never in front of them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from handler.core.config import Config
from handler.core.errors import InvalidInputError, WarmstartError, error_body
from handler.models.admin import ReloadInProgressError
from handler.models.loader import Loaded, load_model, verify_paced
from handler.models.origins import ModelSources
from handler.models.registry import Registry, release_memory, weights_bytes
from handler.observability.report import PhaseTimer
from handler.tasks.catalog import load_manifest

log = logging.getLogger("warmstart")

# How long freeing a replaced version waits for a moment with no request in flight before it goes ahead.
IDLE_WAIT_S = 0.5


class Reloader:
    def __init__(
        self,
        registry: Registry,
        config: Config,
        env: Mapping[str, str],
        sources: ModelSources | None = None,
        pointer_etag: str | None = None,
    ) -> None:
        self.registry = registry
        self.config = config
        self.env = env
        self.sources = sources or ModelSources(environ=env, backend=config.backend)
        self._busy = threading.Lock()
        self._running: str | None = None
        self.last: dict[str, Any] | None = None  # the last reload's result or failure (status shows it)
        self.pointer_etag = pointer_etag
        self.pointer_last: dict[str, Any] | None = None
        self.releases = 0  # old versions freed and trimmed so far (the reload benchmark waits on it)

    # -- the admin event -----------------------------------------------------------------------------------

    def admin(self, payload: dict[str, Any], remaining_ms: int | None = None) -> dict[str, Any]:
        action = payload["warmstart"]
        if action == "models":
            return {"warmstart": "models", **self.registry.describe(), "reload": self.describe()}
        source = payload.get("model")
        if not isinstance(source, str) or not source.strip():
            raise InvalidInputError('a reload needs "model": a packed-model directory or an s3:// URI')
        wait = payload.get("wait", True)
        if not isinstance(wait, bool):
            raise InvalidInputError(f'"wait" must be true or false, got {wait!r}')
        # Leave the invocation a second to answer; the reload itself goes on if the wait runs out.
        timeout = None if remaining_ms is None else max(0.1, remaining_ms / 1000 - 1.0)
        return self.reload(source.strip(), wait=wait, timeout=timeout)

    def reload(self, source: str, wait: bool = True, timeout: float | None = None) -> dict[str, Any]:
        """Start a reload on the background thread; with `wait`, answer its result (or raise its error)."""
        if not self._busy.acquire(blocking=False):
            raise ReloadInProgressError(f"a reload of {self._running} is running; try again when it ends")
        self._running = source
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["result"] = self._reload(source)
            except BaseException as e:
                outcome["error"] = e
            finally:
                self._running = None
                self._busy.release()

        thread = threading.Thread(target=run, name="warmstart-reload", daemon=True)
        thread.start()
        if not wait:
            return {"warmstart": "reload", "accepted": True, "source": source, "serving": self.registry.default_key}
        thread.join(timeout)
        if thread.is_alive():
            return {"warmstart": "reload", "pending": True, "source": source, "serving": self.registry.default_key}
        if "error" in outcome:
            raise outcome["error"]
        result: dict[str, Any] = outcome["result"]
        return result

    # -- the reload itself ---------------------------------------------------------------------------------

    def _reload(self, source: str) -> dict[str, Any]:
        try:
            return self._reload_once(source)
        finally:
            self.sources.settle()  # the registry now holds what it uses: a fetched directory it does not is prunable

    def _reload_once(self, source: str) -> dict[str, Any]:
        timer = PhaseTimer()
        serving = self.registry.default_key
        try:
            with timer.phase("fetch"):
                path = self.sources.resolve(source)
            manifest = load_manifest(path)
            # A new version replaces the one with the same id (default or extra); another id, the default.
            replaces = self.registry.find(manifest.id) or self.registry.default_key
            if manifest.key == replaces:
                result = self._done(source, serving, replaces, timer, changed=False)
                return result
            resident = self.registry.loaded_version(manifest.key)
            if resident is not None:  # already loaded side by side: check its files again, then swap
                with timer.phase("sha256"):
                    verify_paced(resident.manifest, list(resident.manifest.files), self._busy_now)
                with timer.phase("swap"):
                    self.registry.promote(manifest.key, replaces)
                self._release_old()
                result = self._done(source, replaces, manifest.key, timer, changed=True)
                result["verified_files"] = len(resident.manifest.files)
                return result
            need = weights_bytes(manifest, self.config.backend)
            self.registry.reserve(need, manifest.key)
            try:
                loaded = self._load(path, timer)
                with timer.phase("swap"):
                    old = self.registry.install(loaded, source, replaces, make_default=False)
            finally:
                self.registry.unreserve(need)
        except Exception as e:
            self.last = {
                "ok": False,
                "source": source,
                **error_body(type(e).__name__, str(e)),
                "serving": self.registry.default_key,
                "phases_ms": dict(timer.phases),
                "at": time.time(),
            }
            log.error("reload of %s failed; %s keeps serving: %s: %s", source, serving, type(e).__name__, e)
            raise _with_serving(e, self.registry.default_key) from None
        self._release_old()
        result = self._done(source, old, loaded.key, timer, changed=True, loaded=loaded)
        log.warning("reloaded: %s → %s in %.0f ms", old, loaded.key, result["total_ms"])
        return result

    def _release_old(self) -> None:
        """Free the old version and return its heap to the OS: now when no request is in flight; otherwise on
        a helper thread that waits for the requests holding it (bounded: a request lasts 15 minutes at
        most), then for a moment with no request in flight (at most `IDLE_WAIT_S`: the free holds the GIL
        for a few ms, and a request running then would wait that long)."""
        registry = self.registry
        if not registry.retiring() and registry.in_flight == 0:
            registry.reap()
            release_memory()
            self._prune()  # the old version's files go once it is freed, not before
            self.releases += 1
            return

        def wait_then_release() -> None:
            deadline = time.monotonic() + 900
            while registry.retiring() and time.monotonic() < deadline:
                time.sleep(0.05)
            registry.reap(idle_within_s=IDLE_WAIT_S)
            release_memory()  # ctypes lets go of the GIL: requests run meanwhile
            self._prune()
            self.releases += 1

        threading.Thread(target=wait_then_release, name="warmstart-release", daemon=True).start()

    def _prune(self) -> None:
        try:
            self.sources.prune()
        except OSError as e:  # the swap succeeded; a cache that cannot be cleaned is logged, not raised
            log.warning("model cache prune failed: %s", e)

    def _load(self, path: Path, timer: PhaseTimer) -> Loaded:
        # Every file hashed and the model warmed, whatever the init-phase settings say; one buffer pool.
        return load_model(
            path,
            self.config,
            self.env,
            timer,
            pool=self.registry.default.pool,
            verify_all=True,
            warmup=True,
            busy=self._busy_now,
        )

    def _busy_now(self) -> bool:
        return self.registry.in_flight > 0

    def _done(
        self,
        source: str,
        old: str | None,
        new: str,
        timer: PhaseTimer,
        changed: bool,
        loaded: Loaded | None = None,
    ) -> dict[str, Any]:
        result: dict[str, Any] = {
            "warmstart": "reload",
            "ok": True,
            "changed": changed,
            "old": old,
            "new": new,
            "default": self.registry.default_key,
            "source": source,
            "verified_files": loaded.verified_files if loaded else 0,
            "weights_mb": round(loaded.weights_bytes / 2**20, 1) if loaded else None,
            "phases_ms": dict(timer.phases),
            "total_ms": timer.total_ms(),
            "at": time.time(),
        }
        if loaded is not None and loaded.warmup_error:
            result["warmup_error"] = loaded.warmup_error
        self.last = result
        return result

    # -- the pointer ---------------------------------------------------------------------------------------

    def check_pointer(self) -> dict[str, Any] | None:
        """Read the pointer; reload when its ETag changed. A target that fails to load is not retried until
        the pointer changes again (or an admin reload): a corrupt upload would otherwise be fetched and
        hashed every interval. Returns the reload's result, None when nothing changed."""
        pointer = self.config.model_pointer
        if pointer is None:
            return None
        uri, etag = self.sources.read_pointer(pointer)
        self.pointer_last = {"uri": uri, "etag": etag, "at": time.time()}
        if etag == self.pointer_etag:
            return None
        self.pointer_etag = etag
        if not self._busy.acquire(blocking=False):
            self.pointer_etag = None  # an admin reload is running: look again next interval
            return None
        self._running = uri
        try:
            return self._reload(uri)
        finally:
            self._running = None
            self._busy.release()

    @property
    def running(self) -> bool:
        return self._running is not None

    def describe(self) -> dict[str, Any]:
        return {
            "running": self._running,
            "last": self.last,
            "pointer": None
            if self.config.model_pointer is None
            else {"uri": self.config.model_pointer, "etag": self.pointer_etag, "last_read": self.pointer_last},
        }


def _with_serving(error: Exception, serving: str) -> Exception:
    """The same typed error (its class name is the admin reply's errorType), saying who still serves."""
    if isinstance(error, WarmstartError):
        try:
            return type(error)(f"{error}; {serving} keeps serving")
        except TypeError:
            pass
    return error
