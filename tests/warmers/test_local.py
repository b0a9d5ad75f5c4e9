"""For real: the warmer against the local Lambda through boto3's endpoint_url, pings held so they overlap."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the fixtures live under tests/, which is not an installed package
    sys.path.insert(0, str(ROOT))

from infra.cli import main as cli  # noqa: E402
from infra.local.config import LocalLambdaConfig  # noqa: E402
from infra.local.server import LocalLambda  # noqa: E402
from warmers import app  # noqa: E402
from warmers.config import Target, WarmerConfig  # noqa: E402
from warmers.fanout import Warmer  # noqa: E402

pytestmark = pytest.mark.integration
PING = "tests.fixtures.ping_handler.handler"


@contextmanager
def local_lambda(**settings: Any) -> Iterator[LocalLambda]:
    settings.setdefault("handler", PING)
    # Noisy shared CI: generous limits so only the behaviour under test can fail.
    settings.setdefault("timeout_s", 60.0)
    settings.setdefault("init_timeout_s", 60.0)
    local = LocalLambda(LocalLambdaConfig(port=0, **settings))
    local.start()
    try:
        yield local
    finally:
        local.stop()


def test_eight_cold_then_eight_warm_distinct_instances() -> None:
    with local_lambda(max_concurrency=10) as local:
        # A hold of 1 s: all eight warm pings are in flight long before the first one is answered.
        warmer = Warmer(WarmerConfig(endpoint_url=local.endpoint, hold_ms=1000))
        first = warmer.run([Target("warmstart", 8)]).targets[0].to_dict()
        assert (first["asked"], first["distinct"], first["cold"], first["errors"]) == (8, 8, 8, []), first
        again = warmer.run([Target("warmstart", 8)]).targets[0].to_dict()
        assert (again["distinct"], again["cold"], again["errors"]) == (8, 0, []), again
        assert again["instance_ids"] == first["instance_ids"]
        assert local.pool.spawned == 8
        assert first["duration_ms"] >= 1000 and again["ok"]


def test_throttled_run_reports_the_shortfall_honestly() -> None:
    with local_lambda(max_concurrency=3) as local:
        # Retries end well inside the 2 s holds, so no retry can sneak onto a freed instance.
        config = WarmerConfig(endpoint_url=local.endpoint, hold_ms=2000, max_attempts=3, backoff_base_s=0.05)
        result = Warmer(config).run([Target("warmstart", 8)]).targets[0].to_dict()
    assert (result["asked"], result["distinct"], result["shortfall"], result["ok"]) == (8, 3, 5, False), result
    assert result["throttled"] >= 5
    assert {e["type"] for e in result["errors"]} <= {"TooManyRequestsException", "DuplicateInstance"}
    assert sum(e["count"] for e in result["errors"]) == 5, result["errors"]


def test_cli_json_alias_payload_style_and_a_missing_target() -> None:
    with local_lambda(max_concurrency=4) as local:
        argv = ["warm", "--function", "warmstart", "--function", "gone", "--concurrency", "3", "--qualifier", "live"]
        argv += ["--endpoint-url", local.endpoint, "--json", "--hold-ms", "800"]
        argv += ["--payload-style", "serverless-plugin-warmup", "--prewarm"]
        out = io.StringIO()
        with redirect_stdout(out):
            rc = cli(argv)
        sent = [json.loads(inv.payload) for inv in local.history]
        contexts = [json.loads(inv.client_context or "{}") for inv in local.history]
    report = json.loads(out.getvalue())
    ok, gone = report["targets"]
    assert rc == 1 and report["prewarm"] is True
    assert (ok["target"], ok["asked"], ok["distinct"], ok["cold"], ok["errors"]) == ("warmstart:live", 3, 3, 3, [])
    assert ok["executed_versions"] == ["1"] and isinstance(ok["duration_ms"], float)
    assert gone["errors"][0]["type"] == "ResourceNotFoundException" and gone["distinct"] == 0
    assert all(event["source"] == "serverless-plugin-warmup" and event["hold_ms"] == 800 for event in sent)
    assert all(c == {"custom": {"source": "serverless-plugin-warmup"}} for c in contexts)


def test_scheduled_handler_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with local_lambda(max_concurrency=4, environment={"PING_FAIL": "0"}) as local:
        monkeypatch.setenv("WARMSTART_WARM_TARGETS", "warmstart:live,warmstart")
        monkeypatch.setenv("WARMSTART_WARM_CONCURRENCY", "2")
        monkeypatch.setenv("WARMSTART_WARM_HOLD_MS", "800")
        monkeypatch.setenv("WARMSTART_WARM_ENDPOINT_URL", local.endpoint)
        monkeypatch.delenv("WARMSTART_WARM_HISTORY", raising=False)
        scheduled = {"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}}
        body = app.lambda_handler(scheduled, None)
    assert [(t["target"], t["distinct"], t["errors"]) for t in body["targets"]] == [
        ("warmstart:live", 2, []),
        ("warmstart", 2, []),
    ]
    assert [t["executed_versions"] for t in body["targets"]] == [["1"], ["$LATEST"]]


def test_function_errors_are_reported_not_raised() -> None:
    with local_lambda(max_concurrency=2, environment={"PING_FAIL": "1"}) as local:
        result = Warmer(WarmerConfig(endpoint_url=local.endpoint)).run([Target("warmstart", 2)]).targets[0]
    assert result.errors == [{"type": "PingFailedError", "message": "told to fail", "count": 2}]


@pytest.mark.skipif(
    not (ROOT / "models" / "default" / "manifest.json").exists(),
    reason="models/default is not packed (warmstart pack --default)",
)
def test_real_handler_answers_the_warmer() -> None:
    with local_lambda(handler="handler.app.lambda_handler", max_concurrency=2) as local:
        warmer = Warmer(WarmerConfig(endpoint_url=local.endpoint, hold_ms=1000))
        first = warmer.run([Target("warmstart", 2)]).targets[0].to_dict()
        again = warmer.run([Target("warmstart", 2, payload_style="lambda-warmer")]).targets[0].to_dict()
    assert (first["distinct"], first["cold"], first["errors"]) == (2, 2, []), first
    assert (again["distinct"], again["cold"], again["errors"]) == (2, 0, []), again


def test_scheduled_handler_with_a_history_file_chooses_n(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import time

    week = 7 * 24 * 3600
    history = tmp_path / "history.json"
    history.write_text(json.dumps({"warmstart": [[time.time() - w * week, 3] for w in (1, 2, 3)]}))
    with local_lambda(max_concurrency=6) as local:
        monkeypatch.setenv("WARMSTART_WARM_TARGETS", "warmstart")
        monkeypatch.setenv("WARMSTART_WARM_CONCURRENCY", "6")  # the ceiling
        monkeypatch.setenv("WARMSTART_WARM_HISTORY", str(history))
        monkeypatch.setenv("WARMSTART_WARM_HOLD_MS", "800")
        monkeypatch.setenv("WARMSTART_WARM_ENDPOINT_URL", local.endpoint)
        (adaptive,) = app.lambda_handler({"source": "aws.events", "detail-type": "Scheduled Event"}, None)["targets"]
        (prewarm,) = app.lambda_handler({"prewarm": True}, None)["targets"]
    assert (adaptive["asked"], adaptive["distinct"]) == (3, 3) and adaptive["reason"].startswith("adaptive: p95")
    assert (prewarm["asked"], prewarm["distinct"], prewarm["cold"]) == (6, 6, 3) and "prewarm" in prewarm["reason"]
