"""Settings read once at init from the environment (`environ=None` means `os.environ`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, TypeAlias

from handler.core.errors import ConfigError
from handler.core.records import record

# Lambda's synchronous invoke limit, request and response alike.
LAMBDA_PAYLOAD_LIMIT = 6 * 1024 * 1024
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # handler/core/config.py → the code root
# Where the embedded default model is looked for, in order: next to the code (image, repo), then a layer.
HTTP_STATUS_DETAIL = ("basic", "full")
DEFAULT_MODEL_DIRS = (_PACKAGE_ROOT / "models" / "default", Path("/opt/models/default"))
# SageMaker unpacks the endpoint's model artifact here; used (before the embedded default) when it holds a
# packed model, so one image serves whatever model the endpoint names.
SAGEMAKER_MODEL_DIR = Path("/opt/ml/model")


# The most padded tokens of one model run; at init the memory the instance has may lower it (handler.core.memory).
DEFAULT_BATCH_TOKENS = 8192


SnapshotMode: TypeAlias = "Literal['vm', 'fork']"  # a string at run time: see backends.registry.Needs
SNAPSHOT_MODES: tuple[SnapshotMode, ...] = ("vm", "fork")
SNAP_START = "snap-start"


def init_type(environ: Mapping[str, str] | None = None) -> str:
    """What started this init, for the init report: Lambda's `AWS_LAMBDA_INITIALIZATION_TYPE` (on-demand,
    provisioned-concurrency, snap-start, ...); "on-demand" under a Lambda runtime API that sets none (the
    emulator); "http-host" with no Lambda runtime at all: the HTTP host inits at startup, before any request."""
    env = os.environ if environ is None else environ
    given = env.get("AWS_LAMBDA_INITIALIZATION_TYPE")
    if given:
        return given
    return "on-demand" if env.get("AWS_LAMBDA_RUNTIME_API") else "http-host"


def snapshot_mode(environ: Mapping[str, str] | None = None) -> SnapshotMode | None:
    """None unless this init will be snapshotted (`AWS_LAMBDA_INITIALIZATION_TYPE=snap-start`)."""
    env = os.environ if environ is None else environ
    if env.get("AWS_LAMBDA_INITIALIZATION_TYPE") != SNAP_START:
        return None
    raw = env.get("WARMSTART_SNAPSHOT", "vm") or "vm"
    for mode in SNAPSHOT_MODES:
        if raw == mode:
            return mode
    raise ConfigError(f"WARMSTART_SNAPSHOT={raw!r}; valid values: {', '.join(SNAPSHOT_MODES)}")


def warmup_at_init(env: Mapping[str, str]) -> bool:
    """`WARMSTART_WARMUP`. An on-demand Lambda init sits on the first request's path: a warm-up inference there
    costs more init than it saves that request (docs/coldstart.md). Provisioned concurrency and SnapStart init ahead
    of traffic, and other hosts gate traffic on readiness: those warm up."""
    return env_bool(env, "WARMSTART_WARMUP", env.get("AWS_LAMBDA_INITIALIZATION_TYPE") != "on-demand")


def lean_start_on(env: Mapping[str, str]) -> bool:
    """`WARMSTART_LEAN_START` (handler.runtime.prefetch.lean_start)."""
    return env_bool(env, "WARMSTART_LEAN_START", True)


def env_int(env: Mapping[str, str], key: str, default: int, lo: int, hi: int) -> int:
    """An integer setting in [lo, hi]; unset or blank means `default`."""
    raw = (env.get(key) or "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not an integer") from None
    if not lo <= value <= hi:
        raise ConfigError(f"{key}={value} is outside [{lo}, {hi}]")
    return value


def env_bool(env: Mapping[str, str], key: str, default: bool) -> bool:
    """A switch: 1/true/yes/on or 0/false/no/off (any case); unset or blank means `default`; else ConfigError."""
    raw = env.get(key, "").strip().lower()
    if raw == "":
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{key}={raw!r}; valid values: 1, 0, true, false, yes, no, on, off")


def env_switch(env: Mapping[str, str], key: str) -> bool | None:
    """A three-way switch: None when unset or blank (the code decides), else `env_bool`'s reading."""
    return env_bool(env, key, False) if (env.get(key) or "").strip() else None


def parse_model_source(key: str, value: str) -> str:
    """A model source is a local packed-model directory or `s3://bucket/prefix`; any other scheme is refused."""
    value = value.strip()
    if "://" not in value:
        if not value:
            raise ConfigError(f"{key}: an empty model source; valid: a directory path or s3://bucket/prefix")
        return value
    bucket, _, prefix = value.removeprefix("s3://").partition("/")
    if not value.startswith("s3://") or not bucket or not prefix.strip("/"):
        raise ConfigError(f"{key}={value!r}; valid: a directory path or s3://bucket/prefix")
    return value


def is_s3(source: str) -> bool:
    return source.startswith("s3://")


