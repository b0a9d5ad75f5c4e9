"""The HTTP host's limits on a real `python -m handler` and real sockets: time for headers and for a body,
connections capped below the file limit, and protocol errors answered in JSON (issue 24 faults 6, 13)."""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import drain_scenario

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[int]:
    """One host for the quick checks: 1 s for headers and for a body."""
    tmp = tmp_path_factory.mktemp("limits")
    proc, port = drain_scenario.start(
        tmp, 1, 4, 0, 1, WARMSTART_HTTP_HEADER_TIMEOUT_S="1", WARMSTART_HTTP_BODY_TIMEOUT_S="1"
    )
    try:
        yield port
    finally:
        proc.kill()
        proc.communicate()


def exchange(port: int, data: bytes, trickle: bytes = b"", every_s: float = 0.2) -> tuple[int, dict[str, str], Any]:
    """Send `data`, then `trickle` a byte at a time, then read the answer until the server closes."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(data)
        for byte in trickle:
            time.sleep(every_s)
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
        return drain_scenario.raw_answer(sock, timeout=10)


def json_error(answer: tuple[int, dict[str, str], Any], status: int, type_name: str) -> None:
    code, headers, body = answer
    assert (code, headers.get("content-type")) == (status, "application/json"), (code, headers, body)
    assert headers.get("connection") == "close" and body["error"]["type"] == type_name, body


def test_headers_trickled_a_byte_at_a_time_get_408_json(host: int) -> None:
    started = time.monotonic()
    answer = exchange(host, b"GET /ping HTTP/1.1\r\n", trickle=b"X-Slow: " + b"a" * 40)
    json_error(answer, 408, "RequestTimeoutError")
    assert time.monotonic() - started < 3  # 1 s for headers, though a byte came every 0.2 s


def test_body_trickled_a_byte_at_a_time_gets_408_json(host: int) -> None:
    started = time.monotonic()
    head = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n"
    answer = exchange(host, head + b'{"inputs": [', trickle=b'"a", ' * 20)
    json_error(answer, 408, "RequestTimeoutError")
    assert time.monotonic() - started < 3


def test_ping_answers_while_600_sockets_trickle_under_ulimit_512(tmp_path: Path, model_dir: Path) -> None:
    """Under `ulimit -n 512`, 600 connections trickling a header byte now and then took every file and
    /ping timed out; now connections are capped below the limit, the longest-waiting give way, and /ping
    is answered each time."""
    proc, port = drain_scenario.start(tmp_path, 1, 4, 0, 1, files=512)
    thread = threading.Thread()
    socks: list[socket.socket] = []
    stop = threading.Event()

    def trickle() -> None:
        live = list(socks)
        while not stop.is_set():
            for sock in list(live):
                try:
                    sock.send(b"a")
                except OSError:
                    live.remove(sock)  # closed by the host (evicted: it waited longest)
            stop.wait(0.5)

    try:
        for _ in range(600):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            socks.append(sock)
        time.sleep(0.5)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.send(b"GET /ping HTTP/1.1\r\nX-Slow: ")
        thread = threading.Thread(target=trickle)
        thread.start()
        time.sleep(1)
        statuses = []
        for _ in range(3):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/ping")
            r = conn.getresponse()
            statuses.append((r.status, json.loads(r.read())["status"]))
            conn.close()
        assert statuses == [(200, "ok")] * 3
        assert proc.poll() is None
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        for sock in socks:
            sock.close()
        proc.kill()
        _, stderr = proc.communicate()
    assert "Traceback" not in stderr, stderr[-3000:]


def test_connections_over_the_cap_get_503_json_at_once(tmp_path: Path, model_dir: Path) -> None:
    """WARMSTART_HTTP_MAX_CONNECTIONS=3, three requests under way (1 running, 2 queued): a fourth connection
    is answered 503 JSON at once, and the three are answered as usual."""
    proc, port = drain_scenario.start(tmp_path, 1, 4, 1.0, 1, WARMSTART_HTTP_MAX_CONNECTIONS="3")
    try:
        answers: list[int] = []
        body = b'{"inputs": ["x"]}'

        def post() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST", "/invocations", body=body, headers={"content-type": "application/json"})
            answers.append(conn.getresponse().status)
            conn.close()

        threads = [threading.Thread(target=post) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.4)
        started = time.monotonic()
        head = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
        answer = exchange(port, head + body)
        json_error(answer, 503, "ServiceBusyError")
        assert answer[1].get("retry-after") == "1" and time.monotonic() - started < 0.5
        for t in threads:
            t.join(timeout=30)
        assert answers == [200, 200, 200]
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400),
        (b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n", 431),
        (b"\x16\x03\x01 garbage \xff\xfe\r\n\r\n", 400),
    ],
    ids=["bad-content-length", "200KB-header", "garbage-request-line"],
)
def test_protocol_errors_are_json(host: int, request_bytes: bytes, status: int) -> None:
    json_error(exchange(host, request_bytes), status, "InvalidHTTPRequestError")
    conn = http.client.HTTPConnection("127.0.0.1", host, timeout=5)  # and the host still answers
    try:
        conn.request("GET", "/ping")
        assert conn.getresponse().status == 200
    finally:
        conn.close()


def test_uvicorn_lines_are_json_at_info(tmp_path: Path, model_dir: Path) -> None:
    """At WARMSTART_LOG_LEVEL=INFO uvicorn's start, protocol-warning and stop lines were plain text."""
    proc, port = drain_scenario.start(tmp_path, 1, 4, 0, 1, WARMSTART_LOG_LEVEL="INFO")
    try:
        exchange(port, b"garbage\r\n\r\n")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    lines = [line for line in (out + err).splitlines() if line.strip()]
    not_json = [line for line in lines if not line.startswith("{")]
    assert not_json == [], not_json
    uvicorn = [r for r in map(json.loads, lines) if r.get("logger", "").startswith("uvicorn")]
    messages = " | ".join(r["message"] for r in uvicorn)
    assert "Uvicorn running on" in messages and "Invalid HTTP request" in messages and "Shutting down" in messages
    assert all(r["level"] in ("INFO", "WARN") and r["timestamp"] for r in uvicorn)
