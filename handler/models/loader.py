"""Load one packed model and make it ready to serve: the one code path of the init phase and of reloads.

manifest → backend import → SHA-256 (when asked) → session with the threads the CPU quota allows → device
warm-up → task → warm-up inference. `Runtime.start` runs it once for the default model; the registry runs it
for extra models and the reloader for a standby version, so all of them are built exactly alike.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from handler.backends import registry
from handler.backends.contract import Backend, BackendSettings, create_backend
from handler.backends.device import probe_cuda
from handler.backends.pool import BufferPool
from handler.core.config import Config
from handler.core.cpu import cpu_budget, plan_threads
from handler.core.errors import ModelLoadError
from handler.core.manifest import Manifest, open_regular, verify_sha256
from handler.core.memory import Budget, batch_budget
from handler.core.records import field, record, replace
from handler.observability.report import PhaseTimer
from handler.tasks import catalog
from handler.tasks.catalog import Task


@record(frozen=False)
class Loaded:
    """A model ready to serve: what a request needs (task), and the facts status and reports show."""

    manifest: Manifest
    backend: Backend
    task: Task
    pool: BufferPool
    cpus: int  # the CPU budget it was sized for (the worker pool is sized from it too)
    facts: dict[str, Any]  # backend, providers, threads, device warm-up: the init report's middle part
    weights_bytes: int  # the backend's files as the manifest lists them: what the memory budget counts
    verified_files: int = 0  # files whose SHA-256 was checked while loading
    warmup_error: str | None = None
    phases_ms: dict[str, float] = field(default_factory=dict)
    # Which cold-start savings this load used, or why not (the init report's "coldstart").
    coldstart: dict[str, Any] = field(default_factory=dict)
    budget: Budget | None = None  # its model runs' padded tokens and the memory figures they came from

    @property
    def key(self) -> str:
        return self.manifest.key


def verify_paced(
    manifest: Manifest, names: list[str], busy: Callable[[], bool], chunk: int = 1 << 20, pause_s: float = 0.004
) -> None:
    """`verify_sha256` that steps aside for requests: after each 1 MB (~1 ms of hashing) it sleeps 4 ms
    while a request is running, so at most ~20% of a core goes to the hash then, and all of it when idle.
    Bounded: a model of 90 MB takes at most ~0.45 s more under continuous load. (Lowering the thread's
    priority instead, nice 10 or 19, starved the hash under saturating load: reloads of 4-7 s.)"""
    import hashlib  # deferred: a plain init hashes nothing

    for name in names:
        path = manifest.root / name
        digest = hashlib.sha256()
        with os.fdopen(open_regular(path), "rb") as f:
            while block := f.read(chunk):
                digest.update(block)
                if busy():
                    time.sleep(pause_s)
        actual, expected = digest.hexdigest(), manifest.files[name].sha256
        if actual != expected:
            raise ModelLoadError(
                f"{path}: SHA-256 {actual[:16]}… does not match the manifest's {expected[:16]}… (corrupt or replaced)"
            )


def max_concurrency(env: Mapping[str, str]) -> int:
    raw = env.get("AWS_LAMBDA_MAX_CONCURRENCY", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1


@record
class HostRuns:
    """What a host that runs several model runs at once (the HTTP host's worker pool) tells init before it
    starts: how many runs share the CPUs, and its choices for the init report (`http_workers`)."""

    runs: int
    report: dict[str, Any] = field(default_factory=dict)


# Set by the HTTP host before init starts (init is `handler.app`'s import, which takes no arguments), so each
# worker's session gets its share of the CPUs instead of all of them, for the default model and every model
# loaded later (extra models, reloads). None: Lambda's one run per process (or `AWS_LAMBDA_MAX_CONCURRENCY`
# processes).
host_runs: HostRuns | None = None


def runs_at_once(env: Mapping[str, str]) -> int:
    if "AWS_LAMBDA_MAX_CONCURRENCY" in env:  # a Lambda process is never the HTTP host
        return max_concurrency(env)
    return host_runs.runs if host_runs is not None else 1


def load_model(
    model_dir: Path,
    config: Config,
    env: Mapping[str, str],
    timer: PhaseTimer,
    *,
    pool: BufferPool | None = None,
    verify_all: bool = False,
    warmup: bool | None = None,
    threads: int | None = None,
    bound_by: str | None = None,
    busy: Callable[[], bool] | None = None,
) -> Loaded:
    """Build and warm the model in `model_dir`; phases are recorded on `timer`.

    `verify_all` hashes every file the manifest lists (a reload always does: the files just arrived);
    otherwise the backend's files are hashed only when `config.verify_sha256`. `warmup=None` follows
    `config.warmup`. `pool`: share one buffer pool across models (None: a new one for this device).
    `threads`/`bound_by`: an intra-op thread count decided by the caller (a fork snapshot's template runs
    one), instead of the CPU quota's. `busy`: is a request running now? When given (a reload beside live
    requests), the hash is paced by it (`verify_paced`).
    """
    with timer.phase("manifest"):
        manifest = catalog.load_manifest(model_dir)  # the task's spec module is imported here
    spec = catalog.spec(manifest.task)
    name = config.backend or manifest.default_backend
    backend_spec = registry.spec(name)  # a built-in by its table; entry points read only for another name
    own = backend_spec.own_settings(env)  # its own settings checked before its (costly) import
    with timer.phase("imports"):
        backend = create_backend(backend_spec, manifest, spec.gives)
    files = manifest.files_for(name)
    verified = 0
    if verify_all or config.verify_sha256:
        checked = list(manifest.files) if verify_all else files
        with timer.phase("sha256"):
            if busy is None:
                verify_sha256(manifest, checked)
            else:
                verify_paced(manifest, checked, busy)
        verified = len(checked)
    budget = cpu_budget(env)
    # Runs at once share the CPUs: the HTTP host's workers (each a session run), or Lambda Managed
    # Instances' processes (awslambdaric forks one per concurrency slot, each with its own session).
    on_lambda = "AWS_LAMBDA_FUNCTION_NAME" in env
    plan = plan_threads(budget.cpus, runs_at_once(env), threads or config.threads, spin_allowed=not on_lambda)
    threads = plan.threads
    cuda = probe_cuda(config.device)
    settings = BackendSettings(threads, cuda, plan.spin, own)
    backend.initialize(manifest, settings, timer)
    if manifest.raw.get("towers"):  # an image-text pack's two graphs (with_towers checks the entry)
        from handler.backends.towers import with_towers  # deferred: a one-graph pack never needs it

        backend = with_towers(backend, backend_spec, manifest, settings, timer, spec.gives)
    with timer.phase("device"):
        device = backend.warm_device()
    # After the session is built (weights mapped, prepacked): its RSS is what the runs' memory comes after.
    memory = batch_budget(config, manifest, runs_at_once(env), env)
    config = replace(config, batch_tokens=memory.batch_tokens)
    with timer.phase("task"):
        # Pinned host buffers only where a device will copy from them.
        pool = pool or BufferPool.for_device(cuda.usable)
        task: Task = spec.factory(manifest, backend, config, pool)
    warmup_error = None
    if config.warmup if warmup is None else warmup:
        with timer.phase("warmup"):
            try:
                task.warmup()
            except Exception as e:
                if not spec.warmup_may_fail:
                    raise  # a text task warms up on real text: failing there, it would fail every request
                # A generic model may reject the warm-up's inputs; that is not a reason to refuse to serve.
                warmup_error = f"{type(e).__name__}: {e}"
    facts = {
        **backend.describe(),
        "threads": {**plan.describe(), "cpus": budget.cpus, "bound_by": bound_by or budget.source, **budget.detail},
        "device_warmup": device,
        "precision": manifest.precision,
    }
    return Loaded(
        manifest=manifest,
        backend=backend,
        task=task,
        pool=pool,
        cpus=budget.cpus,
        facts=facts,
        weights_bytes=sum(manifest.files[n].size for n in files),
        verified_files=verified,
        warmup_error=warmup_error,
        phases_ms=dict(timer.phases),
        # A backend's own cold-start facts (ONNX Runtime: whether the pre-optimized model was used), then the task's.
        coldstart={
            k: v
            for k, v in (*getattr(backend, "coldstart", {}).items(), ("tokenizer", _tokenizer(task)))
            if v is not None
        },
        budget=memory,
    )


def _tokenizer(task: Task) -> dict[str, Any] | None:
    encoder = getattr(task, "encoder", None)
    return getattr(encoder, "coldstart", None)
