"""The HTTP host (starlette TestClient): /invocations, /ping, /healthz, /status, the error contract, one init."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

from handler.core.config import LAMBDA_PAYLOAD_LIMIT
from handler.http_host.host import Host
from handler.http_host.routes import create_app
from handler.runtime.invocation import Runtime
from handler.runtime.workers import Sizing, WorkerPool

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def http_runtime(new_runtime: Callable[..., Runtime]) -> Runtime:
    return new_runtime()


@pytest.fixture
def starts() -> list[int]:
    return []


@pytest.fixture
def client(http_runtime: Runtime, starts: list[int]) -> Iterator[TestClient]:
    def start() -> Runtime:
        starts.append(1)
        return http_runtime

    workers = WorkerPool(Sizing(min_workers=1, max_workers=2, max_queue=2), cpus=2)
    with TestClient(create_app(Host(start, workers))) as c:
        yield c


def test_invocations_embed(client: TestClient, http_runtime: Runtime) -> None:
    r = client.post("/invocations", json={"inputs": ["hello", "a longer sentence here"]})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["model"] == "all-minilm-l6-v2@0.1.0" and len(body["embeddings"]) == 2
    ids, mask = http_runtime.task.encoder.encode(["hello", "a longer sentence here"])  # type: ignore[attr-defined]
    expected = http_runtime.backend.run({"input_ids": ids, "attention_mask": mask})["sentence_embedding"]
    np.testing.assert_allclose(body["embeddings"], expected, atol=2e-5)


def test_init_runs_once_per_process(client: TestClient, starts: list[int]) -> None:
    for _ in range(3):
        assert client.post("/invocations", json={"inputs": "x"}).status_code == 200
    assert client.get("/ping").status_code == 200
    assert starts == [1]


def test_ping_healthz_status(client: TestClient, http_runtime: Runtime) -> None:
    ping = client.get("/ping").json()
    assert ping["status"] == "ok" and ping["instance_id"] == http_runtime.instance_id
    assert client.get("/healthz").json() == {"ok": True}
    status = client.get("/status").json()
    assert status["warmstart"] == "status" and status["workers"]["max_workers"] == 2


SECRETS = ("s3://", "/", "reload failed", "pointer")


def test_status_over_http_shows_counts_and_health_only(
    client: TestClient, http_runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the admin 403 hides, GET /status used to show anyone: model sources (s3:// URIs, paths), reload
    errors, the pointer. Now counts and health only."""
    monkeypatch.setattr(http_runtime.reloader, "last", {"ok": False, "source": "s3://secret-bucket/m/2/"})
    status = client.get("/status").json()
    assert status["detail"] == "basic" and status["reload"] == {"running": False, "last_ok": False}
    assert status["models"] == {"loaded": 1, "available": 0, "retiring": 0, "in_flight": 0}
    assert {"invocations", "uptime_s", "rss_mb", "threads", "workers"} <= set(status)
    assert "secret-bucket" not in json.dumps(status) and str(http_runtime.manifest.root) not in json.dumps(status)


def test_full_status_over_http_is_the_operators_choice(new_runtime: Callable[..., Runtime]) -> None:
    runtime = new_runtime(http_status="full")
    with TestClient(create_app(Host(lambda: runtime))) as c:
        status = c.get("/status").json()
    assert status["models"]["loaded"][0]["source"] == str(runtime.manifest.root) and "reload" in status


def test_tracemalloc_cannot_be_started_over_http(client: TestClient) -> None:
    assert not tracemalloc.is_tracing()
    r = client.get("/status?tracemalloc=1&top=2")
    assert r.status_code == 403 and r.json()["error"]["type"] == "AdminNotAllowedError"
    assert "WARMSTART_TRACEMALLOC_S" in r.json()["error"]["message"]
    assert not tracemalloc.is_tracing()


@pytest.mark.parametrize(
    ("method", "body", "status", "error"),
    [
        ("POST", b"{not json", 400, "InvalidJSONError"),
        ("POST", b"\xff\xfe", 400, "InvalidEncodingError"),
        ("POST", b'{"inputs": []}', 400, "InvalidInputError"),
        ("POST", b'{"warmer": true}', 400, "InvalidInputError"),  # a ping-shaped body is an ordinary request
        ("POST", b"", 400, "InvalidJSONError"),
        ("GET", b"", 405, "MethodNotAllowedError"),
        ("PUT", b'{"inputs": ["x"]}', 405, "MethodNotAllowedError"),
    ],
)
def test_error_contract(client: TestClient, method: str, body: bytes, status: int, error: str) -> None:
    r = client.request(method, "/invocations", content=body)
    assert r.status_code == status
    assert r.json()["error"]["type"] == error and r.json()["error"]["message"]


def test_oversized_body_is_413(client: TestClient) -> None:
    r = client.post("/invocations", content=b"x" * (LAMBDA_PAYLOAD_LIMIT + 1))
    assert r.status_code == 413 and r.json()["error"]["type"] == "PayloadTooLargeError"
    assert client.post("/invocations", json={"inputs": ["still serving"]}).status_code == 200


def test_full_queue_is_503_and_ping_still_answers(http_runtime: Runtime) -> None:
    workers = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=1), cpus=1)
    release = threading.Event()
    started = threading.Event()

    def block() -> None:
        started.set()
        release.wait(10)

    with TestClient(create_app(Host(lambda: http_runtime, workers))) as c:
        blocked = workers.submit(block)
        started.wait(10)
        queued = workers.submit(lambda: None)  # the one queue slot
        try:
            r = c.post("/invocations", json={"inputs": ["x"]})
            assert r.status_code == 503 and r.json()["error"]["type"] == "ServiceBusyError"
            assert r.headers["retry-after"] == "1"
            assert c.get("/ping").status_code == 200  # answered on the loop, not queued
        finally:
            release.set()
        # Once the backlog has drained (not merely been released), the same instance serves again.
        blocked.result(timeout=10)
        queued.result(timeout=10)
        assert c.post("/invocations", json={"inputs": ["x"]}).status_code == 200


def test_lambda_import_chain_has_no_http_stack() -> None:
    code = "import sys, handler.app; print(json.dumps(sorted(m for m in ('starlette','uvicorn') if m in sys.modules)))"
    env = {**os.environ, "WARMSTART_WARMUP": "0"}
    out = subprocess.run(
        [sys.executable, "-c", "import json; " + code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
