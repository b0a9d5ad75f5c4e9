"""Where models come from: a local packed-model directory as it is, or an `s3://` URI fetched and verified
into the local cache; the pointer object read for the current version; the default model's source at init.

Named origins, not sources: `handler.api.sources` are event sources.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from handler.core.config import Config, is_s3

log = logging.getLogger("warmstart")

Fetch = Callable[..., Path]  # handler.models.s3fetch.fetch_model's shape: (uri, *, environ=..., backend=...) -> Path
ReadPointer = Callable[[str], tuple[str, str]]  # (pointer uri) -> (model uri, ETag)


def _s3fetch() -> Any:
    # Deferred: boto3 is imported only when an s3:// source is used, never on the plain init path.
    from handler.models import s3fetch

    return s3fetch


class ModelSources:
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


def initial_source(config: Config, env: Mapping[str, str], sources: ModelSources) -> tuple[str, str | None]:
    """The default model's source at init, and the pointer's ETag when the pointer chose it: an explicit
    WARMSTART_MODEL wins; else the pointer (read once, here: the instance starts on the current version);
    else the embedded default directory."""
    if config.model_uri:
        return config.model_uri, None
    if config.model_pointer and not env.get("WARMSTART_MODEL", "").strip():
        uri, etag = sources.read_pointer(config.model_pointer)
        return uri, etag
    return str(config.model_dir), None
