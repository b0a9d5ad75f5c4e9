"""The init phase, once per instance: Lambda's init (importing `handler.app`), the HTTP host's startup.

In order: where the default model comes from (a directory, or fetched from S3) → load it (manifest, only the
chosen backend, mapped weights, session with the threads the CPU quota allows, device warm-up, warm-up
inference where it is off the first request's path) → the worker pool when several requests may run at once →
the registry (and, only when something needs them, extra models, the reloader and its watcher) → the init
report, one JSON line with per-phase milliseconds.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from handler.api import encode
from handler.core.config import Config, init_type, snapshot_mode
from handler.models import loader
from handler.models.loader import Loaded, load_model, max_concurrency
from handler.models.registry import Registry
from handler.observability import report
from handler.runtime.instance import Instance

if TYPE_CHECKING:
    from handler.models.origins import ModelSources
    from handler.models.reloader import Reloader
    from handler.models.watcher import Watcher

I = TypeVar("I", bound=Instance)  # noqa: E741 (the instance class init builds: Runtime, or a test's)

# Modules a plain single-model init never needs; the init report lists any that got imported anyway.
DEFERRED = (
    "handler.api.schemas",
    "handler.models.reloader",
    "handler.models.watcher",
    "handler.runtime.status",
    "handler.runtime.workers",
    "handler.runtime.snapshot",
    "hashlib",
    "shutil",
)


def start(
    make: type[I],
    config: Config | None = None,
    environ: Mapping[str, str] | None = None,
    emit: Callable[[dict[str, Any]], None] | None = report.emit,
    sources: ModelSources | None = None,
) -> I:
    env = os.environ if environ is None else environ
    config = config or Config.from_environ(env)
    timer = report.PhaseTimer()
    age_at_start = report.process_age_ms()
    threads, bound_by = None, None
    snapshot = snapshot_mode(env)
    if snapshot == "fork":
        # fork() copies only the calling thread: the template holds no thread pool (one intra-op thread,
        # no tokenizer pool); torch's threads are created after restore, ORT's session keeps one.
        threads, bound_by = 1, "fork-snapshot"
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Where the default model comes from: a directory (no S3, no boto3, no reload module), or s3:// / the
    # pointer, fetched.
    source, pointer_etag, model_dir = str(config.model_dir), None, config.model_dir
    if sources is not None or config.model_uri or config.model_pointer:
        from handler.models.origins import ModelSources, initial_source

        sources = sources or ModelSources(environ=env, backend=config.backend)
        source, pointer_etag = initial_source(config, env, sources)
        if source != str(config.model_dir):
            with timer.phase("fetch"):
                model_dir = sources.resolve(source)
    loaded = load_model(model_dir, config, env, timer, threads=threads, bound_by=bound_by)
    if config.warmup:  # where the init warms up anyway, the answers' encoder too (its import, ~0.6 ms)
        encode.load()
    init = _report(loaded, env, snapshot, timer, age_at_start)
    init["limits"] = limits(config, loaded)
    host = loader.host_runs
    if host is not None and "AWS_LAMBDA_MAX_CONCURRENCY" not in env:
        # The HTTP host's pool and batch bounds beside the threads they were sized with: what was chosen, why.
        intra = int(init.get("threads", {}).get("intra_op", 0))
        init["http_workers"] = {
            **host.report,
            "batch_tokens": init["limits"]["batch_tokens"],  # the pool was sized before the model's budget
            "threads_per_worker": intra,
            "fits": intra * host.runs <= loaded.cpus,
        }
    workers = None
    if "AWS_LAMBDA_MAX_CONCURRENCY" in env:
        from handler.runtime.workers import WorkerPool, sizing_from_environ

        slots = max_concurrency(env)
        cpus = max(1, loaded.cpus // slots)
        workers = WorkerPool(sizing_from_environ(env, cpus, init["limits"]["batch_tokens"]), loaded.cpus)
        init["workers"] = {"max_concurrency": slots, **workers.stats()}
    # A fork template must hold no thread pool: extra models then load on first use, after restore.
    eager = snapshot != "fork"
    reloader = watcher = None
    if config.models or source != str(config.model_dir) or _watched(config):
        registry, reloader, watcher = _models(loaded, source, pointer_etag, config, env, sources, init, eager)
    else:  # a plain single-model function: the reloader (and its module) only if an admin event comes
        registry = _registry(loaded, source, config, env)
    instance = make(
        config,
        loaded.manifest,
        loaded.backend,
        loaded.task,
        init,
        loaded.pool,
        workers,
        registry,
        reloader,
        watcher,
        make_reloader=lambda registry: _reloader(registry, pointer_etag, config, env, sources),
    )
    init["instance_id"] = instance.instance_id
    if config.tracemalloc_s:  # the operator's leak hunt: from here, so init's own allocations are not in it
        instance.diagnostics.start_tracing(config.tracemalloc_s)
        init["tracemalloc_s"] = config.tracemalloc_s
    instance.observe(env, init)
    if emit:
        emit(init)
    return instance


def _report(
    loaded: Loaded, env: Mapping[str, str], snapshot: str | None, timer: report.PhaseTimer, age_at_start: float | None
) -> dict[str, Any]:
    manifest = loaded.manifest
    return {
        "warmstart": "init",
        "model": manifest.key,
        "task": manifest.task,
        "init_type": init_type(env),
        "snapshot": snapshot,
        **loaded.facts,
        "phases_ms": dict(timer.phases),
        "total_ms": timer.total_ms(),
        "process_age_at_init_ms": age_at_start,
        **report.memory_mb(),
        "weights_mb": round(loaded.weights_bytes / 2**20, 1),
        "coldstart": coldstart_report(loaded.coldstart),
    }


def coldstart_report(facts: Mapping[str, Any]) -> dict[str, Any]:
    """Which cold-start savings this start used (docs/coldstart.md): BLAS threads pinned before numpy, the
    background prefetch, the init chain's bundled code, the pre-optimized model, the tokenizer shortcut; and
    any deferred module that got imported anyway (something pulled it onto the init path)."""
    import handler  # the root package: the BLAS pin, made before numpy loaded
    from handler.runtime import codebundle, prefetch

    return {
        "blas_threads": handler.BLAS_THREADS,
        "prefetch": prefetch.report(),
        "code_bundle": codebundle.report(),
        **facts,
        "deferred_imports_loaded": [m for m in DEFERRED if m in sys.modules],
    }


def limits(config: Config, loaded: Loaded) -> dict[str, Any]:
    """The request limits in force and the memory budget behind batch tokens (docs/configuration.md#memory): a
    request of max inputs x max chars (prompt included) runs in model runs of at most batch tokens, derived
    from the memory read (where from), the model's bytes per token and the RSS after loading it."""
    budget = loaded.budget.describe() if loaded.budget is not None else {"batch_tokens": config.batch_tokens}
    return {**budget, "max_inputs": config.max_inputs, "max_chars": config.max_chars}


def _watched(config: Config) -> bool:
    """Idle unload or an S3 pointer: a timer thread (handler.models.watcher) runs from init."""
    return bool(config.idle_unload_s or config.model_pointer)


def _registry(loaded: Loaded, source: str, config: Config, env: Mapping[str, str]) -> Registry:
    pool = loaded.pool  # not `loaded` itself: the closure would keep the first default alive after a swap

    def load(path: Path) -> Loaded:
        return load_model(path, config, env, report.PhaseTimer(), pool=pool)

    return Registry(
        loaded,
        source,
        load=load,
        backend=config.backend,
        budget_mb=config.model_budget_mb,
        idle_unload_s=config.idle_unload_s,
    )


def _reloader(
    registry: Registry, etag: str | None, config: Config, env: Mapping[str, str], sources: ModelSources | None
) -> Reloader:
    from handler.models.origins import ModelSources
    from handler.models.reloader import Reloader

    sources = sources or ModelSources(environ=env, backend=config.backend)
    sources.attach(registry.paths)  # what the S3 cache keeps from now on
    return Reloader(registry, config, env, sources, etag)


def _models(
    loaded: Loaded,
    source: str,
    pointer_etag: str | None,
    config: Config,
    env: Mapping[str, str],
    sources: ModelSources | None,
    init: dict[str, Any],
    eager: bool = True,
) -> tuple[Registry, Reloader, Watcher | None]:
    """The registry around the default model, extra models (WARMSTART_MODELS), the reloader and, when idle
    unload or a pointer is configured, its timer thread. Nothing here runs for a plain single-model init."""
    from handler.models.origins import ModelSources
    from handler.models.reloader import Reloader
    from handler.models.watcher import Watcher

    sources = sources or ModelSources(environ=env, backend=config.backend)
    registry = _registry(loaded, source, config, env)
    if config.models:
        t0 = time.perf_counter()
        init["models"] = [registry.add(extra, sources.resolve(extra), load_now=eager) for extra in config.models]
        init["models_ms"] = round((time.perf_counter() - t0) * 1000, 3)
    sources.attach(registry.paths)  # what the S3 cache keeps from now on
    sources.settle()
    reloader = Reloader(registry, config, env, sources, pointer_etag)
    watcher = None
    if Watcher.wanted(config):
        watcher = Watcher(reloader)
        watcher.start()
    return registry, reloader, watcher
