"""Settings of one local Lambda function (what `warmstart local` exposes as flags)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

InitType = Literal["on-demand", "provisioned-concurrency", "snap-start"]
INIT_TYPES: tuple[InitType, ...] = ("on-demand", "provisioned-concurrency", "snap-start")
CgroupWant = Literal["auto", "v2", "v1", "off"]
CGROUP_WANTS: tuple[CgroupWant, ...] = ("auto", "v2", "v1", "off")
Jitter = Literal["uniform", "exponential", "normal", "fixed"]
JITTERS: tuple[Jitter, ...] = ("uniform", "exponential", "normal", "fixed")
# A Function URL's InvokeMode (AWS::Lambda::Url): BUFFERED answers once the function is done;
# RESPONSE_STREAM sends a streamed response to the client as it comes.
InvokeMode = Literal["BUFFERED", "RESPONSE_STREAM"]
INVOKE_MODES: tuple[InvokeMode, ...] = ("BUFFERED", "RESPONSE_STREAM")
# The local default memory size is template.yaml's MemorySize default, so that local cold starts and
# latencies predict the deployed function's (a unit test keeps the two equal). aws-lambda-rie says 3008.
DEFAULT_MEMORY_MB = 2048
LATEST = "$LATEST"
REPO_ROOT = str(Path(__file__).resolve().parents[2])  # infra/local/config.py -> the repository root

# Variables a Lambda sandbox never inherits from the host: the first switches awslambdaric into forked
# multi-concurrent workers, the others would point its log sink at descriptors that do not exist here.
_SCRUBBED = ("AWS_LAMBDA_MAX_CONCURRENCY", "_LAMBDA_TELEMETRY_LOG_FD", "_LAMBDA_TELEMETRY_LOG_FD_PROVIDER_SOCKET")


@dataclass(frozen=True, slots=True)
class LocalLambdaConfig:
    function_name: str = "warmstart"
    handler: str = "handler.app.lambda_handler"
    # What an instance runs: empty = `python -m awslambdaric <handler>` (a managed runtime's bootstrap);
    # else this argv (a container image's ENTRYPOINT + CMD, e.g. `python -m handler`, which speaks the
    # Runtime API itself and can stream). A leading "python" is `python` below.
    command: tuple[str, ...] = ()
    invoke_mode: InvokeMode = "BUFFERED"  # the local Function URL's (/lambda-url/<function>/...)
    task_root: str = REPO_ROOT
    host: str = "127.0.0.1"
    port: int = 9000  # 0 picks a free port
    memory_mb: int = DEFAULT_MEMORY_MB  # sets each instance's CPU quota and memory limit (infra.local.cgroups)
    cgroups: CgroupWant = "auto"  # v2 where delegated, else v1; "off": memory size only shows in REPORT
    timeout_s: float = 30.0
    init_timeout_s: float = 10.0  # Lambda's on-demand init limit
    max_concurrency: int = 10
    keep_alive_s: float = 300.0
    init_type: InitType = "on-demand"
    # Fork restored instances from a template that ran init and the before-snapshot hooks once
    # (snap-start only). Lambda snapshots published versions only; locally $LATEST is snapshotted too.
    snapshot: bool = False
    snapshot_timeout_s: float = 900.0  # Lambda lets init run up to 15 min when it makes a snapshot
    region: str = "us-east-1"
    account_id: str = "123456789012"
    versions: tuple[str, ...] = ("1",)
    aliases: Mapping[str, str] = field(default_factory=lambda: {"live": "1"})
    environment: Mapping[str, str] = field(default_factory=dict)  # extra variables, e.g. WARMSTART_MODEL
    python: str = sys.executable
    echo_logs: bool = False  # copy instance output to our stderr, prefixed with the instance id
    # Refuse Runtime API connections that do not come from the instance's own process (infra.local.peer).
    runtime_api_guard: bool = True
    # Inits (and restores) allowed to run at once; the others wait for a slot before their init clock
    # starts. 0 = as many as the host's cores can give each its full quota (at least 1).
    init_slots: int = 0
    # Event invokes accepted but not yet delivered: past either bound the Invoke API answers 429.
    max_queued_events: int = 10_000
    max_queued_event_bytes: int = 256 * 1024 * 1024
    history_bytes: int = 16 * 1024 * 1024  # LocalLambda.history keeps at most this much (payloads truncated)
    # Event invokes that fail are retried max_retry_attempts times, after 60 s then 120 s times
    # async_retry_scale (tests shrink it), and dropped once older than max_event_age_s.
    max_retry_attempts: int = 2
    async_retry_scale: float = 1.0
    max_event_age_s: float = 21_600.0
    on_failure: str | None = None  # a file: one JSON destination record a line for each dropped event
    # Routing jitter: each invoke waits a random delay first (mean jitter_ms), as Lambda's front end adds.
    jitter_ms: float = 0.0
    jitter: Jitter = "uniform"

    def __post_init__(self) -> None:
        if self.init_type not in INIT_TYPES:
            raise ValueError(f"init_type must be one of {', '.join(INIT_TYPES)}; got {self.init_type!r}")
        if self.snapshot and self.init_type != "snap-start":
            raise ValueError(f"snapshot needs init_type 'snap-start'; got {self.init_type!r}")
        if self.max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if not 128 <= self.memory_mb <= 10_240:
            raise ValueError(f"memory_mb must be in [128, 10240] as on Lambda; got {self.memory_mb}")
        if self.cgroups not in CGROUP_WANTS:
            raise ValueError(f"cgroups must be one of {', '.join(CGROUP_WANTS)}; got {self.cgroups!r}")
        if self.invoke_mode not in INVOKE_MODES:
            raise ValueError(f"invoke_mode must be one of {', '.join(INVOKE_MODES)}; got {self.invoke_mode!r}")
        if self.command and self.snapshot:
            raise ValueError("snapshot forks awslambdaric's handler from a template: it cannot run a command")
        if self.jitter not in JITTERS:
            raise ValueError(f"jitter must be one of {', '.join(JITTERS)}; got {self.jitter!r}")
        if not 0 <= self.max_retry_attempts <= 2:
            raise ValueError("max_retry_attempts must be 0, 1 or 2 as on Lambda")
        # Lambda's range; a scaled-down retry clock (tests, benches) may scale the age down with it.
        if not 60 * min(1.0, self.async_retry_scale) <= self.max_event_age_s <= 21_600:
            raise ValueError("max_event_age_s must be in [60, 21600] as on Lambda (times async_retry_scale below 1)")
        for alias, version in self.aliases.items():
            if version != LATEST and version not in self.versions:
                raise ValueError(f"alias {alias!r} points at unknown version {version!r}")

    def argv(self) -> list[str]:
        """The instance's process: the command (a leading "python" is this config's interpreter), else
        awslambdaric with the handler."""
        if not self.command:
            return [self.python, "-m", "awslambdaric", self.handler]
        first, *rest = self.command
        return [self.python if first == "python" else first, *rest]

    @property
    def function_arn(self) -> str:
        return f"arn:aws:lambda:{self.region}:{self.account_id}:function:{self.function_name}"

    def instance_environ(
        self, *, version: str, runtime_api: str, instance_id: str, environ: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """The environment of one instance: the host's (minus what Lambda never sets) plus Lambda's own."""
        env = dict(os.environ if environ is None else environ)
        for name in _SCRUBBED:
            env.pop(name, None)
        python_path = env.get("PYTHONPATH")
        env.update(
            AWS_LAMBDA_FUNCTION_NAME=self.function_name,
            AWS_LAMBDA_FUNCTION_VERSION=version,
            AWS_LAMBDA_FUNCTION_MEMORY_SIZE=str(self.memory_mb),
            AWS_LAMBDA_LOG_GROUP_NAME=f"/aws/lambda/{self.function_name}",
            AWS_LAMBDA_LOG_STREAM_NAME=f"{time.strftime('%Y/%m/%d', time.gmtime())}/[{version}]{instance_id}",
            AWS_REGION=self.region,
            AWS_DEFAULT_REGION=self.region,
            AWS_LAMBDA_INITIALIZATION_TYPE=self.init_type,
            AWS_LAMBDA_RUNTIME_API=runtime_api,
            AWS_EXECUTION_ENV=f"AWS_Lambda_python{sys.version_info.major}.{sys.version_info.minor}",
            LAMBDA_TASK_ROOT=self.task_root,
            _HANDLER=self.handler,
            TZ=":UTC",
            PYTHONPATH=self.task_root if not python_path else f"{self.task_root}{os.pathsep}{python_path}",
        )
        env.update(self.environment)
        return env
