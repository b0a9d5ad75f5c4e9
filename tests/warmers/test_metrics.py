"""The warmer's EMF lines: Asked, Distinct, Cold, Shortfall per target, valid EMF, visible at WARN."""

from __future__ import annotations

import json

from warmers import metrics
from warmers.report import PingResult, RunReport, TargetReport


def run() -> RunReport:
    pings = [PingResult(0, 1, instance_id="a", cold=True), PingResult(1, 1, instance_id="a"), PingResult(2, 1)]
    pings[2].error_type = "TooManyRequestsException"
    report = RunReport("corr", 250)
    report.targets = [TargetReport("fn:live", 3, "fixed", pings), TargetReport("other:live", 1, "fixed", [])]
    return report


def test_one_emf_line_per_target() -> None:
    out = metrics.lines(run().to_dict(), {"WARMSTART_METRICS_NAMESPACE": "Team", "AWS_LAMBDA_LOG_LEVEL": "WARN"})
    first, second = (json.loads(line) for line in out.splitlines())
    (directive,) = first["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == "Team" and directive["Dimensions"] == [["target"]]
    assert [m["Name"] for m in directive["Metrics"]] == ["Asked", "Distinct", "Cold", "Shortfall"]
    assert (first["target"], first["Asked"], first["Distinct"], first["Cold"], first["Shortfall"]) == (
        "fn:live",
        3,
        1,
        1,
        2,
    )
    assert (second["target"], second["Shortfall"]) == ("other:live", 1)
    assert first["level"] == "WARN" and first["timestamp"].endswith("Z") and first["message"] == "warm run"
    assert json.loads(metrics.lines(run().to_dict(), {}).splitlines()[0])["level"] == "INFO"
