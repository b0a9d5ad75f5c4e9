"""The warm standby (WARMSTART_STANDBY_AFTER_S): an engine idle that long is put to sleep, and the next request
wakes it.

For an engine with a sleep mode (the vllm backend: level 1 copies the weights to CPU memory and frees the KV
cache), an instance held warm between bursts gives its GPU memory back while it waits, and its next request pays
a wake (the weights copied back) instead of a cold start (a new process, the weights read, the CUDA graphs
captured again). The engine itself refuses to sleep while a request runs and wakes before it runs one
(`VllmEngine.sleep` / `submit`); this loop only decides when: after `after_s` with no request arriving here and
none ending there.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from handler.core.config import env_int
from handler.core.errors import ConfigError

ENV = "WARMSTART_STANDBY_AFTER_S"
MAX_S = 7 * 24 * 3600


class Sleeper(Protocol):
    """What an engine with a sleep mode has (handler.backends.vllm_engine.VllmEngine)."""

    name: str
    sleeping: bool
    last_used: float  # time.monotonic() when a request last started or ended

    def sleep(self) -> bool:
        """Sleep now unless a request runs (False: nothing done)."""

    def wake_up(self) -> bool:
        """Wake now (False: it was awake)."""


def standby_after_s(environ: Mapping[str, str] | None = None) -> int | None:
    """WARMSTART_STANDBY_AFTER_S: seconds idle before the engine sleeps, 1 to a week; unset or blank: never."""
    env = os.environ if environ is None else environ
    if not (env.get(ENV) or "").strip():
        return None
    return env_int(env, ENV, 0, 1, MAX_S)


class Standby:
    def __init__(self, engine: Sleeper, after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.engine, self.after_s, self.clock = engine, after_s, clock
        self.last = clock()
        self.error: str | None = None  # the last failed sleep's error, for /status

    @classmethod
    def for_backend(cls, backend: Any, after_s: float | None) -> Standby | None:
        """The standby for `backend` when one is set; a backend without a sleep mode is refused (ConfigError):
        a standby that would never happen is a setting silently ignored."""
        if after_s is None:
            return None
        if not all(callable(getattr(backend, m, None)) for m in ("sleep", "wake_up")):
            raise ConfigError(
                f"{ENV}={after_s:g}: backend {getattr(backend, 'name', '?')!r} has no sleep mode (the vllm backend "
                f"has one); unset {ENV}"
            )
        engine: Sleeper = backend
        return cls(engine, after_s)

    def touch(self) -> None:
        """A request arrived: the idle time counts from now."""
        self.last = self.clock()

    def describe(self) -> dict[str, Any]:
        """For /status: the setting, the engine's state, and its sleeps and wakes (counts, the last of each)."""
        return {
            "after_s": self.after_s,
            "sleeping": self.engine.sleeping,
            "idle_s": round(self.idle_s(), 3),
            **dict(getattr(self.engine, "standby", {})),
            "error": self.error,
        }

    def idle_s(self) -> float:
        return self.clock() - max(self.last, self.engine.last_used)

    async def run(self) -> None:
        """Until cancelled (the host's shutdown): sleep the engine once it has been idle for `after_s`."""
        while True:
            wait = self.after_s - self.idle_s()
            if wait > 0 or self.engine.sleeping:
                await asyncio.sleep(wait if wait > 0 else self.after_s)
                continue
            # In a thread: a sleep copies the weights off the GPU (a second or more); the loop keeps serving.
            try:
                slept = await asyncio.to_thread(self.engine.sleep)
            except Exception as e:  # the engine stays awake and serving; the standby tries again later
                self.error = f"{type(e).__name__}: {e}"
                slept = False
            if not slept:
                self.touch()  # a request was running (or the sleep failed): count again from now
