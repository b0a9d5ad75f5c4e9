"""The streaming Lambda loop (handler.runtime.lambda_loop) for real: `python -m handler` in a subprocess under a
fake Runtime API that reads chunked bodies and trailers (tests/integration/runtime_api_fake.py), serving the toy
streaming task (tests/fixtures/streaming_toy.py): pieces arrive as chunks while the task still makes them, a
Function URL's answer begins with the HTTP integration prelude, an error after the first piece ends the body
with the error trailers, a request that does not ask to stream is one buffered answer, the loop outlives a
failed invocation, and an init error is posted to /init/error."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from handler.api.prelude import CONTENT_TYPE, DELIMITER
from tests.integration.runtime_api_fake import FakeRuntimeApi

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
APP = "tests.fixtures.streaming_app.lambda_handler"
DELAY_MS = 150


def spawn(api: FakeRuntimeApi, handler: str, **env: str) -> subprocess.Popen[bytes]:
    full = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WARMSTART_"))},
        "AWS_LAMBDA_RUNTIME_API": api.address,
        "AWS_LAMBDA_FUNCTION_NAME": "warmstart-stream",
        "PYTHONPATH": str(ROOT),
        **env,
    }
    cmd = [sys.executable, "-m", "handler", handler]
    return subprocess.Popen(cmd, cwd=ROOT, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> str:
    proc.kill()
    out, _ = proc.communicate(timeout=30)
    return out.decode(errors="replace")


@pytest.fixture
def api() -> Iterator[FakeRuntimeApi]:
    with FakeRuntimeApi() as fake:
        yield fake


@pytest.fixture
def loop(api: FakeRuntimeApi, model_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = spawn(api, APP, WARMSTART_MODEL=str(model_dir), WARMSTART_BACKEND="onnx")
    yield proc
    log = stop(proc)
    assert "Traceback" not in log or "ValueError" in log, log  # the only traceback: the toy task's failure


def events(body: bytes) -> list[Any]:
    """An SSE body's `data:` payloads (JSON, or the text [DONE]); error events as {"event": "error", ...}."""
    out: list[Any] = []
    for block in body.decode().split("\n\n")[:-1]:
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        data = lines["data"]
        item = data if data == "[DONE]" else json.loads(data)
        out.append({"event": lines["event"], **item} if "event" in lines else item)
    return out


def function_url(body: dict[str, Any], path: str = "/") -> dict[str, Any]:
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "headers": {"content-type": "application/json"},
        "requestContext": {
            "domainName": "abcdefgh.lambda-url.us-east-1.on.aws",
            "http": {"method": "POST", "path": path},
            "stage": "$default",
        },
        "body": json.dumps(body),
        "isBase64Encoded": False,
    }


def pieces(n: int) -> list[dict[str, Any]]:
    return [{"index": i, "text": f"piece {i}"} for i in range(n)]


def test_a_direct_invoke_streams_its_pieces_as_they_are_made(api: FakeRuntimeApi, loop: Any) -> None:
    posted = api.invoke({"n": 3, "delay_ms": DELAY_MS, "stream": True})
    assert posted.kind == "response" and posted.streamed, posted.headers
    assert posted.headers["content-type"] == "text/event-stream"
    assert posted.headers["transfer-encoding"] == "chunked"
    assert posted.headers["trailer"] == "Lambda-Runtime-Function-Error-Type, Lambda-Runtime-Function-Error-Body"
    assert events(posted.body) == [*pieces(3), "[DONE]"]
    data = [(t, chunk) for t, chunk in posted.chunks]
    assert [chunk for _, chunk in data] == [
        b"data: " + json.dumps(p, separators=(",", ":")).encode() + b"\n\n" for p in pieces(3)
    ] + [b"data: [DONE]\n\n"]
    # Each piece arrived on its own, while the task was still making the next (DELAY_MS apart), not at the end.
    first, second, third = (t for t, _ in data[:3])
    assert second - first > DELAY_MS / 1000 * 0.5 and third - second > DELAY_MS / 1000 * 0.5
    assert posted.ended - first > DELAY_MS / 1000 * 0.5 * 2
    assert posted.trailers == {}


