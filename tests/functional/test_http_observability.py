"""The HTTP host's observability: GET /metrics (Prometheus, EMF's names), trace headers accepted, logged, echoed."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from handler.http_host.host import Host
from handler.http_host.routes import create_app
from handler.observability import logs
from handler.observability.metrics import PROMETHEUS
from handler.runtime.invocation import Runtime
from handler.runtime.workers import Sizing, WorkerPool

PARENT = "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"
ROOT = "1-5759e988-bd862e3fe1be46a994272793"


@pytest.fixture
def client(new_runtime: Callable[..., Runtime]) -> Iterator[TestClient]:
    runtime = new_runtime()
    workers = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=2), cpus=1)
    with TestClient(create_app(Host(lambda: runtime, workers))) as c:
        yield c
    logs.configure({})


def samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model", "backend"))))] = s.value
    return out


def test_metrics_count_what_the_host_served(client: TestClient) -> None:
    assert client.post("/invocations", json={"inputs": ["hello", "world"]}).status_code == 200
    assert client.post("/invocations", json={"inputs": []}).status_code == 400
    assert client.get("/ping").status_code == 200
    got = samples(client)
    assert got[(PROMETHEUS["Requests"], ())] == 2
    assert got[(PROMETHEUS["Errors"], (("error_type", "InvalidInputError"),))] == 1
    assert got[(PROMETHEUS["ColdStart"], ())] == 1
    assert got[(PROMETHEUS["Pings"], ())] == 1
    assert got[(PROMETHEUS["Tokens"], ())] >= 4
    assert got[(PROMETHEUS["HandlerDuration"] + "_count", ())] == 2
    assert got[(PROMETHEUS["BatchSize"] + "_sum", ())] == 2  # the rejected request had no batch
    assert got[(PROMETHEUS["InitDuration"], ())] > 0
    assert any(name == PROMETHEUS["InitPhaseDuration"] for name, _ in got)
    assert (PROMETHEUS["Faults"], ()) not in got or got[(PROMETHEUS["Faults"], ())] == 0


def test_trace_headers_are_logged_and_echoed(client: TestClient, capsys: pytest.CaptureFixture[str]) -> None:
    amzn = f"Root={ROOT};Parent=53995c3f42cd8ad8;Sampled=1"
    capsys.readouterr()
    r = client.post("/invocations", json={"inputs": ["hi"]}, headers={"traceparent": PARENT, "x-amzn-trace-id": amzn})
    assert r.headers["traceparent"] == PARENT and r.headers["x-amzn-trace-id"] == amzn
    bad = client.post("/invocations", json={"inputs": 5}, headers={"x-amzn-trace-id": amzn, "x-request-id": "r-9"})
    assert bad.status_code == 400 and "traceparent" not in bad.headers
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["xray_trace_id"] for r in records if r["message"].startswith("invocation")] == [ROOT, ROOT]
    (warn,) = (r for r in records if r["level"] == "WARN")
    assert warn["function_request_id"] == "r-9" and warn["xray_trace_id"] == ROOT and "exception" not in warn
    garbage = client.post("/invocations", json={"inputs": ["x"]}, headers={"traceparent": "nonsense"})
    assert "traceparent" not in garbage.headers


def test_request_id_is_capped_and_stripped_of_control_characters(
    client: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """X-Request-Id goes into every log line of the request: a 16 KB one, or one with control characters
    (a forged newline, an ANSI escape), went in whole."""
    capsys.readouterr()
    huge = "r-" + "x" * 16_000
    forged = b"r-1\x1b[31m\x7f\tend"  # ESC, DEL, TAB
    for request_id in (huge.encode(), forged):
        assert client.post("/invocations", json={"inputs": 5}, headers={"x-request-id": request_id}).status_code == 400
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    ids = [r["function_request_id"] for r in records if r.get("function_request_id")]
    assert ids and ids[0] == huge[:200] and ids[-1] == "r-1[31mend"
