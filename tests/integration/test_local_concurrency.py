"""Many instances: concurrent cold starts, throttling, async delivery, keep-alive reaping."""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # the fixtures live under tests/, which is not an installed package
    sys.path.insert(0, ROOT)

from tests.fixtures.local_support import alive, invoke, report, running, wait_until  # noqa: E402

pytestmark = pytest.mark.integration


def test_concurrent_cold_invocations_start_one_instance_each() -> None:
    n = 4
    with running(max_concurrency=n) as (local, client):
        gate = threading.Barrier(n)

        def call(_i: int) -> tuple[dict[str, Any], Any, str]:
            gate.wait()
            return invoke(client, {"sleep_ms": 1500})  # held, so no instance can serve two of them

        with ThreadPoolExecutor(n) as pool:
            results = list(pool.map(call, range(n)))
        pids = {body["pid"] for _, body, _ in results}
        assert len(pids) == n
        assert local.pool.spawned == n
        for _, _, log in results:
            assert float(report(log)["Init Duration"].split()[0]) > 0


def test_beyond_max_concurrency_is_throttled_with_429() -> None:
    with running(max_concurrency=1) as (_local, client):
        holder = threading.Thread(target=invoke, args=(client, {"sleep_ms": 4000}))
        holder.start()
        try:
            # wait until the one instance is busy, then a second caller must be throttled
            assert wait_until(lambda: _local.pool.inflight == 1)
            with pytest.raises(client.exceptions.TooManyRequestsException) as caught:
                invoke(client, {})
            assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429
        finally:
            holder.join(60)


def test_async_invocations_are_delivered(tmp_path: Path) -> None:
    with running(max_concurrency=2) as (_local, client):
        targets = [tmp_path / f"event-{i}.txt" for i in range(6)]
        for i, target in enumerate(targets):
            event = {"write": str(target), "text": f"event {i}", "sleep_ms": 100}
            result = client.invoke(FunctionName="warmstart", InvocationType="Event", Payload=_json(event))
            assert result["StatusCode"] == 202
        # more events than instances: the queue waits out its own throttling rather than dropping any
        assert wait_until(lambda: all(t.exists() for t in targets), timeout=60)
        assert [t.read_text() for t in targets] == [f"event {i}" for i in range(6)]


def test_idle_instances_are_reaped_after_keep_alive() -> None:
    with running(keep_alive_s=0.5) as (_local, client):
        _, first, _ = invoke(client, {})
        assert wait_until(lambda: not alive(first["pid"]), timeout=30)
        _, second, log = invoke(client, {})
        assert second["pid"] != first["pid"]
        assert "Init Duration" in report(log)


def _json(event: Any) -> bytes:
    import json

    return json.dumps(event).encode()
