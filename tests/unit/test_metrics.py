"""EMF records: valid per the CloudWatch spec, the right metrics per kind of invocation, settings honoured."""

from __future__ import annotations

import json
from typing import Any

import pytest

from handler.core.errors import ConfigError
from handler.observability import logs, metrics

LAMBDA = {"AWS_LAMBDA_FUNCTION_NAME": "fn", "AWS_LAMBDA_FUNCTION_VERSION": "7"}
MODEL = "m@1"


def recorder(environ: dict[str, str] | None = None, **kw: Any) -> tuple[metrics.Emf, list[str]]:
    lines: list[str] = []
    rec = metrics.Emf.from_environ({**LAMBDA, **(environ or {})}, MODEL, "onnx", **kw)
    assert isinstance(rec, metrics.Emf)
    rec._write = lines.append
    return rec, lines


def invocation(cold: bool = False, kind: str = "inference", error: str | None = None, fault: bool = False) -> Any:
    inv = logs.Invocation("req-1", "1-5759e988-bd862e3fe1be46a994272793", cold, MODEL)
    inv.kind, inv.batch, inv.tokens, inv.error, inv.fault = kind, 3, 42, error, fault
    return inv


def check_emf(record: dict[str, Any]) -> dict[str, set[str]]:
    """Validate against the EMF specification; returns {metric name: dimension names it is published under}."""
    aws = record["_aws"]
    assert isinstance(aws["Timestamp"], int)
    published: dict[str, set[str]] = {}
    for directive in aws["CloudWatchMetrics"]:
        assert directive["Namespace"]
        for dims in directive["Dimensions"]:
            assert 0 < len(dims) <= 30
            for d in dims:
                assert isinstance(record[d], str), d  # every dimension is a string member of the record
            for m in directive["Metrics"]:
                assert isinstance(record[m["Name"]], int | float), m  # every metric is a number member
                assert m.get("Unit", "None") in ("None", "Count", "Milliseconds")
                published.setdefault(m["Name"], set()).add(",".join(dims))
    return published


def test_warm_inference_record() -> None:
    rec, lines = recorder()
    rec.invocation(invocation(), 12.5, restored=False)
    (line,) = lines
    record = json.loads(line)
    published = check_emf(record)
    assert set(published) == {"Requests", "HandlerDuration", "BatchSize", "Tokens"}
    assert (record["HandlerDuration"], record["BatchSize"], record["Tokens"]) == (12.5, 3, 42)
    assert published["Requests"] == {"function_name,model,backend"}
    # The same line is the invocation's log record, with Powertools' key names, visible to Lambda's filter.
    assert record["level"] == "INFO" and record["message"] == "invocation" and record["timestamp"].endswith("Z")
    assert record["function_request_id"] == "req-1"
    assert record["xray_trace_id"] == "1-5759e988-bd862e3fe1be46a994272793"
    assert (record["cold_start"], record["model"], record["function_name"]) == (False, MODEL, "fn")


@pytest.mark.parametrize(("restored", "name"), [(False, "ColdStart"), (True, "RestoreStart")])
def test_first_invocation_counts_cold_starts_and_restores_apart(restored: bool, name: str) -> None:
    rec, lines = recorder()
    rec.invocation(invocation(cold=True), 1.0, restored=restored)
    published = check_emf(json.loads(lines[0]))
    other = "RestoreStart" if name == "ColdStart" else "ColdStart"
    assert name in published and other not in published
    assert "function_name,function_version" in published[name]  # the rollback alarms' view


def test_errors_by_type_and_faults() -> None:
    rec, lines = recorder()
    rec.invocation(invocation(error="InvalidInputError"), 1.0, restored=False)
    rec.invocation(invocation(error="RuntimeError", fault=True), 1.0, restored=False)
    bad, broken = (json.loads(line) for line in lines)
    published = check_emf(bad)
    assert published["Errors"] == {"function_name,model,backend", "function_name,model,backend,error_type"}
    assert (bad["error_type"], bad["Errors"], bad["Faults"]) == ("InvalidInputError", 1, 0)
    assert (broken["error_type"], broken["Faults"]) == ("RuntimeError", 1)
    assert "function_name,function_version" in check_emf(broken)["Faults"]


def test_pings_and_status() -> None:
    rec, lines = recorder()
    rec.invocation(invocation(kind="ping"), 1.0, restored=False)
    rec.invocation(invocation(kind="status"), 1.0, restored=False)  # nothing to count
    (line,) = lines
    assert set(check_emf(json.loads(line))) == {"Pings"}


def test_per_invocation_metrics_off_keeps_cold_starts() -> None:
    rec, lines = recorder({"WARMSTART_METRICS": "init"})
    rec.invocation(invocation(cold=True), 1.0, restored=False)
    rec.invocation(invocation(), 1.0, restored=False)
    (line,) = lines
    assert set(check_emf(json.loads(line))) == {"ColdStart"}


def test_init_and_restore_report_fields() -> None:
    rec, _ = recorder({"WARMSTART_METRICS_NAMESPACE": "Team/Embeddings"})
    init = {"warmstart": "init", "total_ms": 310.0, "phases_ms": {"manifest": 1.0, "session": 200.0, "warm_up": 9.0}}
    fields = rec.report_fields(init)
    published = check_emf({**init, **fields})
    assert {"InitDuration", "InitManifestDuration", "InitSessionDuration", "InitWarmUpDuration"} == set(published)
    assert fields["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "Team/Embeddings"
    assert "function_name,function_version" in published["InitDuration"]
    restore = rec.report_fields({"warmstart": "restore", "total_ms": 4.0})
    assert restore["RestoreDuration"] == 4.0 and set(check_emf(restore)) == {"RestoreDuration"}
    assert rec.report_fields({"warmstart": "snapshot"}) == {}


def test_modes() -> None:
    assert metrics.mode_from_environ({}) == "off"  # not on Lambda: no EMF lines on stdout
    assert metrics.mode_from_environ(LAMBDA) == "emf"
    assert isinstance(
        metrics.Emf.from_environ({**LAMBDA, "WARMSTART_METRICS": "off"}, MODEL, "onnx"), metrics.NoMetrics
    )
    with pytest.raises(ConfigError, match="emf, init, off"):
        metrics.mode_from_environ({"WARMSTART_METRICS": "yes"})


def test_records_stay_visible_at_warn() -> None:
    rec, lines = recorder({"AWS_LAMBDA_LOG_LEVEL": "WARN"})
    rec.invocation(invocation(), 1.0, restored=False)
    assert json.loads(lines[0])["level"] == "WARN"


def test_hostile_ids_stay_inside_their_strings() -> None:
    rec, lines = recorder()
    inv = invocation(error='x","Requests":999,"y":"')
    inv.request_id = 'a"\n'
    rec.invocation(inv, 1.0, restored=False)
    record = json.loads(lines[0])
    assert record["Requests"] == 1 and record["function_request_id"] == 'a"\n'
