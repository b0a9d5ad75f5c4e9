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
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from handler.core.config import Config, is_s3
from handler.core.errors import InvalidInputError, RequestError, WarmstartError
from handler.core.manifest import load_manifest
from handler.core.types import JSON
from handler.models.loader import Loaded, load_model, verify_paced
from handler.models.registry import Registry, release_memory, weights_bytes
from handler.observability.report import PhaseTimer

log = logging.getLogger("warmstart")

ADMIN_ACTIONS = ("reload", "models")
# How long freeing a replaced version waits for a moment with no request in flight before it goes ahead.
IDLE_WAIT_S = 0.5
Fetch = Callable[..., Path]  # handler.models.s3fetch.fetch_model's shape: (uri, *, environ=..., backend=...) -> Path
ReadPointer = Callable[[str], tuple[str, str]]  # (pointer uri) -> (model uri, ETag)


class AdminNotAllowedError(RequestError):
    """An admin event (`{"warmstart": "reload" | "models"}`) arrived through an HTTP source; only direct
    invokes (which need `lambda:InvokeFunction` on the function) may manage models."""

    status = 403


class ReloadInProgressError(RequestError):
    """Another reload is still running; one at a time (each holds a second copy of a model in memory)."""

    status = 409


def admin_action(payload: JSON) -> str | None:
    if not isinstance(payload, dict):
        return None
    action = payload.get("warmstart")
    return action if action in ADMIN_ACTIONS else None


def _s3fetch() -> Any:
    # Deferred: boto3 is imported only when an s3:// source is used, never on the plain init path.
    from handler.models import s3fetch

    return s3fetch


class Sources:
    """Where models come from: a local packed-model directory as it is, an `s3://` URI fetched (and
    verified) into the local cache by part A's `fetch_model`. Both callables may be injected (tests)."""

    def __init__(
        self,
        fetch: Fetch | None = None,
        read_pointer: ReadPointer | None = None,
        environ: Mapping[str, str] | None = None,
        backend: str | None = None,
    ) -> None:
        self._fetch = fetch
        self._read_pointer = read_pointer
        self._env = environ
        self._backend = backend
        # The S3 cache (handler.models.s3cache): what the registry serves (`attach`), what was fetched and not yet
        # handed to it (a reload between its fetch and its swap), the cache directories used, what was pruned.
        self._held: Callable[[], Iterable[Path]] = tuple
        self._pending: set[Path] = set()
        self._cache_dirs: set[Path] = set()
        self._lock = threading.Lock()
        self.pruned: list[str] = []  # the last 20 directories removed
        self.pruned_count = 0

    def resolve(self, source: str) -> Path:
        if not is_s3(source):
            return Path(source)
        if self._fetch is not None:
            return self._fetch(source, environ=self._env, backend=self._backend or "default")
        # Only the files the chosen backend maps ("default": the manifest's): half the download and /tmp
        # for a model packed for both onnx and torch.
        path: Path = _s3fetch().fetch_model(
            source, environ=self._env, backend=self._backend or "default", keep=self.keep
        )
        with self._lock:
            self._pending.add(path)
            self._cache_dirs.add(path.parent)
        return path

    # -- the S3 cache --------------------------------------------------------------------------------------

    def attach(self, held: Callable[[], Iterable[Path]]) -> None:
        """What the registry serves or may load (`Registry.paths`): never pruned."""
        self._held = held

    def keep(self) -> set[Path]:
        with self._lock:
            pending = set(self._pending)
        return {*self._held(), *pending}

    def settle(self) -> None:
        """The registry now knows every fetched directory it uses (after init, after a reload's swap or
        failure): fetched-but-unused ones become prunable."""
        with self._lock:
            self._pending.clear()

    def prune(self) -> list[str]:
        """Remove from the cache what no process of the instance serves or is about to (no-op without S3)."""
        if not self._cache_dirs:
            return []
        from handler.models import s3cache  # deferred: only instances that fetched from S3 come here

        removed = [name for root in sorted(self._cache_dirs) for name in s3cache.prune(root, self.keep())]
        if removed:
            with self._lock:
                self.pruned = [*self.pruned, *removed][-20:]
                self.pruned_count += len(removed)
            log.warning("model cache: removed %s (nothing serves them)", ", ".join(removed))
        return removed

    def describe_cache(self) -> list[dict[str, Any]] | None:
        """What each cache directory holds, for status; None when no model came from S3."""
        if not self._cache_dirs:
            return None
        from handler.models import s3cache

        keep = self.keep()
        return [
            {**s3cache.describe(root, keep), "pruned": self.pruned_count, "last_pruned": list(self.pruned)}
            for root in sorted(self._cache_dirs)
        ]

    def read_pointer(self, uri: str) -> tuple[str, str]:
        if self._read_pointer is not None:
            return self._read_pointer(uri)
        pointer: tuple[str, str] = _s3fetch().read_pointer(uri, environ=self._env)
        return pointer


def initial_source(config: Config, env: Mapping[str, str], sources: Sources) -> tuple[str, str | None]:
    """The default model's source at init, and the pointer's ETag when the pointer chose it: an explicit
    WARMSTART_MODEL wins; else the pointer (read once, here: the instance starts on the current version);
    else the embedded default directory."""
    if config.model_uri:
        return config.model_uri, None
    if config.model_pointer and not env.get("WARMSTART_MODEL", "").strip():
        uri, etag = sources.read_pointer(config.model_pointer)
        return uri, etag
    return str(config.model_dir), None


class Reloader:
    def __init__(
        self,
        registry: Registry,
        config: Config,
        env: Mapping[str, str],
        sources: Sources | None = None,
        pointer_etag: str | None = None,
    ) -> None:
        self.registry = registry
        self.config = config
        self.env = env
        self.sources = sources or Sources(environ=env, backend=config.backend)
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
                "error": {"type": type(e).__name__, "message": str(e)},
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
