"""JSON log records, the invocation context in them, levels, and trace ids."""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from handler.observability import logs, metrics, trace
from handler.runtime.invocation import Runtime

ROOT = "1-5759e988-bd862e3fe1be46a994272793"


class Context:
    aws_request_id = "req-42"

    def get_remaining_time_in_millis(self) -> int:
        return 10_000


@pytest.fixture
def stdout_lines(capsys: pytest.CaptureFixture[str]) -> Callable[[], list[dict[str, Any]]]:
    def read() -> list[dict[str, Any]]:
        return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]

    return read


@pytest.fixture
def runtime(new_runtime: Callable[..., Runtime], monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    monkeypatch.setenv(trace.ENV, f"Root={ROOT};Parent=53995c3f42cd8ad8;Sampled=1")
    rt = new_runtime()
    rt.observe({"AWS_LAMBDA_FUNCTION_NAME": "fn"}, rt.init_report)
    yield rt
    logs.configure({})


def test_bad_input_is_one_warn_record_without_a_trace(
    runtime: Runtime, stdout_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    stdout_lines()
    with pytest.raises(Exception, match="empty") as raised:
        runtime.handle({"inputs": []}, Context())
    frames = [f.name for f in traceback.extract_tb(raised.value.__traceback__)][1:]
    assert frames == ["handle", "_handle"]  # what awslambdaric prints as stackTrace: none of the task's frames
    warn, emf = stdout_lines()
    assert warn["level"] == "WARN" and "InvalidInputError" in warn["message"]
    assert "exception" not in warn and "stackTrace" not in warn
    assert (warn["function_request_id"], warn["xray_trace_id"], warn["cold_start"]) == ("req-42", ROOT, True)
    assert warn["model"] == runtime.manifest.key
    assert emf["error_type"] == "InvalidInputError" and emf["Faults"] == 0 and emf["ColdStart"] == 1
    # The next valid request on the same instance: a warm record, and no context left over outside one.
    runtime.handle({"inputs": ["hi"]}, Context())
    (ok,) = stdout_lines()
    assert ok["cold_start"] is False and ok["Tokens"] > 0 and ok["BatchSize"] == 1 and "error_type" not in ok
    assert logs.current() is None


def test_internal_error_is_an_error_record_with_its_exception(
    runtime: Runtime, stdout_lines: Callable[[], list[dict[str, Any]]], load_event: Callable[[str], Any]
) -> None:
    def broken(payload: Any) -> Any:
        raise RuntimeError("boom")

    runtime.serve = broken  # type: ignore[method-assign]
    stdout_lines()
    reply = runtime.handle(load_event("http_api_v2.json"), Context())
    assert reply["statusCode"] == 500
    error, emf = stdout_lines()
    assert error["level"] == "ERROR" and error["exception_name"] == "RuntimeError" and "boom" in error["exception"]
    assert emf["Faults"] == 1 and emf["error_type"] == "RuntimeError"


def test_level_follows_lambda(stdout_lines: Callable[[], list[dict[str, Any]]]) -> None:
    log = logs.configure({"AWS_LAMBDA_LOG_LEVEL": "WARN"})
    try:
        stdout_lines()
        log.info("dropped")
        log.warning("kept")
        assert [r["message"] for r in stdout_lines()] == ["kept"]
        assert log.propagate is False  # awslambdaric's root handler would print it a second time
    finally:
        logs.configure({})
    assert logs.keep_level({"AWS_LAMBDA_LOG_LEVEL": "ERROR"}) == "ERROR"
    assert logs.keep_level({"AWS_LAMBDA_LOG_LEVEL": "DEBUG"}) == "INFO"
    assert logs.threshold({"WARMSTART_LOG_LEVEL": "warning"}) == "WARN"


def test_formatter_outside_an_invocation() -> None:
    record = logging.LogRecord("warmstart", logging.INFO, __file__, 1, "hello %s", ("there",), None)
    out = json.loads(logs.JsonFormatter().format(record))
    assert out["message"] == "hello there" and out["level"] == "INFO"
    assert "function_request_id" not in out


@pytest.mark.parametrize(
    ("header", "root"),
    [
        (f"Root={ROOT};Parent=53995c3f42cd8ad8;Sampled=1", ROOT),
        (f"Parent=53995c3f42cd8ad8;Root={ROOT}", ROOT),
        ("Root=1-xyz", None),
        ("", None),
        (None, None),
    ],
)
def test_xray_root(header: str | None, root: str | None) -> None:
    assert trace.xray_root(header) == root


def test_traceparent_maps_onto_the_xray_root() -> None:
    parent = "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"
    assert trace.from_traceparent(parent) == ROOT
    assert trace.from_traceparent("00-" + "0" * 32 + "-53995c3f42cd8ad8-01") is None
    assert trace.from_traceparent("garbage") is None
    tid, echo = trace.from_headers({"traceparent": parent, "x-amzn-trace-id": "Root=bad"})
    assert tid == ROOT and echo == {"traceparent": parent}


def test_no_opentelemetry_unless_in_use() -> None:
    assert trace.otel_tracer({"WARMSTART_OTEL": "0"}) is None
    assert isinstance(metrics.Emf.from_environ({}, "m", "onnx"), metrics.NoMetrics)


def test_spans_when_opentelemetry_is_in_use(new_runtime: Callable[..., Runtime]) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    rt = new_runtime()
    trace.init_spans(tracer, rt.init_report["phases_ms"], rt.init_report["total_ms"], {"warmstart.model": "m"})
    rt.tracer = tracer
    rt.handle({"inputs": ["hi"]}, Context())
    spans = {s.name: s for s in exporter.get_finished_spans()}
    init = spans["warmstart.init"]
    phases = [s for name, s in spans.items() if name.startswith("warmstart.init.")]
    assert {s.name.rsplit(".", 1)[1] for s in phases} == set(rt.init_report["phases_ms"])
    assert all(s.parent is not None and s.parent.span_id == init.context.span_id for s in phases)
    assert all(init.start_time <= s.start_time <= s.end_time <= init.end_time for s in phases)
    assert spans["warmstart.invoke"].attributes["warmstart.model"] == rt.manifest.key
    assert trace.otel_tracer({}) is not None  # in use in this process now: spans on without a setting


def test_timestamp_is_rfc3339_utc_with_milliseconds_across_seconds() -> None:
    # The whole-second part is formatted once per second and reused: going forward, back and across a day it
    # must still be the moment's own.
    import time

    for t in (1_700_000_000.123, 1_700_000_000.999, 1_700_000_001.5, 1_700_000_000.0, 1_700_086_399.9999, 0.25):
        expected = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"
        assert logs.timestamp(t) == expected
    assert logs.timestamp(1_700_000_001.5) == "2023-11-14T22:13:21.500Z"
