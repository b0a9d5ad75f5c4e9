"""Latency on the HTTP host's dynamic batching, through the real starlette app (driven over ASGI so a client
can leave mid-request): each batch member is answered when its own rows are done, a request on a route that
does not batch never runs inside another's batch, and work whose client has gone is dropped (issue 32
faults 6, 7)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, MutableMapping
from functools import partial
from typing import Any

import numpy as np
import pytest
from starlette.applications import Starlette

from handler.api import compat
from handler.core.records import replace
from handler.http_host.host import Host
from handler.http_host.routes import create_app
from handler.runtime.invocation import HttpCall, Runtime
from handler.runtime.workers import Sizing, WorkerPool
from handler.tasks import catalog

LONG = "the quick brown fox jumps over the lazy dog and keeps on running far away " * 30  # 256 tokens
MEDIUM = "word " * 50  # about 50 tokens


@pytest.fixture(scope="module")
def runtime(new_runtime: Callable[..., Runtime]) -> Runtime:
    return new_runtime()


@pytest.fixture
def rows(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows the model ran, run by run."""
    real = runtime.backend.run
    seen: list[int] = []

    def counting(feeds: dict[str, np.ndarray]) -> Any:
        seen.append(int(feeds["input_ids"].shape[0]))
        return real(feeds)

    monkeypatch.setattr(runtime.backend, "run", counting)
    return seen


class Client:
    """One HTTP request over ASGI: the time its answer came (None: none came), and its status. `leave_s`:
    the client disconnects that long after sending its body (and reads no answer)."""

    def __init__(self, path: str, body: Any, leave_s: float | None = None) -> None:
        self.raw = json.dumps(body).encode()
        self.path, self.leave_s = path, leave_s
        self.status: int | None = None
        self.sent_at = self.answered_at = 0.0

    async def __call__(self, app: Starlette, delay_s: float = 0.0) -> None:
        await asyncio.sleep(delay_s)
        answered = asyncio.Event()
        sent = False
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": self.path,
            "raw_path": self.path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(self.raw)).encode())],
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 8080),
        }

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent, self.sent_at = True, time.monotonic()
                return {"type": "http.request", "body": self.raw, "more_body": False}
            if self.leave_s is not None:
                await asyncio.sleep(self.leave_s)
            else:
                await answered.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            if self.leave_s is not None and time.monotonic() - self.sent_at >= self.leave_s:
                return  # gone: nobody reads it
            if message["type"] == "http.response.start":
                self.status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                self.answered_at = time.monotonic()
                answered.set()

        await app(scope, receive, send)

    @property
    def latency(self) -> float:
        assert self.answered_at, "no answer"
        return self.answered_at - self.sent_at


def _app(runtime: Runtime, sizing: Sizing) -> tuple[Starlette, WorkerPool]:
    workers = WorkerPool(sizing, cpus=sizing.max_workers)
    return create_app(Host(lambda: runtime, workers)), workers


async def _serve(app: Starlette, clients: list[tuple[Client, float]], hold: threading.Event | None = None) -> None:
    async with app.router.lifespan_context(app):
        tasks = [asyncio.ensure_future(c(app, delay)) for c, delay in clients]
        if hold is not None:
            await asyncio.sleep(0.3)  # every request is read and queued behind the held worker
            hold.set()
        await asyncio.wait(tasks, timeout=120)
        for t in tasks:
            t.cancel()


