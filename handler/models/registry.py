"""Several models side by side, keyed `id@version`: leases, idle unload and a memory budget.

A request names a model (`"model": "id@version"`, or just `"id"` when one version of it is known) or gets
the default. `with registry.lease(name) as model:` counts the request as a user of that model for as long
as it runs: a leased model is never evicted or unloaded, and one that a reload replaced (retired) stays
resident until its last lease ends, so in-flight requests finish on the version they started on.

Memory budget (`WARMSTART_MODEL_BUDGET_MB`) counts each model's weights as its manifest lists them (the
backend's files), not a measured RSS delta: the size is known *before* loading, so room is made (least
recently used idle models evicted) before a byte is mapped, and it does not drift with what other threads
allocate at the same moment. What it leaves out: ONNX Runtime's prepacked weight copies and arenas, roughly
as much again for MatMul-heavy models; leave that headroom in the budget. The default model is never
evicted or idle-unloaded: it is what the instance is for.

About one thing (the registry's state under one lock: leases, retiring versions, the budget), hence its length.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from handler.core.errors import ConfigError, InvalidInputError, RequestError
from handler.core.manifest import Manifest
from handler.core.records import record
from handler.core.types import JSON
from handler.models.loader import Loaded
from handler.tasks.catalog import load_manifest

MB = 2**20


class UnknownModelError(RequestError):
    """The request names a model this instance neither has loaded nor knows where to load from."""

    status = 404


class ModelBudgetError(RequestError):
    """Loading the model would pass `WARMSTART_MODEL_BUDGET_MB` even after evicting every idle model; the
    models in use keep it from fitting now (a retry after they finish may succeed)."""

    status = 503


def release_memory() -> bool:
    """Give the heap an unloaded model freed back to the OS (glibc's `malloc_trim`): ONNX Runtime frees its
    prepacked weights and arenas, but glibc keeps the pages, and RSS would creep up by tens of MB with every
    swap (measured: ~+50 MB a swap without, back to the pre-swap RSS with). A few ms; never on a request's
    path. False where there is no glibc."""
    try:
        import ctypes

        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def requested_model(payload: JSON) -> str | None:
    """The `"model"` a request names (None: the default); checked here so a bad value is a 400."""
    if not isinstance(payload, dict) or payload.get("model") is None:
        return None
    name = payload["model"]
    if not isinstance(name, str) or not name:
        raise InvalidInputError(f'"model" must be a non-empty string "id@version", got {name!r}')
    return name


def weights_bytes(manifest: Manifest, backend: str | None) -> int:
    """What the budget counts for a model: the files its backend maps."""
    return sum(manifest.files[n].size for n in manifest.files_for(backend or manifest.default_backend))


class Slot:
    """One resident model and who is using it. (Plain classes here, not dataclasses: each dataclass costs
    ~0.4 ms to create at import, and this module is on the init path.)"""

    __slots__ = ("last_used", "loaded", "loaded_at", "path", "refs", "retired", "served", "source")

    def __init__(self, loaded: Loaded, source: str, path: Path, now: float, refs: int = 0) -> None:
        self.loaded = loaded
        self.source = source  # where it came from: a directory, or the s3:// URI it was fetched from
        self.path = path  # the local packed-model directory
        self.loaded_at = self.last_used = now
        self.refs = self.served = refs
        self.retired = False  # replaced by a reload: unloaded when its last lease ends

    @property
    def key(self) -> str:
        return self.loaded.key


@record  # not a NamedTuple: its `exec`'d __new__ ran the compiler at init (~0.5 M instructions, callgrind)
class Available:
    """A model that may be loaded on demand: its local directory and the bytes it will count."""

    source: str
    path: Path
    weights_bytes: int
    task: str  # its manifest's: what `GET /v1/models` and `POST /` say of it before it is loaded


class Counters:
    __slots__ = ("events", "evictions", "idle_unloads", "loads", "retired")

    def __init__(self) -> None:
        self.loads = self.evictions = self.idle_unloads = self.retired = 0
        self.events: list[str] = []


class Registry:
    def __init__(
        self,
        default: Loaded,
        source: str,
        *,
        load: Callable[[Path], Loaded] | None = None,
        backend: str | None = None,
        budget_mb: int = 0,
        idle_unload_s: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`load` builds a model from a local directory (the runtime passes `loader.load_model` with its
        config); without it, models are only ever added ready-made (`install`)."""
        self._load = load
        self.backend = backend
        self.budget_bytes = budget_mb * MB
        self.idle_unload_s = idle_unload_s
        self._clock = clock
        self._lock = threading.Lock()  # slots, catalog, default pointer, refcounts: held for microseconds
        self._load_lock = threading.Lock()  # one on-demand load at a time (they are CPU-bound anyway)
        self._reserved = 0
        self._evicted = 0  # evictions since the last release_memory()
        self.in_flight = 0  # requests holding a lease now (read without the lock by a reload's pacing)
        self.counters = Counters()
        now = clock()
        path = default.manifest.root
        self._slots: dict[str, Slot] = {default.key: Slot(default, source, path, now)}
        first = Available(source, path, default.weights_bytes, default.manifest.task)
        self._available: dict[str, Available] = {default.key: first}
        self._retiring: list[Slot] = []
        self._graveyard: list[Slot] = []  # replaced and unleased, not yet freed: `reap` frees them
        self._idle = threading.Condition(self._lock)  # notified when in_flight drops to 0 while a reaper waits
        self._reaper_waiting = False
        self._default = default.key
        self._default_slot = self._slots[default.key]  # one attribute: read without the lock, swapped under it

    # -- what requests use ---------------------------------------------------------------------------------

    @property
    def default_key(self) -> str:
        return self._default

    @property
    def default(self) -> Loaded:
        """The default model (pings, status); read without the lock: a single attribute that `install`
        replaces in one store. Requests go through `lease`, which holds the model while they run."""
        return self._default_slot.loaded

    @contextmanager
    def lease(self, name: str | None = None) -> Iterator[Loaded]:
        slot = self._acquire(name)
        try:
            yield slot.loaded
        finally:
            self._release(slot)

    def _acquire(self, name: str | None) -> Slot:
        while True:
            with self._lock:
                key = self._resolve(name)
                slot = self._slots.get(key)
                if slot is not None:
                    slot.refs += 1
                    slot.served += 1
                    slot.last_used = self._clock()
                    self.in_flight += 1
                    return slot
            slot = self._load_on_demand(key)
            if slot is not None:
                with self._lock:
                    self.in_flight += 1
                return slot
            # A reload replaced `key` while this request waited for it: the request goes to what the
            # registry serves now, the version that took its place when it named that exact version.
            if name == key:
                name = key.split("@", 1)[0]

    def _release(self, slot: Slot) -> None:
        with self._lock:
            slot.refs -= 1
            self.in_flight -= 1
            slot.last_used = self._clock()
            if slot.retired and slot.refs == 0:
                # Not freed here: freeing a session holds the GIL for ms, and this is a request's thread.
                # The reaper (`reap`, on the reloader's helper thread) drops the last reference.
                self._drop_retiring(slot)
                self._graveyard.append(slot)
            if self._reaper_waiting and self.in_flight == 0:
                self._idle.notify_all()

    def _resolve(self, name: str | None) -> str:
        if name is None:
            return self._default
        if name in self._slots or name in self._available:
            return name
        if "@" not in name:
            matches = sorted({k for k in (*self._slots, *self._available) if k.split("@", 1)[0] == name})
            if len(matches) == 1:
                return matches[0]
            if matches:
                raise UnknownModelError(f"model {name!r} is ambiguous; name one version: {', '.join(matches)}")
        on_demand = sorted(k for k in self._available if k not in self._slots)
        raise UnknownModelError(
            f"model {name!r} is not served here; loaded: {', '.join(sorted(self._slots))}"
            + (f"; loaded on demand: {', '.join(on_demand)}" if on_demand else "")
            + f" (the default is {self._default})"
        )

    # -- loading, eviction ---------------------------------------------------------------------------------

    def _load_on_demand(self, key: str) -> Slot | None:
        """Load `key` and hold a reference to it; None when a reload replaced it meanwhile (nothing published)."""
        if self._load is None:
            raise UnknownModelError(f"model {key!r} is not loaded and this registry cannot load models")
        with self._load_lock:
            with self._lock:
                slot = self._slots.get(key)
                if slot is not None:  # loaded by a request that got the load lock first
                    slot.refs += 1
                    slot.served += 1
                    slot.last_used = self._clock()
                    return slot
                entry = self._available.get(key)
                if entry is None:  # retired by a reload meanwhile
                    return None
                self._reserve_locked(entry.weights_bytes, key)
            try:
                loaded = self._load(entry.path)
            finally:
                with self._lock:
                    self._reserved -= entry.weights_bytes
            slot = None
            with self._lock:
                evicted, self._evicted = self._evicted, 0
                # The load ran outside the lock, and a reload may have replaced this version meanwhile
                # (`install` drops its catalog entry). Publishing it then would resurrect the retired version
                # beside its successor: a load that lost the race is dropped unpublished.
                lost = self._available.get(key) is not entry
                if lost:
                    self._event(f"dropped {key} loaded on demand: a reload replaced it during the load")
                else:
                    slot = Slot(loaded, entry.source, entry.path, self._clock(), refs=1)
                    self._slots[loaded.key] = slot
                    self.counters.loads += 1
            if lost:
                del loaded  # freed on this request's thread, which already paid for the load
            if evicted or lost:
                release_memory()
            return slot

    def reserve(self, nbytes: int, key: str) -> None:
        """Make room for `nbytes` more (evicting idle models, least recently used first) and hold it until
        `unreserve`; raises ModelBudgetError when the models in use leave no room."""
        with self._lock:
            self._reserve_locked(nbytes, key)

    def unreserve(self, nbytes: int) -> None:
        with self._lock:
            self._reserved -= nbytes

    def _resident_locked(self) -> int:
        slots = [*self._slots.values(), *self._retiring]
        return sum(s.loaded.weights_bytes for s in slots) + self._reserved

    def _reserve_locked(self, nbytes: int, key: str) -> None:
        if self.budget_bytes:
            idle = sorted(
                (s for s in self._slots.values() if s.refs == 0 and s.key != self._default),
                key=lambda s: s.last_used,
            )
            while self._resident_locked() + nbytes > self.budget_bytes and idle:
                victim = idle.pop(0)
                del self._slots[victim.key]
                self.counters.evictions += 1
                self._evicted += 1
                self._event(f"evicted {victim.key} (least recently used) to make room for {key}")
            if self._resident_locked() + nbytes > self.budget_bytes:
                in_use = ", ".join(
                    f"{s.key} {s.loaded.weights_bytes / MB:.1f} MB ({s.refs} in use)"
                    for s in (*self._slots.values(), *self._retiring)
                )
                raise ModelBudgetError(
                    f"{key} needs {nbytes / MB:.1f} MB of weights; WARMSTART_MODEL_BUDGET_MB="
                    f"{self.budget_bytes // MB} and what cannot be evicted holds "
                    f"{self._resident_locked() / MB:.1f} MB: {in_use}"
                )
        self._reserved += nbytes

    def add(self, source: str, path: Path, load_now: bool = True) -> str:
        """Make a model available side by side (WARMSTART_MODELS); loaded now if it fits the budget without
        evicting anything, otherwise on its first request. Returns its key."""
        manifest = load_manifest(path)
        key = manifest.key
        with self._lock:
            if key in self._available:
                raise ConfigError(f"model {key} is configured twice ({self._available[key].source} and {source})")
            entry = Available(source, path, weights_bytes(manifest, self.backend), manifest.task)
            self._available[key] = entry
            fits = not self.budget_bytes or self._resident_locked() + entry.weights_bytes <= self.budget_bytes
        if load_now and fits and self._load is not None:
            with self._load_lock:
                loaded = self._load(path)
            with self._lock:
                now = self._clock()
                self._slots[key] = Slot(loaded, source, path, now)
                self.counters.loads += 1
        return key

    def install(self, loaded: Loaded, source: str, replaces: str | None, make_default: bool) -> str | None:
        """The atomic swap: `loaded` becomes servable (and the default when asked) in one step under the
        lock, and the model it replaces is retired: no new request gets it, those holding a lease finish on
        it, and it is unloaded when the last one ends. Returns the replaced key."""
        path = loaded.manifest.root
        with self._lock:
            if loaded.key in self._slots and loaded.key != replaces:
                raise ValueError(f"{loaded.key} is already loaded; install a different version")
            make_default = make_default or replaces == self._default  # the default never dangles
            now = self._clock()
            old = self._slots.pop(replaces, None) if replaces and replaces != loaded.key else None
            if replaces and replaces != loaded.key:
                self._available.pop(replaces, None)
            slot = Slot(loaded, source, path, now)
            self._slots[loaded.key] = slot
            self._available[loaded.key] = Available(source, path, loaded.weights_bytes, loaded.manifest.task)
            if make_default:
                self._default, self._default_slot = loaded.key, slot
            self.counters.loads += 1
            if old is not None:
                self._retire_locked(old)
            return old.key if old is not None else replaces

    def promote(self, key: str, replaces: str) -> str:
        """The swap to a version that is already resident (loaded side by side): it takes `replaces`'s
        place, the default pointer included, and `replaces` is retired as by `install`."""
        with self._lock:
            slot = self._slots[key]
            old = self._slots.pop(replaces)
            self._available.pop(replaces, None)
            if replaces == self._default:
                self._default, self._default_slot = key, slot
            self._retire_locked(old)
            return replaces

    def _retire_locked(self, old: Slot) -> None:
        old.retired = True
        self.counters.retired += 1
        self._retiring.append(old)
        if old.refs == 0:
            # Not freed by dropping the last reference here (inside the swap): `reap` frees it, when no
            # request is in flight if one comes soon.
            self._drop_retiring(old)
            self._graveyard.append(old)
        else:
            self._event(f"retired {old.key}: unloaded when its {old.refs} in-flight request(s) end")

    def _drop_retiring(self, slot: Slot) -> None:
        self._retiring.remove(slot)
        self._event(f"unloaded {slot.key} (replaced, no request in flight)")

    def sweep_idle(self) -> list[str]:
        """Unload models idle for `idle_unload_s` (never the default, never one in use); they stay available
        and load again on their next request."""
        if not self.idle_unload_s:
            return []
        with self._lock:
            now = self._clock()
            idle = [
                s.key
                for s in self._slots.values()
                if s.key != self._default and s.refs == 0 and now - s.last_used >= self.idle_unload_s
            ]
            for key in idle:
                del self._slots[key]
                self.counters.idle_unloads += 1
                self._event(f"unloaded {key}: idle for {self.idle_unload_s} s or more")
        return idle

    def reap(self, idle_within_s: float = 0.0) -> int:
        """Free the versions that were replaced and whose last request has ended (call off the request path).

        Freeing a version holds the GIL for a few ms (ONNX Runtime's session destructor: measured 2-9 ms for
        all-MiniLM, a tokenizer no other version shares ~5 ms more), and every request thread waits that
        long. With `idle_within_s`, wait up to that long for a moment with no request in flight (notified
        by the last lease's release) and free then; when the time runs out (saturating load), free anyway."""
        with self._lock:
            if idle_within_s > 0 and self._graveyard and self.in_flight:
                self._reaper_waiting = True
                try:
                    self._idle.wait_for(lambda: self.in_flight == 0, idle_within_s)
                finally:
                    self._reaper_waiting = False
            dead, self._graveyard = self._graveyard, []
        count = len(dead)
        del dead  # the last references: freed here, on this thread, outside the lock
        return count

    def retiring(self) -> int:
        """Replaced versions still resident because requests hold them."""
        with self._lock:
            return len(self._retiring)

    def find(self, model_id: str) -> str | None:
        """The loaded or available key with this id, the default first (a reload replaces the version with
        the same id)."""
        with self._lock:
            keys = sorted(k for k in (*self._slots, *self._available) if k.split("@", 1)[0] == model_id)
            default = self._default
        return default if default in keys else (keys[0] if keys else None)

    def loaded_version(self, key: str) -> Loaded | None:
        with self._lock:
            slot = self._slots.get(key)
        return slot.loaded if slot is not None else None

    def _event(self, text: str) -> None:
        self.counters.events = [*self.counters.events[-19:], text]  # the last 20, for `models` and status

    # -- what status shows ---------------------------------------------------------------------------------

    def paths(self) -> set[Path]:
        """Every model directory in use or that may be loaded on demand, replaced versions not yet freed
        included: what the S3 cache must keep."""
        with self._lock:
            slots = [*self._slots.values(), *self._retiring, *self._graveyard]
            return {s.path for s in slots} | {a.path for a in self._available.values()}

    def counts(self) -> dict[str, int]:
        """How many models are where: what an unauthenticated status may show (no keys, sources or paths)."""
        with self._lock:
            return {
                "loaded": len(self._slots),
                "available": sum(1 for k in self._available if k not in self._slots),
                "retiring": len(self._retiring),
                "in_flight": self.in_flight,
            }

    def tasks(self) -> dict[str, str]:
        """Every model this instance serves, loaded or on demand: key → its task (from its manifest)."""
        with self._lock:
            return {key: entry.task for key, entry in sorted(self._available.items())}

    def describe(self) -> dict[str, Any]:
        with self._lock:
            now = self._clock()

            def one(s: Slot) -> dict[str, Any]:
                return {
                    "key": s.key,
                    "default": s.key == self._default,
                    "source": s.source,
                    "refs": s.refs,
                    "served": s.served,
                    "weights_mb": round(s.loaded.weights_bytes / MB, 1),
                    "idle_s": round(now - s.last_used, 3),
                    "loaded_s_ago": round(now - s.loaded_at, 3),
                    "backend": s.loaded.backend.name,
                    "task": s.loaded.manifest.task,
                    "precision": s.loaded.manifest.precision,
                }

            return {
                "default": self._default,
                "loaded": [one(s) for s in sorted(self._slots.values(), key=lambda s: s.key)],
                "retiring": [one(s) for s in self._retiring],
                "available": sorted(k for k in self._available if k not in self._slots),
                "in_flight": self.in_flight,
                "resident_mb": round(self._resident_locked() / MB, 1),
                "budget_mb": self.budget_bytes // MB or None,
                "idle_unload_s": self.idle_unload_s or None,
                "loads": self.counters.loads,
                "evictions": self.counters.evictions,
                "idle_unloads": self.counters.idle_unloads,
                "retired": self.counters.retired,
                "events": list(self.counters.events),
            }
