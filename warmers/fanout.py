"""The fan-out: N parallel RequestResponse pings per target, each held `hold_ms` so they overlap and Lambda has
to place them on N distinct instances; throttles retried a bounded number of times with full-jitter backoff.

The warmer owns the retry policy, so the boto3 client it builds has botocore's retries off and bounded
connect/read timeouts; an injected client (`boto3_client=`) is used as given.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from warmers import payloads
from warmers.config import Target, WarmerConfig
from warmers.report import PingResult, RunReport, TargetReport

# Error codes worth another attempt: the account or function is at its concurrency limit right now.
THROTTLES = frozenset({"TooManyRequestsException", "ThrottlingException", "TooManyRequests"})
MAX_PARALLEL_TARGETS = 8

# target -> (N, why N)
Chooser = Callable[[Target], tuple[int, str]]


def build_client(config: WarmerConfig, service: str = "lambda") -> Any:
    """A boto3 client with our timeouts, botocore retries off, and a connection per parallel ping."""
    import boto3  # type: ignore[import-untyped]  # deferred: `warmstart --help` should not pay ~300 ms for it
    from botocore.config import Config  # type: ignore[import-untyped]

    session = boto3.session.Session()
    kwargs: dict[str, Any] = {
        "region_name": config.region or session.region_name or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
        "config": Config(
            connect_timeout=config.connect_timeout_s,
            read_timeout=config.read_timeout_s,
            retries={"total_max_attempts": 1},
            # One connection per ping in flight, or pings queue for one and stop overlapping.
            max_pool_connections=max(config.max_pool_connections, sum(t.concurrency for t in config.targets)),
        ),
    }
    if config.endpoint_url:
        kwargs["endpoint_url"] = config.endpoint_url
        if session.get_credentials() is None:  # a local endpoint does not check them, boto3 still wants some
            kwargs.update(aws_access_key_id="local", aws_secret_access_key="local")
    return session.client(service, **kwargs)


def error_code(exc: BaseException) -> tuple[str, str]:
    """(code, message) of a botocore ClientError (its error code) or any other failure (its class name)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error") or {}
        return str(error.get("Code") or type(exc).__name__), str(error.get("Message") or exc)
    return type(exc).__name__, str(exc)


class Warmer:
    """Warms targets; one boto3 client for its lifetime (thread-safe for calls, so the pings share it)."""

    def __init__(
        self,
        config: WarmerConfig | None = None,
        *,
        boto3_client: Any = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config or WarmerConfig()
        self.client = boto3_client if boto3_client is not None else build_client(self.config)
        self._sleep = sleep
        self._rng = rng or random.Random()

    def run(
        self,
        targets: Sequence[Target] | None = None,
        *,
        chooser: Chooser | None = None,
        prewarm: bool = False,
        correlation_id: str | None = None,
    ) -> RunReport:
        """Warm every target (in parallel, each with its own fan-out); one failing never stops the others."""
        chosen = tuple(self.config.targets if targets is None else targets)
        report = RunReport(correlation_id or uuid.uuid4().hex[:12], self.config.hold_ms, prewarm)
        started = time.perf_counter()
        deadline = started + self.config.deadline_s
        plans = [(t, *self._plan(t, chooser, prewarm)) for t in chosen]
        if plans:
            with ThreadPoolExecutor(min(len(plans), MAX_PARALLEL_TARGETS), thread_name_prefix="warm-target") as pool:
                futures = [
                    pool.submit(self.warm_target, t, n, why, report.correlation_id, deadline) for t, n, why in plans
                ]
                report.targets = [f.result() for f in futures]
        report.duration_ms = (time.perf_counter() - started) * 1000
        return report

    def _plan(self, target: Target, chooser: Chooser | None, prewarm: bool) -> tuple[int, str]:
        if prewarm:
            return target.concurrency, f"prewarm: every target once at full concurrency ({target.concurrency})"
        if chooser is None:
            return target.concurrency, f"fixed concurrency {target.concurrency}"
        try:
            return chooser(target)
        except Exception as exc:  # a history source down must not stop the warming itself
            code, message = error_code(exc)
            return (
                target.concurrency,
                f"history unavailable ({code}: {message}); fixed concurrency {target.concurrency}",
            )

    def warm_target(
        self, target: Target, n: int, reason: str, correlation_id: str, deadline: float | None = None
    ) -> TargetReport:
        """N overlapping pings at one target; the report counts the distinct instances that answered."""
        report = TargetReport(target.label, n, reason, payload_style=target.payload_style)
        if deadline is None:
            deadline = time.perf_counter() + self.config.deadline_s
        started = time.perf_counter()
        if n > 0:
            # One thread per ping: a smaller pool would serialize them and let one instance answer several.
            with ThreadPoolExecutor(n, thread_name_prefix="warm-ping") as pool:
                futures = [pool.submit(self._ping, target, i, n, correlation_id, deadline) for i in range(n)]
                report.pings = [f.result() for f in futures]
        report.duration_ms = (time.perf_counter() - started) * 1000
        return report

    def _ping(self, target: Target, index: int, total: int, correlation_id: str, deadline: float) -> PingResult:
        """One ping with its bounded retries. Never raises: every failure ends up in the result."""
        result = PingResult(index)
        body, client_context = payloads.ping(
            target.payload_style, index=index, total=total, hold_ms=self.config.hold_ms, correlation_id=correlation_id
        )
        kwargs: dict[str, Any] = {"FunctionName": target.function, "InvocationType": "RequestResponse", "Payload": body}
        if target.qualifier:
            kwargs["Qualifier"] = target.qualifier
        if client_context is not None:
            kwargs["ClientContext"] = client_context
        started = time.perf_counter()
        for attempt in range(1, self.config.max_attempts + 1):  # bounded: no loop here runs forever
            result.attempts = attempt
            try:
                response = self.client.invoke(**kwargs)
                self._read(response, result)
                break
            except Exception as exc:  # botocore errors, classified by code without importing botocore here
                result.error_type, result.error_message = error_code(exc)
                if result.error_type not in THROTTLES:
                    break
                result.throttled += 1
                if attempt == self.config.max_attempts:
                    break
                # Full jitter: N throttled pings must not come back in lockstep and throttle each other again.
                delay = self._rng.uniform(0, min(self.config.backoff_cap_s, self.config.backoff_base_s * 2**attempt))
                if time.perf_counter() + delay >= deadline:
                    result.error_message = f"{result.error_message} (run deadline reached after {attempt} attempts)"
                    break
                self._sleep(delay)
        if result.error_type in THROTTLES:
            result.error_message = f"throttled on all {result.attempts} attempts: {result.error_message}"
        result.elapsed_ms = (time.perf_counter() - started) * 1000
        return result

    @staticmethod
    def _read(response: dict[str, Any], result: PingResult) -> None:
        stream = response.get("Payload")
        raw = stream.read() if stream is not None else b""
        result.executed_version = response.get("ExecutedVersion")
        reply = payloads.read_reply(raw)
        if response.get("FunctionError"):
            reply = reply or {}
            result.error_type = str(reply.get("errorType") or response["FunctionError"])
            result.error_message = str(reply.get("errorMessage") or "function error")[:300]
            return
        result.error_type = result.error_message = None
        if reply is not None:
            instance_id = reply.get("instance_id")
            result.instance_id = instance_id if isinstance(instance_id, str) and instance_id else None
            cold = reply.get("cold")
            result.cold = cold if isinstance(cold, bool) else None