def _idle(workers: WorkerPool) -> dict[str, Any]:
    """The pool's stats once the run a gone client left behind has finished."""
    deadline = time.monotonic() + 60
    while (stats := workers.stats())["busy"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return stats


def _held(workers: WorkerPool) -> threading.Event:
    """Keep the one worker busy until set, so what arrives meanwhile queues up and is taken as one batch."""
    started, release = threading.Event(), threading.Event()

    def job() -> None:
        started.set()
        release.wait(30)

    workers.submit(job)
    assert started.wait(10)
    return release


@pytest.mark.parametrize("small_first", [True, False])
def test_a_small_request_is_answered_before_its_large_batch_mate_finishes(runtime: Runtime, small_first: bool) -> None:
    """A 1-text request batched with a 16 x 256-token one: answered after its own model run (before: after
    the whole batch, ~1.5 s here, whichever was queued first)."""
    # Model runs of up to 2048 padded tokens: the 16 long texts (4096) run apart from the short one, as 64
    # of them (16384) did under the default 8192.
    sizing = Sizing(min_workers=1, max_workers=1, max_queue=64, batch_wait_s=0, batch_tokens=2048)
    app, workers = _app(runtime, sizing)
    small = Client("/embed", {"inputs": "hi"})
    big = Client("/embed", {"inputs": [f"{LONG} {i}" for i in range(16)]})
    hold = _held(workers)
    queued = [(small, 0.0), (big, 0.05)] if small_first else [(big, 0.0), (small, 0.05)]
    asyncio.run(_serve(app, queued, hold))
    workers.shutdown()
    assert (small.status, big.status) == (200, 200)
    assert workers.stats()["largest_batch"] == 2  # they did share a batch
    # Both waited for the hold to end; the small one then only for its own run.
    assert small.answered_at < big.answered_at - 0.5 * (big.answered_at - big.sent_at - 0.3)


def test_a_request_on_a_route_that_does_not_batch_never_runs_inside_a_batch(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow `/tokenize` (its own run, not the task's) queued right after a small `/embed`: before, it was
    gathered into the small one's batch and run inline ahead of the batch's model run."""
    tokenize = type(compat.ROUTES["/tokenize"])
    real = tokenize.run

    def slow(self: Any, task: Any, native: Any) -> dict[str, Any]:
        time.sleep(1.5)
        return real(self, task, native)

    monkeypatch.setattr(tokenize, "run", slow)
    app, workers = _app(runtime, Sizing(min_workers=1, max_workers=1, max_queue=64, batch_wait_s=0))
    small = Client("/embed", {"inputs": "hi"})
    slow_one = Client("/tokenize", {"inputs": "tokenize me"})
    hold = _held(workers)
    asyncio.run(_serve(app, [(small, 0.0), (slow_one, 0.05)], hold))
    workers.shutdown()
    assert (small.status, slow_one.status) == (200, 200)
    assert small.answered_at < slow_one.answered_at - 1.0


def _alone(runtime: Runtime, body: Any) -> float:
    """How long one request takes alone, on the caller's thread."""
    started = time.monotonic()
    status, _ = runtime.handle_body(json.dumps(body).encode())
    assert status == 200
    return time.monotonic() - started


def test_abandoned_requests_do_not_delay_a_live_one(runtime: Runtime, rows: list[int]) -> None:
    """One worker, 32 clients that send 16 texts and leave, then one that sends 1 text: before, it waited for
    all 32 (512 texts, > 10 s); now the abandoned ones leave the queue, or are skipped between model runs."""
    app, workers = _app(runtime, Sizing(min_workers=1, max_workers=1, max_queue=64))
    one_dead = _alone(runtime, {"inputs": [f"{MEDIUM} {i}" for i in range(16)]})
    rows.clear()
    dead = [Client("/embed", {"inputs": [f"{MEDIUM} {k} {i}" for i in range(16)]}, leave_s=0.02) for k in range(32)]
    live = Client("/embed", {"inputs": "hi"})
    asyncio.run(_serve(app, [(c, 0.002 * k) for k, c in enumerate(dead)] + [(live, 0.1)]))
    stats = _idle(workers)
    workers.shutdown()
    assert live.status == 200
    # At most the dead requests already running when their clients left, then its own run.
    assert live.latency < 3 * one_dead + 0.5, (live.latency, one_dead, rows)
    # Most of the 512 dead texts never ran: only a run already under way when its clients left (<= 8192
    # padded tokens, ~150 of these texts) and the live one.
    assert sum(rows) < 512 // 3, rows
    assert stats["abandoned"] == 32 and stats["queued"] == 0
    assert stats["completed"] + stats["dropped"] == stats["submitted"]


def test_dead_clients_never_fill_the_queue_for_live_ones(runtime: Runtime) -> None:
    """2 workers, a queue of 64: 60 clients that send 16 texts and leave, 60 that send 1 text and wait,
    arriving interleaved. Before, the dead requests held their places in the queue and ran, and live ones
    got 503 (26 of 60 in the report); now every live one gets 200."""
    app, workers = _app(runtime, Sizing(min_workers=2, max_workers=2, max_queue=64, max_batch=32))
    # They leave as soon as they have sent: a dead request then holds its place only until the host sees it.
    dead = [Client("/embed", {"inputs": [f"{MEDIUM} {k} {i}" for i in range(16)]}, leave_s=0) for k in range(60)]
    live = [Client("/embed", {"inputs": f"a live request, number {k}"}) for k in range(60)]
    clients = [(c, 0.004 * k) for k, pair in enumerate(zip(dead, live, strict=True)) for c in pair]
    asyncio.run(_serve(app, clients))
    stats = _idle(workers)
    workers.shutdown()
    refused = [c.status for c in live if c.status != 200]
    assert refused == [], (len(refused), stats)
    assert stats["abandoned"] == 60 and stats["rejected"] == 0


def test_requests_of_a_task_that_does_not_batch_are_handed_back_and_answered_one_by_one(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model whose task does not batch (a tensor model; here the embedding task with a spec saying it does
    not): each request of a gathered batch goes back to the pool and runs as its own job, answered when it is
    done. Before, they ran inline, one after another, and all were answered when the last had run."""
    assert runtime.workers is None or runtime.workers.stats()["busy"] == 0
    name = runtime.task.name
    monkeypatch.setitem(catalog._specs, name, replace(catalog.spec(name), batches=False))
    monkeypatch.delattr(type(runtime.task), "prepare")  # never reached: the spec decides
    real = type(runtime.task).__call__

    def slow(self: Any, payload: Any) -> Any:
        time.sleep(1.0)
        return real(self, payload)

    monkeypatch.setattr(type(runtime.task), "__call__", slow)
    workers = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=64, batch_wait_s=0), cpus=1)
    runtime.workers = workers
    try:
        release = _held(workers)
        calls = [HttpCall(json.dumps({"inputs": text}).encode()) for text in ("first", "second")]
        futures = [workers.submit_batch(runtime.handle_http_batch, c) for c in calls]
        answered: dict[int, float] = {}
        for k, f in enumerate(futures):
            f.add_done_callback(partial(lambda k, _: answered.setdefault(k, time.monotonic()), k))
        release.set()
        answers = [f.result(60) for f in futures]
    finally:
        workers.shutdown()
        runtime.workers = None
    assert [status for status, _, _ in answers] == [200, 200]
    assert [len(json.loads(body)["embeddings"]) for _, body, _ in answers] == [1, 1]
    assert answered[0] < answered[1] - 0.5  # the first did not wait for the second's run
    stats = workers.stats()
    assert (stats["largest_batch"], stats["completed"], stats["submitted"]) == (2, 3, 3)  # the hold, two alone