@record
class Config:
    model_dir: Path
    # None: the manifest's default backend. A name, checked where backends are known (handler.backends.registry)
    # when the model loads: a plugin's name is valid too.
    backend: str | None
    max_inputs: int = 256
    max_chars: int = 20_000
    # Padded tokens (rows x the longest) of one model run, one request's or a batch's: activation memory
    # grows with it, so a request of max_inputs long texts runs in several (docs/configuration.md#memory).
    # Unless `batch_tokens_set` (WARMSTART_BATCH_TOKENS), a ceiling: loading a model lowers it to what the memory
    # left after the model holds (handler.core.memory.derive).
    batch_tokens: int = DEFAULT_BATCH_TOKENS
    batch_tokens_set: bool = False
    max_elements: int = 1 << 24  # per tensor-task input; a .npy header is checked against it before allocating
    max_hold_ms: int = 10_000
    verify_sha256: bool = False
    threads: int | None = None  # None: from the CPU quota really available
    warmup: bool = True
    # WARMSTART_LEAN_START: read by handler.runtime.prefetch.lean_start before this is built; here so that init
    # refuses a value it cannot read (the prefetch's reading then took it as off).
    lean_start: bool = True
    device: str = "auto"  # auto | cpu | cuda
    # Several models, hot reload (handler.models.registry, handler.models.reloader).
    model_uri: str | None = None  # WARMSTART_MODEL as s3://...: fetched at init into a local dir
    models: tuple[str, ...] = ()  # WARMSTART_MODELS: extra models side by side (dirs or s3:// URIs)
    idle_unload_s: int = 0  # an extra model unused this long is unloaded (0: never)
    model_budget_mb: int = 0  # resident weights of all models together (0: no limit)
    model_pointer: str | None = None  # s3://.../CURRENT naming the default model's source
    pointer_check_s: int = 60  # at most one pointer read per interval
    # What `GET /status` shows on the HTTP host: "basic" (counts and health) or "full" (sources, paths,
    # errors, the pointer: what a direct invoke's status shows). Anyone who reaches the port may ask.
    http_status: str = "basic"
    tracemalloc_s: int = 0  # trace allocations for this long from the end of init (0: not started)
    tokenizer_shortcut: bool = True  # WordPiece from the vocabulary where the manifest proves it equivalent

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Config:
        env = os.environ if environ is None else environ
        model = env.get("WARMSTART_MODEL", "").strip()
        model_uri = parse_model_source("WARMSTART_MODEL", model) if "://" in model else None
        default_dir = next((p for p in DEFAULT_MODEL_DIRS if p.is_dir()), DEFAULT_MODEL_DIRS[0])
        if (SAGEMAKER_MODEL_DIR / "manifest.json").is_file():
            default_dir = SAGEMAKER_MODEL_DIR
        model_dir = Path(model) if model and model_uri is None else default_dir
        models = tuple(
            parse_model_source("WARMSTART_MODELS", m) for m in env.get("WARMSTART_MODELS", "").split(",") if m.strip()
        )
        pointer = env.get("WARMSTART_MODEL_POINTER", "").strip() or None
        if pointer is not None and not is_s3(parse_model_source("WARMSTART_MODEL_POINTER", pointer)):
            raise ConfigError(f"WARMSTART_MODEL_POINTER={pointer!r}; valid: s3://bucket/key (an object naming a model)")
        backend_raw = env.get("WARMSTART_BACKEND")
        device = env.get("WARMSTART_DEVICE", "auto")
        if device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"WARMSTART_DEVICE={device!r}; valid values: auto, cpu, cuda")
        threads = env_int(env, "WARMSTART_THREADS", 0, 0, 1024)
        http_status = env.get("WARMSTART_HTTP_STATUS", "").strip() or cls.http_status
        if http_status not in HTTP_STATUS_DETAIL:
            raise ConfigError(f"WARMSTART_HTTP_STATUS={http_status!r}; valid values: {', '.join(HTTP_STATUS_DETAIL)}")
        return cls(
            model_dir=model_dir,
            backend=backend_raw or None,
            max_inputs=env_int(env, "WARMSTART_MAX_INPUTS", cls.max_inputs, 1, 100_000),
            max_chars=env_int(env, "WARMSTART_MAX_CHARS", cls.max_chars, 1, LAMBDA_PAYLOAD_LIMIT),
            batch_tokens=env_int(env, "WARMSTART_BATCH_TOKENS", cls.batch_tokens, 1, 1 << 24),
            batch_tokens_set=bool((env.get("WARMSTART_BATCH_TOKENS") or "").strip()),
            max_elements=env_int(env, "WARMSTART_MAX_ELEMENTS", cls.max_elements, 1, 1 << 31),
            max_hold_ms=env_int(env, "WARMSTART_MAX_HOLD_MS", cls.max_hold_ms, 0, 900_000),
            verify_sha256=env_bool(env, "WARMSTART_VERIFY_SHA256", cls.verify_sha256),
            threads=threads or None,
            warmup=warmup_at_init(env),
            lean_start=lean_start_on(env),
            device=device,
            model_uri=model_uri,
            models=models,
            idle_unload_s=env_int(env, "WARMSTART_IDLE_UNLOAD_S", cls.idle_unload_s, 0, 7 * 86_400),
            model_budget_mb=env_int(env, "WARMSTART_MODEL_BUDGET_MB", cls.model_budget_mb, 0, 10_000_000),
            model_pointer=pointer,
            pointer_check_s=env_int(env, "WARMSTART_POINTER_CHECK_S", cls.pointer_check_s, 1, 86_400),
            http_status=http_status,
            tracemalloc_s=env_int(env, "WARMSTART_TRACEMALLOC_S", cls.tracemalloc_s, 0, 3600),
            tokenizer_shortcut=env_bool(env, "WARMSTART_TOKENIZER_SHORTCUT", cls.tokenizer_shortcut),
        )
