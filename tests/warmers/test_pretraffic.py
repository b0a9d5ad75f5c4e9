"""The PreTraffic hook: CodeDeploy's call checked with botocore's Stubber, verdicts against a fake version, and
for real against the local Lambda running the real handler (a version whose golden answers differ fails)."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from handler.core.manifest import load_manifest
from warmers import golden, pretraffic

EVENT = {"DeploymentId": "d-ABC123", "LifecycleEventHookExecutionId": "hook-exec-1"}
TARGET = "arn:aws:lambda:us-east-1:123456789012:function:model:7"
ENV = {pretraffic.ENV_TARGET: TARGET, pretraffic.ENV_WARM: "2"}


@pytest.fixture
def codedeploy() -> Iterator[tuple[Any, Stubber]]:
    client = boto3.client("codedeploy", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stubber:
        yield client, stubber


def expect_status(stubber: Stubber, status: str) -> None:
    params = {"deploymentId": "d-ABC123", "lifecycleEventHookExecutionId": "hook-exec-1", "status": status}
    stubber.add_response("put_lifecycle_event_hook_execution_status", {"lifecycleEventHookExecutionId": "x"}, params)


class FakeVersion:
    """A Lambda client whose one function answers pings (distinct instances), status and embeddings."""

    def __init__(self, vectors: list[list[float]], golden_cases: list[dict[str, Any]] | None) -> None:
        self.vectors, self.golden, self.pings = vectors, golden_cases, 0
        self.calls: list[dict[str, Any]] = []

    def invoke(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(kw)
        event = json.loads(kw["Payload"])
        if event.get("warmer"):
            self.pings += 1
            reply: Any = {"warm": True, "instance_id": f"i{self.pings}", "cold": True}
        elif event.get("warmstart") == "status":
            cases = self.golden
            reply = {"model": "m@2", "golden": {"cases": cases, "tolerance": golden.TOLERANCE} if cases else None}
        else:
            reply = {"embeddings": self.vectors[: len(event["inputs"])], "model": "m@2"}
        return {"StatusCode": 200, "Payload": io.BytesIO(json.dumps(reply).encode())}


CASE = {"request": {"inputs": ["a"]}, "key": "embeddings", "expected": [[0.6, 0.8]]}


@pytest.mark.parametrize(
    ("vectors", "cases", "status", "failed_check"),
    [
        ([[0.6, 0.8]], [CASE], "Succeeded", None),
        ([[0.6000001, 0.8]], [CASE], "Succeeded", None),  # within the cosine tolerance
        ([[0.8, 0.6]], [CASE], "Failed", "golden[0]"),  # a different answer
        ([[0.6, 0.8]], None, "Failed", "golden"),  # nothing to check is not a pass
    ],
)
def test_verdict_reported_to_codedeploy(
    codedeploy: tuple[Any, Stubber],
    vectors: list[list[float]],
    cases: list[dict[str, Any]] | None,
    status: str,
    failed_check: str | None,
) -> None:
    client, stubber = codedeploy
    expect_status(stubber, status)
    fake = FakeVersion(vectors, cases)
    body = pretraffic.lambda_handler(EVENT, environ=ENV, lambda_client=fake, codedeploy_client=client)
    stubber.assert_no_pending_responses()
    assert body["status"] == status
    assert fake.pings == 2 and all(c["FunctionName"] == TARGET for c in fake.calls)
    failed = [c["check"] for c in body["checks"] if not c["ok"]]
    assert failed == ([failed_check] if failed_check else [])


def test_a_broken_version_fails_without_raising(codedeploy: tuple[Any, Stubber]) -> None:
    class Broken:
        def invoke(self, **kw: Any) -> dict[str, Any]:
            reply = {"errorType": "Runtime.ImportModuleError", "errorMessage": "no module"}
            return {"StatusCode": 200, "FunctionError": "Unhandled", "Payload": io.BytesIO(json.dumps(reply).encode())}

    client, stubber = codedeploy
    expect_status(stubber, "Failed")
    body = pretraffic.lambda_handler(EVENT, environ=ENV, lambda_client=Broken(), codedeploy_client=client)
    assert body["checks"][0]["check"] == "warm" and "ImportModuleError" in body["checks"][0]["detail"]


def test_missing_target_fails(codedeploy: tuple[Any, Stubber]) -> None:
    client, stubber = codedeploy
    expect_status(stubber, "Failed")
    body = pretraffic.lambda_handler(EVENT, environ={}, lambda_client=object(), codedeploy_client=client)
    assert body["checks"][0]["check"] == "config"


def test_compare_tolerances() -> None:
    assert golden.compare({"key": "scores", "expected": [0.5, 0.25]}, [0.50001, 0.25]) is None
    assert golden.compare({"key": "scores", "expected": [0.5, 0.25]}, [0.6, 0.25]) is not None
    assert golden.compare({"key": "embeddings", "expected": [[1.0, 0.0]]}, [[1.0, 0.0], [0.0, 1.0]]) is not None
    assert golden.compare({"key": "labels", "expected": ["a"]}, ["b"]) == "value differs"


# -- for real: the local Lambda running the real handler ----------------------------------------------------


@pytest.fixture(scope="module")
def tampered_model(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model whose manifest's golden answers are not what the model answers (a rotated vector)."""
    out = tmp_path_factory.mktemp("tampered") / "model"
    out.mkdir()
    for f in model_dir.iterdir():
        if f.name != "manifest.json":
            (out / f.name).symlink_to(f)
    manifest = json.loads((model_dir / "manifest.json").read_text())
    if "golden_file" in manifest:  # in their own file (infra.pack.golden), listed with its size and SHA-256
        recorded = json.loads((model_dir / manifest["golden_file"]).read_text())
    else:  # inline, as a model packed before they moved out of the manifest
        recorded = manifest.pop("golden")
    first = recorded["cases"][0]["expected"][0]
    first[:] = first[1:] + first[:1]
    # The tampered answers as a pack would record them (size and SHA-256 listed): only the answer differs.
    data = json.dumps(recorded).encode()
    (out / "golden.json").unlink(missing_ok=True)
    (out / "golden.json").write_bytes(data)
    manifest["files"]["golden.json"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest["golden_file"] = "golden.json"
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


@pytest.mark.integration
@pytest.mark.parametrize(("which", "status"), [("packed", "Succeeded"), ("tampered", "Failed")])
def test_hook_against_the_local_lambda(
    which: str, status: str, model_dir: Path, request: pytest.FixtureRequest, codedeploy: tuple[Any, Stubber]
) -> None:
    from infra.local.config import LocalLambdaConfig
    from infra.local.server import LocalLambda
    from warmers.config import WarmerConfig
    from warmers.fanout import build_client

    model = model_dir if which == "packed" else request.getfixturevalue("tampered_model")
    assert load_manifest(model_dir).golden()  # `warmstart pack` recorded them
    config = LocalLambdaConfig(
        port=0,
        versions=("1", "2"),
        aliases={"live": "1"},
        timeout_s=60.0,
        init_timeout_s=60.0,
        environment={"WARMSTART_MODEL": str(model), "WARMSTART_WARMUP": "0"},
    )
    client, stubber = codedeploy
    expect_status(stubber, status)
    with LocalLambda(config) as local:
        lam = build_client(WarmerConfig(endpoint_url=local.endpoint, read_timeout_s=60.0))
        environ = {pretraffic.ENV_TARGET: f"{config.function_arn}:2", pretraffic.ENV_WARM: "2"}
        body = pretraffic.lambda_handler(EVENT, environ=environ, lambda_client=lam, codedeploy_client=client)
        spawned = local.pool.spawned
    stubber.assert_no_pending_responses()
    assert body["status"] == status, body
    assert body["model"] == "all-minilm-l6-v2@0.1.0" and spawned == 2  # two instances of version 2 warmed
    golden_checks = [c for c in body["checks"] if c["check"].startswith("golden")]
    assert len(golden_checks) == 2
    assert [c["ok"] for c in golden_checks] == ([True, True] if which == "packed" else [False, True])
