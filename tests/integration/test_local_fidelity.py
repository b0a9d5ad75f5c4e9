"""Details where the local Lambda answers as Lambda does: Event answers and limits, qualifier conflicts,
INIT billing, async retries and the on-failure destination, routing jitter."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # the fixtures live under tests/, which is not an installed package
    sys.path.insert(0, ROOT)

from infra.cli.local import lambda_client  # noqa: E402
from infra.local.config import LocalLambdaConfig  # noqa: E402
from infra.local.server import LocalLambda, jitter_delay  # noqa: E402
from tests.fixtures.local_support import invoke, report, running, wait_until  # noqa: E402

pytestmark = pytest.mark.integration


def test_event_answer_is_202_with_an_empty_body_and_the_async_limit_is_1_mb() -> None:
    with running() as (_local, client):
        result = client.invoke(FunctionName="warmstart:live", InvocationType="Event", Payload=b'{"k": 1}')
        assert result["StatusCode"] == 202 and result["Payload"].read() == b""
        assert "ExecutedVersion" not in result
        assert result["ResponseMetadata"]["HTTPHeaders"]["x-amzn-requestid"]
        near = json.dumps({"pad": "x" * 1_000_000})  # above the old 256 KB, under 1 MB
        assert client.invoke(FunctionName="warmstart", InvocationType="Event", Payload=near)["StatusCode"] == 202
        over = json.dumps({"pad": "x" * 1_050_000})
        with pytest.raises(client.exceptions.RequestTooLargeException):
            client.invoke(FunctionName="warmstart", InvocationType="Event", Payload=over)


def test_a_qualified_name_with_another_qualifier_is_invalid_parameter_value() -> None:
    with running() as (_local, client):
        with pytest.raises(client.exceptions.InvalidParameterValueException) as caught:
            client.invoke(FunctionName="warmstart:live", Qualifier="1", Payload=b"{}")
        assert "derived qualifier" in caught.value.response["Error"]["Message"]
        result, _, _ = invoke(client, {}, FunctionName="warmstart:live", Qualifier="live")  # same: fine
        assert result["ExecutedVersion"] == "1"


@pytest.mark.parametrize(("init_type", "billed_init"), [("on-demand", True), ("provisioned-concurrency", False)])
def test_init_is_billed_in_report_for_on_demand_only(init_type: str, billed_init: bool) -> None:
    with running(init_type=init_type) as (_local, client):
        _, _, log = invoke(client, {"sleep_ms": 20})
        fields = report(log)
        # Exact decimals: the printed figures are what a reader of the log adds up.
        duration = Decimal(fields["Duration"].split()[0])
        init = Decimal(fields["Init Duration"].split()[0])
        billed = int(fields["Billed Duration"].split()[0])
        assert billed == math.ceil(duration + init if billed_init else duration)
        _, _, log = invoke(client, {})  # warm: only the duration
        fields = report(log)
        assert int(fields["Billed Duration"].split()[0]) == max(1, math.ceil(float(fields["Duration"].split()[0])))


def test_failed_events_are_retried_twice_then_written_to_the_on_failure_file(tmp_path: Path) -> None:
    dest = tmp_path / "failures.jsonl"
    with running(async_retry_scale=0.002, on_failure=str(dest)) as (local, client):
        started = time.monotonic()
        client.invoke(FunctionName="warmstart", InvocationType="Event", Payload=json.dumps({"raise": "nope"}))
        assert wait_until(lambda: dest.exists() and dest.read_text().strip(), timeout=30)
        elapsed = time.monotonic() - started
        record = json.loads(dest.read_text())
        assert record["requestContext"]["condition"] == "RetriesExhausted"
        assert record["requestContext"]["approximateInvokeCount"] == 3
        assert record["requestContext"]["functionArn"].endswith(":function:warmstart:$LATEST")
        assert record["requestPayload"] == {"raise": "nope"}
        assert record["responseContext"]["functionError"] == "Unhandled"
        assert record["responsePayload"]["errorType"] == "BoomError"
        attempts = [i for i in local.history if i.request_id == record["requestContext"]["requestId"]]
        assert [i.attempt for i in attempts] == [1, 2, 3]  # one request id across retries, as on Lambda
        assert elapsed >= (60 + 120) * 0.002  # the scaled delays were waited out
        assert local.queued_events == 0


def test_an_event_older_than_the_maximum_age_is_dropped(tmp_path: Path) -> None:
    dest = tmp_path / "failures.jsonl"
    settings = {"async_retry_scale": 0.005, "max_event_age_s": 0.3, "on_failure": str(dest)}
    with running(**settings) as (_local, client):  # type: ignore[arg-type]
        client.invoke(FunctionName="warmstart", InvocationType="Event", Payload=json.dumps({"raise": "nope"}))
        assert wait_until(lambda: dest.exists() and dest.read_text().strip(), timeout=30)
        record = json.loads(dest.read_text())
        # The first retry, 0.3 s after a failure, would make the event older than 0.3 s: dropped at once.
        assert record["requestContext"]["condition"] == "EventAgeExceeded"
        assert record["requestContext"]["approximateInvokeCount"] == 1


def test_an_on_failure_path_that_cannot_take_records_is_refused_at_startup(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refusals = {
        str(fifo): "is a FIFO",
        str(tmp_path / "missing" / "failures.jsonl"): "does not exist",
        str(tmp_path): "is a directory",
    }
    for path, why in refusals.items():
        local = LocalLambda(LocalLambdaConfig(port=0, handler="tests.fixtures.handlers.echo", on_failure=path))
        try:
            with pytest.raises(ValueError, match=why):
                local.start()
        finally:
            local.stop()
    # The CLI says it in one line and exits 1, no traceback, nothing served.
    env = {**os.environ, "PYTHONPATH": ROOT}
    cmd = [sys.executable, "-m", "infra.cli", "local", "--port", "0", "--on-failure", str(fifo)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == f"warmstart local: --on-failure {fifo}: is a FIFO, not a regular file"


def failure_lines(err: str) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in err.splitlines() if line.startswith('{"warmstart": "on_failure"')]
    return [r for r in lines if isinstance(r, dict)]


def test_an_on_failure_path_that_blocks_on_open_never_freezes_the_emulator(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "failures.jsonl"
    unblock = -1
    with running(max_retry_attempts=0, on_failure=str(dest)) as (local, client):
        try:
            os.mkfifo(dest)  # after the startup check: an open for writing blocks until a reader comes
            client.invoke(FunctionName="warmstart", InvocationType="Event", Payload=json.dumps({"raise": "nope"}))
            assert wait_until(lambda: local.dropped_events, timeout=30)
            quick = lambda_client(local.endpoint, read_timeout=10)  # a frozen loop would time this out
            result, body, _ = invoke(quick, {"after": "drop"})
            assert "FunctionError" not in result and body["event"] == {"after": "drop"}
            dry = quick.invoke(FunctionName="warmstart", InvocationType="DryRun")
            assert dry["StatusCode"] == 204
            quick.close()  # its pooled socket now, not at a later test's gc
            assert wait_until(lambda: failure_lines(capfd.readouterr().err), timeout=10)
        finally:
            unblock = os.open(dest, os.O_RDONLY | os.O_NONBLOCK)  # frees a writer stuck in open(), if any
        started = time.monotonic()
    assert time.monotonic() - started < 10
    os.close(unblock)


def test_an_on_failure_write_that_fails_is_one_json_line_and_serving_goes_on(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "destination"
    folder.mkdir()
    dest = folder / "failures.jsonl"
    with running(max_retry_attempts=0, on_failure=str(dest)) as (local, client):
        shutil.rmtree(folder)  # gone after startup: the write fails
        client.invoke(FunctionName="warmstart", InvocationType="Event", Payload=json.dumps({"raise": "nope"}))
        assert wait_until(lambda: local.dropped_events, timeout=30)
        err = ""

        def logged() -> bool:
            nonlocal err
            err += capfd.readouterr().err
            return bool(failure_lines(err))

        assert wait_until(logged, timeout=10)
        [line] = failure_lines(err)
        assert line["level"] == "ERROR" and line["path"] == str(dest)
        assert line["requestId"] == local.dropped_events[0]["requestContext"]["requestId"]  # type: ignore[index]
        assert "No such file or directory" in str(line["error"])
        assert "Traceback" not in err
        result, _, _ = invoke(client, {})
        assert "FunctionError" not in result


def test_jitter_distributions_stay_in_their_bounds() -> None:
    rng = random.Random(7)
    uniform = [jitter_delay("uniform", 50, rng) for _ in range(2000)]
    assert min(uniform) >= 0 and max(uniform) <= 0.05 and 0.02 < sum(uniform) / len(uniform) < 0.03
    exponential = [jitter_delay("exponential", 20, rng) for _ in range(2000)]
    assert 0.015 < sum(exponential) / len(exponential) < 0.025
    assert all(d >= 0 for d in (jitter_delay("normal", 20, rng) for _ in range(200)))
    assert jitter_delay("fixed", 30, rng) == 0.03
    assert jitter_delay("uniform", 0, rng) == 0.0


def test_jitter_delays_each_invoke() -> None:
    with running(jitter_ms=150, jitter="fixed") as (_local, client):
        invoke(client, {})  # the cold start
        started = time.perf_counter()
        invoke(client, {})
        assert time.perf_counter() - started >= 0.15