def test_a_function_url_gets_the_prelude_then_the_events(api: FakeRuntimeApi, loop: Any) -> None:
    posted = api.invoke(function_url({"n": 2, "stream": True}))
    assert posted.streamed and posted.headers["content-type"] == CONTENT_TYPE
    head, delimiter, rest = posted.body.partition(DELIMITER)
    assert delimiter == DELIMITER and posted.chunks[0][1] == head + DELIMITER  # the prelude is its own chunk
    assert json.loads(head) == {
        "statusCode": 200,
        "headers": {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"},
        "cookies": [],
    }
    assert events(rest) == [*pieces(2), "[DONE]"]


def test_a_function_url_request_that_does_not_stream_is_one_answer_in_the_prelude(
    api: FakeRuntimeApi, loop: Any
) -> None:
    posted = api.invoke(function_url({"n": 2}))
    head, _, rest = posted.body.partition(DELIMITER)
    assert json.loads(head)["statusCode"] == 200 and json.loads(rest) == {"pieces": pieces(2)}
    refused = api.invoke(function_url({"n": "x", "stream": True}))  # refused before any piece: a status
    head, _, rest = refused.body.partition(DELIMITER)
    assert json.loads(head)["statusCode"] == 400 and json.loads(rest)["error"]["type"] == "InvalidInputError"
    assert refused.trailers == {}


def test_an_error_after_the_first_piece_ends_the_stream_with_trailers(api: FakeRuntimeApi, loop: Any) -> None:
    posted = api.invoke({"n": 4, "fail_at": 2, "stream": True})
    assert posted.kind == "response" and posted.streamed
    got = events(posted.body)
    assert got[:2] == pieces(2) and got[2]["event"] == "error" and "[DONE]" not in got
    assert posted.trailers["lambda-runtime-function-error-type"] == "ValueError"
    error = json.loads(base64.b64decode(posted.trailers["lambda-runtime-function-error-body"]))
    assert error["errorType"] == "ValueError" and "failed at piece 2" in error["errorMessage"]
    assert isinstance(error["stackTrace"], list)
    # The loop goes on: the next invocation is served.
    assert events(api.invoke({"n": 1, "stream": True}).body) == [*pieces(1), "[DONE]"]


def test_unstreamed_and_failed_direct_invokes_are_buffered(api: FakeRuntimeApi, loop: Any) -> None:
    whole = api.invoke({"n": 3})
    assert whole.kind == "response" and not whole.streamed and whole.json() == {"pieces": pieces(3)}
    bad = api.invoke({"n": -1, "stream": True})  # refused before any piece: the invocation's error
    assert bad.kind == "error" and bad.json()["errorType"] == "InvalidInputError"
    failed = api.invoke({"n": 3, "fail_at": 0, "stream": True})  # the task fails before its first piece
    assert failed.kind == "error" and failed.json()["errorType"] == "ValueError"
    ping = api.invoke({"warmer": True, "stream": True})  # a warm ping: one answer, no model run
    assert ping.kind == "response" and not ping.streamed and ping.json()["warm"] is True
    assert api.invoke({"n": 1}).json() == {"pieces": pieces(1)}


def test_logs_and_metrics_carry_the_invocation(api: FakeRuntimeApi, model_dir: Path) -> None:
    proc = spawn(api, APP, WARMSTART_MODEL=str(model_dir))
    try:
        streamed = api.send({"n": 2, "stream": True})
        api.answer(streamed)
        failed = api.send({"n": 3, "fail_at": 1, "stream": True})
        api.answer(failed)
        api.invoke({"n": 1})  # asked for after the failure's lines were written
    finally:
        log = stop(proc)
    metrics = [json.loads(line) for line in log.splitlines() if line.startswith("{") and '"_aws"' in line]
    by_id = {m["function_request_id"]: m for m in metrics}
    assert set(by_id) >= {streamed, failed}
    # The X-Ray root from Lambda-Runtime-Trace-Id (set as _X_AMZN_TRACE_ID, as awslambdaric sets it).
    assert by_id[streamed]["xray_trace_id"] == "1-5759e988-bd862e3fe1be46a994272793"
    assert by_id[streamed]["cold_start"] is True and by_id[failed]["cold_start"] is False
    # A failure after the first piece: awslambdaric's error line, once.
    assert log.count("[ERROR] ValueError: the toy task failed at piece 1") == 1


def test_an_init_error_is_posted(api: FakeRuntimeApi) -> None:
    proc = spawn(api, "tests.fixtures.init_fails.handler", WARMSTART_LAMBDA_LOOP="streaming")
    try:
        headers, error = api.init_errors.get(timeout=60)
        assert error["errorType"] == "ModelLoadError" and "no packed model" in error["errorMessage"]
        assert headers["lambda-runtime-function-error-type"] == "ModelLoadError"
        assert proc.wait(timeout=30) == 1
    finally:
        log = stop(proc)
    assert "init_fails: loading the model" in log


def test_snap_start_runs_the_hooks_around_restore(api: FakeRuntimeApi, model_dir: Path) -> None:
    env = {"WARMSTART_MODEL": str(model_dir), "AWS_LAMBDA_INITIALIZATION_TYPE": "snap-start"}
    proc = spawn(api, APP, **env)
    try:
        posted = api.invoke({"n": 2, "stream": True})
        assert posted.streamed and events(posted.body) == [*pieces(2), "[DONE]"]
    finally:
        log = stop(proc)
    assert api.restored.is_set()  # GET /restore/next before the first /next
    kinds = [json.loads(line)["warmstart"] for line in log.splitlines() if line.startswith('{"warmstart"')]
    assert kinds == ["snapshot", "restore"]  # before-snapshot hooks, then after-restore ones (init: emit=None)


def test_a_failed_after_restore_hook_is_posted_and_ends_the_instance(api: FakeRuntimeApi, model_dir: Path) -> None:
    env = {"WARMSTART_MODEL": str(model_dir), "AWS_LAMBDA_INITIALIZATION_TYPE": "snap-start"}
    proc = spawn(api, APP, STREAMING_APP_RESTORE_FAILS="1", **env)
    try:
        headers, error = api.restore_errors.get(timeout=60)
        assert headers["lambda-runtime-function-error-type"] == "Runtime.AfterRestoreError"
        assert "after-restore hook failed" in error["errorMessage"]
        assert proc.wait(timeout=30) == 65  # awslambdaric's exit code for it
    finally:
        stop(proc)


@pytest.mark.parametrize("loop", ["auto", "streaming"])
def test_a_model_that_does_not_stream_gets_buffered_answers(api: FakeRuntimeApi, model_dir: Path, loop: str) -> None:
    # auto: awslambdaric's own loop after the shared init; streaming: ours, each answer one buffered body.
    proc = spawn(api, "handler.app.lambda_handler", WARMSTART_MODEL=str(model_dir), WARMSTART_LAMBDA_LOOP=loop)
    try:
        answer = api.invoke({"inputs": ["hello"], "stream": True})
        assert answer.kind == "response" and not answer.streamed
        assert len(answer.json()["embeddings"][0]) == 384
        url = api.invoke(function_url({"inputs": ["hello"]}))
        assert not url.streamed if loop == "auto" else url.headers["content-type"] == CONTENT_TYPE
        bad = api.invoke({"inputs": 3})
        assert bad.kind == "error" and bad.json()["errorType"] == "InvalidInputError"
    finally:
        stop(proc)


def test_a_bad_loop_setting_names_the_valid_ones(api: FakeRuntimeApi) -> None:
    proc = spawn(api, APP, WARMSTART_LAMBDA_LOOP="fast")
    assert proc.wait(timeout=60) == 1
    assert "valid values: auto, awslambdaric, streaming" in stop(proc)
