"""The rollout's PreTraffic hook: `warmers.pretraffic.lambda_handler`, invoked by CodeDeploy before any
traffic shifts to a new version of a model function (template.yaml, `DeploymentPreference.Hooks`).

For the new version (`WARMSTART_ROLLOUT_TARGET`, the version's ARN, set by the template):
1. warm N instances of it (`WARMSTART_ROLLOUT_WARM`, default 2) with the warmer library: every ping must
   answer, and at least one instance must;
2. ask it for the golden answers recorded in its manifest at pack time (`{"warmstart": "status",
   "golden": true}`), send each golden request as an ordinary invocation, and compare the answers
   (`warmers.golden.compare`); a model without golden answers fails unless `WARMSTART_ROLLOUT_ALLOW_NO_GOLDEN=1`;
3. report `Succeeded` or `Failed` to CodeDeploy (`PutLifecycleEventHookExecutionStatus`): Failed stops the
   deployment and the alias stays on the old version.

The hook never raises before it has reported: a hook that dies without reporting leaves the deployment
waiting for its timeout (an hour). Clients are injected (`lambda_client=`, `codedeploy_client=`) in tests.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from warmers import golden
from warmers.config import Target, WarmerConfig, integer
from warmers.fanout import Warmer, build_client, error_code

ENV_TARGET = "WARMSTART_ROLLOUT_TARGET"
ENV_WARM = "WARMSTART_ROLLOUT_WARM"
ENV_ALLOW_NO_GOLDEN = "WARMSTART_ROLLOUT_ALLOW_NO_GOLDEN"
SUCCEEDED, FAILED = "Succeeded", "Failed"


@dataclass
class Verdict:
    target: str
    checks: list[dict[str, Any]] = field(default_factory=list)
    model: str | None = None
    duration_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c["ok"] for c in self.checks)

    def check(self, name: str, ok: bool, detail: str, **facts: Any) -> bool:
        self.checks.append({"check": name, "ok": ok, "detail": detail, **facts})
        return ok

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "status": SUCCEEDED if self.ok else FAILED,
            "model": self.model,
            "checks": self.checks,
            "duration_ms": round(self.duration_ms, 1),
        }


def _invoke(client: Any, target: str, payload: Mapping[str, Any]) -> tuple[Any, str | None]:
    """(reply, error) of one RequestResponse invoke of the version."""
    try:
        response = client.invoke(FunctionName=target, InvocationType="RequestResponse", Payload=json.dumps(payload))
        raw = response["Payload"].read()
    except Exception as exc:
        code, message = error_code(exc)
        return None, f"{code}: {message}"
    try:
        reply = json.loads(raw) if raw else None
    except ValueError:
        return None, f"reply is not JSON: {raw[:200]!r}"
    if response.get("FunctionError"):
        reply = reply if isinstance(reply, dict) else {}
        return None, f"{reply.get('errorType', 'FunctionError')}: {str(reply.get('errorMessage', ''))[:300]}"
    return reply, None


def verify(target: str, warm: int, lambda_client: Any, *, allow_no_golden: bool = False, hold_ms: int = 250) -> Verdict:
    """Warm the version and check its golden answers; never raises (every failure is a failed check)."""
    started = time.perf_counter()
    verdict = Verdict(target)
    try:
        _verify(verdict, target, warm, lambda_client, allow_no_golden, hold_ms)
    except Exception as exc:  # a hook that raises never reports: turn anything unexpected into a verdict
        code, message = error_code(exc)
        verdict.check("hook", False, f"{code}: {message}")
    verdict.duration_ms = (time.perf_counter() - started) * 1000
    return verdict


def _verify(verdict: Verdict, target: str, warm: int, client: Any, allow_no_golden: bool, hold_ms: int) -> None:
    warmer = Warmer(WarmerConfig(hold_ms=hold_ms, max_attempts=3), boto3_client=client)
    report = warmer.warm_target(Target(target, warm), warm, f"rollout: warm {warm} before traffic", "pretraffic")
    facts = report.to_dict()
    errors = [e for e in facts["errors"] if e["type"] != "DuplicateInstance"]
    warmed_ok = facts["distinct"] >= 1 and not errors
    detail = f"{facts['distinct']} of {warm} instances answered" + (f"; errors: {errors}" if errors else "")
    if not verdict.check("warm", warmed_ok, detail, asked=warm, distinct=facts["distinct"], cold=facts["cold"]):
        return
    status, error = _invoke(client, target, {"warmstart": "status", "golden": True})
    if error is not None or not isinstance(status, dict):
        verdict.check("golden", False, f"status request failed: {error}")
        return
    verdict.model = status.get("model")
    cases = (status.get("golden") or {}).get("cases") or []
    tolerance = (status.get("golden") or {}).get("tolerance")
    if not cases:
        verdict.check("golden", allow_no_golden, f"{verdict.model}: no golden answers in the manifest")
        return
    for i, case in enumerate(cases):
        reply, error = _invoke(client, target, case["request"])
        if error is not None or not isinstance(reply, dict):
            verdict.check(f"golden[{i}]", False, f"request failed: {error}")
            continue
        if reply.get("model") != verdict.model:
            verdict.check(f"golden[{i}]", False, f"answered by {reply.get('model')}, expected {verdict.model}")
            continue
        differs = golden.compare(case, reply.get(case.get("key", "")), tolerance)
        verdict.check(f"golden[{i}]", differs is None, differs or "matches")


def report_status(codedeploy: Any, event: Mapping[str, Any], status: str) -> None:
    codedeploy.put_lifecycle_event_hook_execution_status(
        deploymentId=event["DeploymentId"],
        lifecycleEventHookExecutionId=event["LifecycleEventHookExecutionId"],
        status=status,
    )


def lambda_handler(
    event: Mapping[str, Any],
    context: Any = None,
    *,
    environ: Mapping[str, str] | None = None,
    lambda_client: Any = None,
    codedeploy_client: Any = None,
) -> dict[str, Any]:
    env = os.environ if environ is None else environ
    target = env.get(ENV_TARGET, "").strip()
    try:
        warm = integer(ENV_WARM, env.get(ENV_WARM, "2"), 1, 100)
        if not target:
            raise ValueError(f"{ENV_TARGET} is not set (the new version's ARN)")
        if lambda_client is None:  # WARMSTART_WARM_ENDPOINT_URL points it at the local Lambda
            lambda_client = build_client(WarmerConfig.from_environ(env, read_timeout_s=60.0))
        verdict = verify(target, warm, lambda_client, allow_no_golden=env.get(ENV_ALLOW_NO_GOLDEN) == "1")
    except Exception as exc:
        verdict = Verdict(target or "?")
        verdict.check("config", False, f"{type(exc).__name__}: {exc}")
    body = verdict.to_dict()
    if codedeploy_client is None:
        codedeploy_client = build_client(WarmerConfig(region=env.get("AWS_REGION")), service="codedeploy")
    report_status(codedeploy_client, event, body["status"])
    # One JSON record with the keys every warmstart line has; FAILED as ERROR so an alarm can key on it.
    level = "INFO" if verdict.ok else "ERROR"
    record = {"warmstart_rollout": body, "level": level, "message": f"pretraffic {body['status']}"}
    print(json.dumps({**record, "timestamp": _timestamp()}, separators=(",", ":")), flush=True)
    return body


def _timestamp() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"
