"""Which host runs this process, and what follows from it: the payload limit, the drain time, the port.

One image serves every host (`python -m handler`), so the host is detected from what each platform sets:

| host | detected by | payload limit |
|---|---|---|
| `lambda` | `AWS_LAMBDA_RUNTIME_API` | 6 MB (synchronous invoke) |
| `sagemaker` | the `serve` argument, `SAGEMAKER_BIND_TO_PORT`, `SAGEMAKER_SAFE_PORT_RANGE` | 6 MB (real-time) |
| `sagemaker-serverless` | only `WARMSTART_HOST` (the container cannot tell) | 4 MB |
| `cloud-run` | `K_SERVICE` without `KUBERNETES_SERVICE_HOST` | 32 MB (HTTP/1) |
| `knative` | `K_SERVICE` with `KUBERNETES_SERVICE_HOST` | 32 MB |
| `kubernetes` | `KUBERNETES_SERVICE_HOST` | 32 MB |
| `generic` | nothing of the above (a laptop, CI) | 6 MB (Lambda's, so local runs refuse what Lambda would) |

`WARMSTART_HOST` names the host outright; `WARMSTART_MAX_PAYLOAD_BYTES` sets the limit whatever the host.
The platform enforces its own limit before a request reaches us; ours is the backstop that keeps a body
we would refuse anyway from being buffered.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from handler.core.config import LAMBDA_PAYLOAD_LIMIT, env_int
from handler.core.errors import ConfigError
from handler.http_host.standby import standby_after_s

HostName = Literal["lambda", "sagemaker", "sagemaker-serverless", "cloud-run", "knative", "kubernetes", "generic"]
HOST_NAMES: tuple[HostName, ...] = (
    "lambda",
    "sagemaker",
    "sagemaker-serverless",
    "cloud-run",
    "knative",
    "kubernetes",
    "generic",
)
MB = 1024 * 1024
PAYLOAD_LIMITS: dict[HostName, int] = {
    "lambda": LAMBDA_PAYLOAD_LIMIT,
    "sagemaker": 6 * MB,
    "sagemaker-serverless": 4 * MB,
    "cloud-run": 32 * MB,
    "knative": 32 * MB,
    "kubernetes": 32 * MB,
    "generic": LAMBDA_PAYLOAD_LIMIT,
}
# Below every platform's kill deadline after SIGTERM: Cloud Run's 10 s (the tightest), Kubernetes' default
# terminationGracePeriodSeconds of 30 s. A longer drain on Kubernetes needs a longer grace period too.
DEFAULT_DRAIN_S = 8
DEFAULT_PORT = 8080
# A slow client may take this long to send its request line and headers, and then its body; past it, 408.
# Both well above any real client on any network (a 6 MB body at 2 Mbit/s is 25 s), well below "forever".
DEFAULT_HEADER_TIMEOUT_S = 10
DEFAULT_BODY_TIMEOUT_S = 60
# Past its first DEFAULT_BODY_GRACE_S, a body must keep arriving at DEFAULT_BODY_MIN_RATE bytes/s on average
# (Apache mod_reqtimeout's MinRate: by `grace + received / rate` seconds after the headers), else 408. Real
# clients write a body right after its headers; 5 s covers two lost segments' retransmission (1 + 2 s), and
# 1 KB/s is ~250x under a 2 Mbit/s uplink, so only a deliberate trickle is cut, and holding a connection
# for the whole body timeout now costs its sender 1 KB/s of upload.
DEFAULT_BODY_GRACE_S = 5
DEFAULT_BODY_MIN_RATE = 1024
# Connections held at once: at most this, and always below the process's file limit (RLIMIT_NOFILE), half of
# which stays for the model's files, the runtime's threads and connections answered 503 while over the cap.
DEFAULT_MAX_CONNECTIONS = 1000
FILES_KEPT = 64
# Connections taken over the cap for health checks only (`/ping`, `/healthz`, `/health`, `GET /`), so a probe
# is answered while bodies in flight hold every connection; they come out of the half of the files kept.
DEFAULT_HEALTH_RESERVE = 16
# Bytes of request bodies held at once (read, queued or running; handler/http_host/budget.py), as payload limits:
# 4 x 32 MB = 128 MB on Knative / Cloud Run, 4 x 6 MB = 24 MB elsewhere. Under the deploy manifests' 1 GiB
# that leaves the worst request's ~470 MB (docs/configuration.md#memory) its room; bodies of the usual size
# (kilobytes) never come near it.
BODY_BUDGET_PAYLOADS = 4
_SAGEMAKER_HINTS = ("SAGEMAKER_BIND_TO_PORT", "SAGEMAKER_SAFE_PORT_RANGE")


def parse_host(value: str) -> HostName:
    for name in HOST_NAMES:
        if value == name:
            return name
    raise ConfigError(f"WARMSTART_HOST={value!r}; valid values: {', '.join(HOST_NAMES)}")


def detect_host(environ: Mapping[str, str] | None = None, serve: bool = False) -> HostName:
    env = os.environ if environ is None else environ
    named = env.get("WARMSTART_HOST", "").strip()
    if named:
        return parse_host(named)
    if env.get("AWS_LAMBDA_RUNTIME_API"):
        return "lambda"
    if serve or any(env.get(k) for k in _SAGEMAKER_HINTS):
        return "sagemaker"
    if env.get("K_SERVICE"):
        return "knative" if env.get("KUBERNETES_SERVICE_HOST") else "cloud-run"
    if env.get("KUBERNETES_SERVICE_HOST"):
        return "kubernetes"
    return "generic"


@dataclass(frozen=True)
class HostSettings:
    """What the HTTP host needs to know about where it runs; `from_environ` reads it once at startup."""

    name: HostName = "generic"
    payload_limit: int = LAMBDA_PAYLOAD_LIMIT
    drain_s: int = DEFAULT_DRAIN_S
    port: int = DEFAULT_PORT
    header_timeout_s: int = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: int = DEFAULT_BODY_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    body_grace_s: int = DEFAULT_BODY_GRACE_S
    body_min_rate: int = DEFAULT_BODY_MIN_RATE  # bytes/s; 0: no minimum (the body timeout alone)
    health_reserve: int = DEFAULT_HEALTH_RESERVE
    body_budget: int = BODY_BUDGET_PAYLOADS * LAMBDA_PAYLOAD_LIMIT  # bytes of bodies held at once
    standby_after_s: float | None = None  # idle seconds before the engine sleeps (handler/http_host/standby.py)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None, serve: bool = False) -> HostSettings:
        env = os.environ if environ is None else environ
        name = detect_host(env, serve)
        # SageMaker names the port in multi-container endpoints; every other host uses PORT.
        port_key = "SAGEMAKER_BIND_TO_PORT" if env.get("SAGEMAKER_BIND_TO_PORT", "").strip() else "PORT"
        payload_limit = env_int(env, "WARMSTART_MAX_PAYLOAD_BYTES", PAYLOAD_LIMITS[name], 1, 1 << 31)
        return cls(
            name=name,
            payload_limit=payload_limit,
            drain_s=env_int(env, "WARMSTART_DRAIN_S", DEFAULT_DRAIN_S, 0, 3600),
            port=env_int(env, port_key, DEFAULT_PORT, 1, 65535),
            header_timeout_s=env_int(env, "WARMSTART_HTTP_HEADER_TIMEOUT_S", DEFAULT_HEADER_TIMEOUT_S, 1, 3600),
            body_timeout_s=env_int(env, "WARMSTART_HTTP_BODY_TIMEOUT_S", DEFAULT_BODY_TIMEOUT_S, 1, 3600),
            max_connections=env_int(env, "WARMSTART_HTTP_MAX_CONNECTIONS", max_connections(), 1, max_connections()),
            body_grace_s=env_int(env, "WARMSTART_HTTP_BODY_GRACE_S", DEFAULT_BODY_GRACE_S, 0, 3600),
            body_min_rate=env_int(env, "WARMSTART_HTTP_BODY_MIN_RATE", DEFAULT_BODY_MIN_RATE, 0, 1 << 30),
            health_reserve=env_int(env, "WARMSTART_HTTP_HEALTH_RESERVE", DEFAULT_HEALTH_RESERVE, 0, 1000),
            body_budget=env_int(
                env, "WARMSTART_HTTP_BODY_BUDGET_BYTES", BODY_BUDGET_PAYLOADS * payload_limit, 1, 1 << 40
            ),
            standby_after_s=standby_after_s(env),
        )

    def describe_limit(self) -> str:
        return f"{self.payload_limit} bytes ({self.name})"


def max_connections(files: int | None = None) -> int:
    """The most connections the host holds at once: DEFAULT_MAX_CONNECTIONS, or half the file limit (less
    what the process keeps) when that is lower. `files` is RLIMIT_NOFILE's soft limit, read when None."""
    if files is None:
        files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if files == resource.RLIM_INFINITY:
            return DEFAULT_MAX_CONNECTIONS
    return max(1, min(DEFAULT_MAX_CONNECTIONS, (files - FILES_KEPT) // 2))


def accept_backlog(max_connections: int) -> int:
    """The listen backlog, which is also how many connections asyncio accepts in one turn of the loop, before
    any is counted against the cap: a quarter of the cap keeps a burst within the files left (uvicorn: 2048)."""
    return max(16, min(2048, max_connections // 4))
