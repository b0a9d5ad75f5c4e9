"""A slow-body flood on a real `python -m handler` (issue 32 fault 8): connections that send their headers and
then a body byte now and then filled the connection cap, and `/ping` was a fast 503 until the 60 s body
timeout freed them, so a liveness probe failed on a healthy instance. Scaled down for a 2-CPU machine: a cap
of 32, 40 trickling connections."""

from __future__ import annotations

import contextlib
import http.client
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures import drain_scenario

pytestmark = pytest.mark.integration

CAP, FLOOD = 32, 40
GRACE_S, MIN_RATE = 5, 1024  # the trickle below is 2 bytes/s, far under MIN_RATE
HEAD = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"


@dataclass
class Slow:
    sock: socket.socket
    data: bytes = b""
    sent_at: float = 0.0  # time.monotonic() when its headers were sent
    closed_at: float | None = None  # time.monotonic() when the host closed it

    @property
    def status(self) -> int:
        line = self.data.split(b"\r\n", 1)[0].split()
        return int(line[1]) if len(line) > 1 and line[0].startswith(b"HTTP/") else 0

    def body(self) -> dict[str, object]:
        parsed: dict[str, object] = json.loads(self.data.partition(b"\r\n\r\n")[2])
        return parsed


class Flood:
    """FLOOD connections, each sending HEAD and then one body byte every 0.5 s, reading what comes back."""

    def __init__(self, port: int) -> None:
        self.slow: list[Slow] = []
        for count in (CAP, FLOOD - CAP):
            # The cap's worth first, their headers read, so the rest find every connection with a request
            # under way (a connection still waiting for its headers would give way to them instead).
            for _ in range(count):
                self.slow.append(Slow(socket.create_connection(("127.0.0.1", port))))
                self.slow[-1].sock.sendall(HEAD)
                self.slow[-1].sent_at = time.monotonic()
            time.sleep(0.5)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self) -> None:
        next_byte = 0.0
        while not self.stop.is_set():
            live = [s for s in self.slow if s.closed_at is None]
            if time.monotonic() >= next_byte:
                next_byte = time.monotonic() + 0.5
                for s in live:
                    with contextlib.suppress(OSError):  # closed by the host: its answer is read below
                        s.sock.send(b" ")
            readable, _, _ = select.select([s.sock for s in live], [], [], 0.05) if live else ([], [], [])
            for s in live:
                if s.sock in readable:
                    try:
                        chunk = s.sock.recv(65536)
                    except OSError:
                        chunk = b""
                    s.data += chunk
                    if not chunk:
                        s.closed_at = time.monotonic()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for s in self.slow:
            s.sock.close()


@pytest.fixture
def host(tmp_path: Path, model_dir: Path) -> Iterator[int]:
    proc, port = drain_scenario.start(
        tmp_path,
        1,
        4,
        0,
        1,
        WARMSTART_HTTP_MAX_CONNECTIONS=str(CAP),
        WARMSTART_HTTP_BODY_GRACE_S=str(GRACE_S),
        WARMSTART_HTTP_BODY_MIN_RATE=str(MIN_RATE),
    )
    try:
        yield port
    finally:
        proc.kill()
        _, stderr = proc.communicate()
        assert "Traceback" not in stderr, stderr[-3000:]


def get(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, float]:
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers={"content-type": "application/json"} if body else {})
        r = conn.getresponse()
        r.read()
        return r.status, time.monotonic() - started
    finally:
        conn.close()


def test_health_answers_at_the_cap_and_slow_bodies_get_408_after_the_grace(host: int) -> None:
    flood = Flood(host)
    try:
        time.sleep(1)  # every connection over the cap has been answered; CAP bodies are under way
        over = [s for s in flood.slow if s.closed_at is not None]
        assert len(over) == FLOOD - CAP and {s.status for s in over} == {503}, [s.data[:80] for s in over]
        # At the cap, held by bodies in flight: health is answered (before: 503 ServiceBusyError at once) ...
        for path in ("/ping", "/healthz", "/health", "/"):
            status, took = get(host, "GET", path)
            assert (status, path) == (200, path) and took < 1.0, (path, status, took)
        # ... and a new inference request is not (it would need a connection the cap does not have).
        assert get(host, "POST", "/invocations", b'{"inputs": ["x"]}')[0] == 503
        # The bodies arrive at 2 bytes/s, under the minimum rate: 408 after the grace period, long before
        # the 60 s body timeout.
        deadline = time.monotonic() + GRACE_S + 8
        held = [s for s in flood.slow if s not in over]
        while time.monotonic() < deadline and any(s.closed_at is None for s in held):
            time.sleep(0.2)
        assert [s.status for s in held] == [408] * CAP, [s.data[:80] for s in held]
        assert {s.body()["error"]["type"] for s in held} == {"RequestTimeoutError"}  # type: ignore[index]
        assert b"connection: close" in held[0].data.lower()
        took = sorted(s.closed_at - s.sent_at for s in held if s.closed_at is not None)
        assert took[0] > GRACE_S - 0.5 and took[-1] < GRACE_S + 8, took  # after the grace, not before
    finally:
        flood.close()
    assert get(host, "POST", "/invocations", b'{"inputs": ["x"]}')[0] == 200  # the connections are free again


def test_a_body_at_a_fair_rate_is_not_cut(host: int) -> None:
    """Past the grace period a body still arriving at over the minimum rate is read to its end."""
    body = json.dumps({"inputs": ["y" * 3000]}).encode()
    with socket.create_connection(("127.0.0.1", host)) as sock:
        sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body))
        step = 512  # 512 bytes every 0.25 s: 2 KB/s, twice the minimum, for ~1.5 s past the grace
        sock.sendall(body[:2])
        time.sleep(GRACE_S - 0.5)
        for i in range(2, len(body), step):
            sock.sendall(body[i : i + step])
            time.sleep(0.25)
        status, _, answer = drain_scenario.raw_answer(sock, timeout=10)
    assert status == 200 and len(answer["embeddings"]) == 1, answer
