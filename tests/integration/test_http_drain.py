"""SIGTERM on a real `python -m handler` (uvicorn): in-flight requests finish, queued ones get 503 JSON at once,
and the process exits on its own within the drain (figures: bench/bench_drain.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures import drain_scenario

pytestmark = pytest.mark.integration


def busy(answer: drain_scenario.Answer) -> bool:
    return (
        answer.status == 503
        and answer.media.startswith("application/json")
        and answer.body["error"]["type"] == "ServiceBusyError"
        and answer.headers.get("retry-after") == "1"
    )


def test_sigterm_finishes_in_flight_and_answers_queued_503(tmp_path: Path, model_dir: Path) -> None:
    out = drain_scenario.run(tmp_path, running=2, queued=6, sleep_s=1.5, drain_s=5)
    assert (out.busy_before_signal, out.queued_before_signal) == (2, 6)
    in_flight, queued = out.answers[:2], out.answers[2:]
    assert [a.status for a in in_flight] == [200, 200]
    assert all(len(a.body["embeddings"]) == 1 for a in in_flight)
    assert len(queued) == 6 and all(busy(a) for a in queued), [(a.status, a.body) for a in queued]
    # Queued ones were answered at the signal, not after the running ones finished.
    assert max(a.at for a in queued) < min(a.at for a in in_flight)
    # It exits by itself once the running requests are done, well before the drain time would end it.
    assert out.exit_ms < out.drain_s * 1000
    assert "Traceback" not in out.stderr, out.stderr[-3000:]


def test_drain_time_running_out_is_503_json_never_a_plain_500(tmp_path: Path, model_dir: Path) -> None:
    out = drain_scenario.run(tmp_path, running=1, queued=1, sleep_s=4, drain_s=1)
    running, queued = out.answers
    assert busy(queued)
    assert busy(running) and "drain time" in running.body["error"]["message"]
    assert out.exit_ms < 4000  # the 4 s request did not hold the process: the drain (1 s) did
