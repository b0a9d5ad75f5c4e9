"""`warmstart tune`: a small run's output shape, and the cost and recommendation arithmetic."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # the fixtures live under tests/, which is not an installed package
    sys.path.insert(0, ROOT)

from infra.cli import build_parser, main  # noqa: E402
from infra.cli.tune import PRICE_PER_GB_S, PRICE_PER_REQUEST, SizeResult, TuneResult  # noqa: E402
from tests.fixtures.local_support import ECHO  # noqa: E402


@pytest.mark.integration
def test_a_small_run_writes_the_table_the_json_and_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["tune", "--handler", ECHO, "--sizes", "512,1024", "--cold", "1", "--warm", "3", "--payload", "{}"]
    assert main([*argv, "--out", str(tmp_path), "--target-ms", "1000", "--init-timeout", "60"]) == 0
    table = (tmp_path / "tune.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| 512 ") or line.startswith("| 1024 ")]
    assert len(rows) == 2 and all(len(row.split("|")) == 10 for row in rows)
    assert (tmp_path / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((tmp_path / "tune.json").read_text())
    assert [s["memory_mb"] for s in data["sizes"]] == [512, 1024]
    assert all(len(s["cold_ms"]) == 1 and len(s["warm_ms"]) == 3 for s in data["sizes"])
    # Which size is cheaper depends on this host's timing (one slow warm call moves the mean): only that
    # the recommendation is one of them, said the same way in the table and the JSON.
    best = data["recommendation"]["memory_mb"]
    assert best in (512, 1024)
    assert f"Recommendation: {best} MB: the cheapest with warm-p99 ≤ 1000 ms." in table
    assert "512 MB" in capsys.readouterr().out


def sized(mb: int, warm_ms: float, cold_ms: float = 1000.0) -> SizeResult:
    return SizeResult(mb, mb / 1769, [cold_ms], [math.ceil(cold_ms)], [warm_ms] * 10, [math.ceil(warm_ms)] * 10)


def test_cost_is_requests_plus_gb_seconds_with_init_billed_for_cold_starts() -> None:
    size = sized(1024, 100.0, 900.0)
    warm = PRICE_PER_REQUEST + 1.0 * 0.1 * PRICE_PER_GB_S["x86_64"]
    cold = PRICE_PER_REQUEST + 1.0 * 0.9 * PRICE_PER_GB_S["x86_64"]
    assert size.cost_per_million("x86_64", 0.0, False) == pytest.approx(warm * 1e6)
    assert size.cost_per_million("x86_64", 0.5, False) == pytest.approx((warm + cold) / 2 * 1e6)
    assert size.cost_per_million("arm64", 0.0, False) < size.cost_per_million("x86_64", 0.0, False)


def test_recommendation_is_the_cheapest_size_meeting_the_target() -> None:
    sizes = [sized(512, 80.0), sized(1024, 30.0), sized(2048, 16.0)]
    result = TuneResult(sizes, 2, 0.01, False, 40.0, "warm-p99", 2, "v1")
    best, why = result.recommendation()
    assert best is not None and best.memory_mb == 1024 and "cheapest with warm-p99 ≤ 40 ms" in why
    result.target_ms = 5.0
    best, why = result.recommendation()
    assert best is None and why == "no size meets warm-p99 ≤ 5 ms; the fastest is 2048 MB"


# -- argument refusals (issue 24 item 11): one line, exit 1, before anything is measured or written ----------


def no_measurement(*_: object, **__: object) -> None:
    raise AssertionError("measured: the arguments should have been refused first")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sizes", "abc"], "--sizes 'abc': not a comma-separated list of memory sizes; valid: MB in 128..10240"),
        (["--sizes", "100"], "--sizes '100': 100 MB is outside Lambda's 128..10240 MB"),
        (["--sizes", "512,20000"], "--sizes '512,20000': 20000 MB is outside Lambda's 128..10240 MB"),
        (["--sizes", ","], "--sizes ',': not a comma-separated list of memory sizes"),
        (["--max-concurrency", "0"], "max_concurrency must be at least 1"),
        (["--cold-fraction", "-1"], "--cold-fraction -1: valid: 0..1 (the share of cold invocations)"),
        (["--cold-fraction", "1.5"], "--cold-fraction 1.5: valid: 0..1"),
        (["--cold-fraction", "nan"], "--cold-fraction nan: valid: 0..1"),
        (["--cold", "0", "--warm", "0"], "--warm 0: valid: 1..100000 (costs are computed from warm invocations)"),
        (["--cold", "-1"], "--cold -1: valid: 0..1000"),
        (["--target-ms", "-5"], "--target-ms -5: valid: a positive number of milliseconds"),
        (["--payload", "not json"], "--payload: not a JSON event (Expecting value: line 1 column 1 (char 0))"),
        (["--payload", "[" * 100_000], "--payload: not a JSON event (nested too deeply)"),
    ],
)
def test_bad_arguments_are_refused_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str
) -> None:
    from infra.cli import tune

    monkeypatch.setattr(tune, "measure", no_measurement)
    out = tmp_path / "out"
    assert main(["tune", "--handler", ECHO, *argv, "--out", str(out)]) == 1
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warmstart tune: {message}"), captured.err
    assert not out.exists()


def test_payload_over_6_mb_and_missing_payload_file_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from infra.cli import tune

    monkeypatch.setattr(tune, "measure", no_measurement)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"inputs": ["x" * 6_300_000]}))
    assert main(["tune", "--payload", f"@{big}", "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"warmstart tune: --payload @{big}: 6300016 bytes; Lambda accepts at most 6291456")
    missing = tmp_path / "nope.json"
    assert main(["tune", "--payload", f"@{missing}", "--out", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err == f"warmstart tune: --payload @{missing}: No such file or directory\n"


@pytest.mark.parametrize("where", ["a-file", "under-a-file"])
def test_out_that_cannot_be_written_is_refused_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    from infra.cli import tune

    monkeypatch.setattr(tune, "measure", no_measurement)
    (tmp_path / "file").write_text("mine\n")
    out = tmp_path / "file" if where == "a-file" else tmp_path / "file" / "sub"
    assert main(["tune", "--handler", ECHO, "--out", str(out)]) == 1
    assert capsys.readouterr().err == f"warmstart tune: --out {out}: {tmp_path / 'file'} is not a directory\n"
    assert (tmp_path / "file").read_text() == "mine\n"


@pytest.mark.integration
def test_an_invocation_that_never_reaches_the_function_is_one_line_not_stop_iteration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No REPORT to read (the Invoke API refused the call, or throttled it while a timed-out init was torn
    down): measure() raised a bare StopIteration. A payload the Invoke API refuses, past run()'s own checks."""
    from infra.cli.local import config_from_args
    from infra.cli.tune import TuneError, measure

    args = build_parser().parse_args(["tune", "--handler", ECHO])
    with pytest.raises(TuneError, match=r"^512 MB: the invocation failed before reaching the function \(Invalid"):
        measure(config_from_args(args), [512], b"not json", 1, 1, None)


@pytest.mark.integration
def test_an_init_timeout_ends_in_exit_1_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FIXTURE_INIT_SLEEP_S", "5")
    argv = ["tune", "--handler", "tests.fixtures.slow_init.handler", "--sizes", "512", "--cold", "1", "--warm", "2"]
    assert main([*argv, "--init-timeout", "0.5", "--out", str(tmp_path / "out"), "--no-plot"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "StopIteration" not in err
