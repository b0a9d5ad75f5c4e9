"""A closed-loop HTTP load client, stdlib only: N users, each sends its next request when the last is answered.

One module on purpose, so every HTTP bench drives every server with the same client: `run(...)` returns a
`LoadResult` (latencies of the 200s, status counts, transport errors). Each user holds one keep-alive
connection (as a pooled client would) and reconnects after a transport error. A user told `Retry-After`
with a 503/429 waits that long before its next request (as OpenAI's and most HTTP clients do), unless
`honor_retry_after=False`: a client that retries at once turns one refusal into a stream of them, and the
error rate then counts how fast refusals are, not how many users were refused. The loop is bounded in time
and only ever targets the address it is given (a server this bench started on loopback).
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class LoadResult:
    users: int
    elapsed_s: float
    latencies_ms: list[float] = field(default_factory=list)  # answers with status 200
    statuses: Counter[int] = field(default_factory=Counter)  # every answer's status
    transport_errors: int = 0  # no answer at all (reset, timeout)

    @property
    def requests(self) -> int:
        return sum(self.statuses.values()) + self.transport_errors

    @property
    def ok(self) -> int:
        return self.statuses.get(200, 0)

    @property
    def rps(self) -> float:
        """Successful answers per second."""
        return self.ok / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def error_rate(self) -> float:
        """Share of requests that did not get a 200 (503s, other statuses and transport errors)."""
        return (self.requests - self.ok) / self.requests if self.requests else 0.0

    def percentile(self, q: float) -> float:
        return percentile(self.latencies_ms, q)

    def summary(self) -> dict[str, float | int]:
        return {
            "users": self.users,
            "requests": self.requests,
            "ok": self.ok,
            "rps": self.rps,
            "p50_ms": self.percentile(50),
            "p99_ms": self.percentile(99),
            "error_rate": self.error_rate,
            "transport_errors": self.transport_errors,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
        }


def percentile(xs: list[float], q: float) -> float:
    """The q-th percentile, nearest rank (NaN for no samples): p99 of 50 samples is the largest, not a blend."""
    if not xs:
        return float("nan")
    ordered = sorted(xs)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100), at least the first
    return ordered[int(rank) - 1]


def openai_body(sentence: str, model: str) -> bytes:
    """OpenAI's embeddings request, one sentence: the body both servers are sent."""
    return json.dumps({"input": [sentence], "model": model}).encode()


def run(
    host: str,
    port: int,
    path: str,
    bodies: list[bytes],
    users: int,
    duration_s: float,
    timeout_s: float = 30.0,
    check: Callable[[bytes], None] | None = None,
    honor_retry_after: bool = True,
) -> LoadResult:
    """`users` threads in a closed loop for `duration_s`, user u sending bodies[u], bodies[u + users], ...
    (cycling). `check` (if given) sees each 200's body and raises on a wrong answer: counted as an error."""
    if users < 1 or not bodies:
        raise ValueError("users >= 1 and at least one body")
    result = LoadResult(users=users, elapsed_s=0.0)
    lock = threading.Lock()
    start = threading.Barrier(users + 1)
    stop_at = [0.0]

    def user(u: int) -> None:
        conn: http.client.HTTPConnection | None = None
        i = u
        latencies: list[float] = []
        statuses: Counter[int] = Counter()
        errors = 0
        start.wait()
        while time.perf_counter() < stop_at[0]:
            body = bodies[i % len(bodies)]
            i += users
            t0 = time.perf_counter()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
                conn.request("POST", path, body, {"content-type": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
                status = resp.status
                retry_after = resp.getheader("retry-after")
                if status == 200 and check is not None:
                    try:
                        check(data)
                    except Exception:
                        status = 299  # a 200 with a wrong answer: kept apart from the 200s
            except (OSError, http.client.HTTPException):
                errors += 1
                if conn is not None:
                    conn.close()
                conn = None
                continue
            ms = (time.perf_counter() - t0) * 1000
            statuses[status] += 1
            if status == 200:
                latencies.append(ms)
            elif honor_retry_after and status in (429, 503) and retry_after:
                try:
                    wait = float(retry_after)
                except ValueError:  # an HTTP date: not sent by either server here
                    wait = 1.0
                time.sleep(max(0.0, min(wait, stop_at[0] - time.perf_counter())))
        if conn is not None:
            conn.close()
        with lock:
            result.latencies_ms.extend(latencies)
            result.statuses.update(statuses)
            result.transport_errors += errors

    threads = [threading.Thread(target=user, args=(u,), daemon=True) for u in range(users)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    stop_at[0] = t0 + duration_s
    start.wait()
    for t in threads:
        t.join(duration_s + timeout_s + 5)
    # Requests in flight at the deadline are finished and counted: elapsed runs to the last one's end.
    result.elapsed_s = time.perf_counter() - t0
    return result


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")
