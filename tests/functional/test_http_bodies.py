"""The HTTP host's body budget (handler/http_host/budget.py): the bytes of request bodies held at once, read,
queued or running, are bounded, so many large bodies queued together cannot take the instance's memory (each
within the payload limit, 64 queued 32 MB bodies were 2 GB); past the budget a request is refused at once with
503, and every byte is released when its answer is done or its abandoned work ends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from handler.http_host.host import Host
from handler.http_host.routes import create_app
from handler.http_host.settings import HostSettings
from handler.runtime.invocation import Runtime
from handler.runtime.workers import Sizing, WorkerPool
from tests.functional.test_http_latency import Client, _held, _idle, _serve

TEXT = "a sentence of a few words, " * 20  # ~540 bytes of JSON a text


@pytest.fixture(scope="module")
def runtime(new_runtime: Callable[..., Runtime]) -> Runtime:
    return new_runtime()


def _host(runtime: Runtime, budget: int) -> tuple[Host, WorkerPool]:
    workers = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=64, batch_wait_s=0), cpus=1)
    return Host(lambda: runtime, workers, HostSettings(body_budget=budget)), workers


def test_bodies_past_the_budget_are_refused_at_once_and_released_when_answered(runtime: Runtime) -> None:
    """Three ~5 KB bodies queued behind a busy worker with a 12 KB budget: two are held, the third is refused
    with 503 (before the budget: all three were held, whatever their size); afterwards nothing is held."""
    host, workers = _host(runtime, 12_000)
    clients = [Client("/embed", {"inputs": [f"{TEXT} {k} {i}" for i in range(10)]}) for k in range(3)]
    assert all(4_000 < len(c.raw) < 6_000 for c in clients)
    hold = _held(workers)
    asyncio.run(_serve(create_app(host), [(c, 0.05 * k) for k, c in enumerate(clients)], hold))
    workers.shutdown()
    assert sorted(c.status or 0 for c in clients) == [200, 200, 503]
    refused = next(c for c in clients if c.status == 503)
    # At once (refused on its Content-Length, before its body is read), not after the held ones were answered.
    assert refused.answered_at < min(c.answered_at for c in clients if c.status == 200)
    held = sum(len(c.raw) for c in clients if c.status == 200)
    assert host.bodies.describe() == {"limit": 12_000, "held": 0, "high_water": held, "refused": 1}


def test_a_body_alone_may_use_the_whole_budget(runtime: Runtime) -> None:
    """A budget below one body still serves it, one at a time (never a request no instance could take)."""
    host, workers = _host(runtime, 100)
    client = Client("/embed", {"inputs": [TEXT]})
    asyncio.run(_serve(create_app(host), [(client, 0.0)]))
    workers.shutdown()
    assert client.status == 200
    assert host.bodies.held == 0


def test_an_abandoned_requests_body_is_released_when_its_work_ends(runtime: Runtime) -> None:
    """A client that leaves while its request waits: its bytes leave the budget (its queued job is dropped)."""
    host, workers = _host(runtime, 1 << 20)
    gone = Client("/embed", {"inputs": [f"{TEXT} {i}" for i in range(10)]}, leave_s=0.05)
    live = Client("/embed", {"inputs": "hi"})
    hold = _held(workers)
    asyncio.run(_serve(create_app(host), [(gone, 0.0), (live, 0.1)], hold))
    _idle(workers)
    workers.shutdown()
    assert live.status == 200
    deadline = time.monotonic() + 10
    while host.bodies.held and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host.bodies.held == 0
    assert host.bodies.high_water >= len(gone.raw)
