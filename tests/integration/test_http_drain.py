"""SIGTERM on a real `python -m handler` (uvicorn): in-flight requests finish, queued ones get 503 JSON at once,
and the process exits on its own within the drain (figures: bench/load/drain.py)."""

from __future__ import annotations

import signal
import socket
import time
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


def test_keepalive_clients_through_sigterm_are_all_answered_none_reset(tmp_path: Path, model_dir: Path) -> None:
    """16 clients each reusing one connection (SDK pools, proxies), sending continuously through SIGTERM: every
    request sent on an accepted connection is answered, 200 or a JSON 503 with `Connection: close`; each
    client's last answer closes its connection and its next connect is refused (the port is closed)."""
    logs, out = drain_scenario.keepalive_run(tmp_path, clients=16, sleep_s=0.02, drain_s=5)
    failures = [log.failure for log in logs if log.failure]
    assert failures == [], failures
    for log in logs:
        assert log.answers and log.refused, (log.refused, [(a.status, a.headers) for a in log.answers[-3:]])
        assert all(a.status in (200, 503) for a in log.answers)
        assert all(busy(a) and a.headers.get("connection") == "close" for a in log.answers if a.status == 503)
        assert log.answers[-1].headers.get("connection") == "close"
    after = [a for log in logs for a in log.answers if a.at > out.sigterm_at + 0.5]
    assert all(a.headers.get("connection") == "close" for a in after)
    assert sum(a.status == 200 for log in logs for a in log.answers) > 16  # it was under load before the signal
    assert out.exit_ms < out.drain_s * 1000
    assert "Traceback" not in out.stderr, out.stderr[-3000:]


def test_body_still_uploading_when_the_drain_ends_is_503_json(tmp_path: Path, model_dir: Path) -> None:
    """A client that sent its headers and part of its body before SIGTERM and nothing more: at the drain's
    end it gets a JSON 503 with `Connection: close`, not the plain-text 500 of uvicorn cancelling the task."""
    proc, port = drain_scenario.start(tmp_path, running=1, queue_max=4, sleep_s=0, drain_s=1)
    try:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
            sock.sendall(b"Content-Length: 100\r\n\r\n" + b'{"inputs": ["uploading')
            time.sleep(0.3)
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            status, headers, body = drain_scenario.raw_answer(sock)
            answered_s = time.monotonic() - sent
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (status, headers.get("content-type"), headers.get("connection")) == (503, "application/json", "close"), body
    assert body["error"]["type"] == "ServiceBusyError" and "drain time" in body["error"]["message"]
    assert 0.9 < answered_s < 1.9  # at the drain's end (1 s), before uvicorn's backstop (2 s) would cancel it
