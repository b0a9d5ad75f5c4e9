"""Warm pings: answered at once with instance facts, never touching the model; `hold_ms` bounded."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from handler.core.errors import RequestError
from handler.runtime.invocation import Runtime
from tests.conftest import MODEL_KEY, FakeContext, start

PINGS = ["warmer.json", "serverless_plugin_warmup.json", "eventbridge_scheduled.json"]


@pytest.mark.parametrize("name", PINGS)
def test_ping_events_get_instance_facts(name: str, onnx_runtime: Runtime, load_event: Callable[[str], Any]) -> None:
    onnx_runtime.handle({"inputs": ["not the first invocation"]}, None)
    before = onnx_runtime.invocations
    reply = onnx_runtime.handle(load_event(name), None)
    assert reply["warm"] is True
    assert reply["instance_id"] == onnx_runtime.instance_id
    assert reply["model"] == MODEL_KEY
    assert reply["init_ms"] == onnx_runtime.init_report["total_ms"] > 0
    assert reply["invocations"] == before + 1
    assert reply["cold"] is False
    assert "embeddings" not in reply


def test_cold_only_on_the_first_invocation(new_runtime: Callable[..., Runtime]) -> None:
    runtime = new_runtime()
    first, second = runtime.handle({"warmer": True}, None), runtime.handle({"warmer": True}, None)
    assert (first["cold"], second["cold"]) == (True, False)
    assert (first["invocations"], second["invocations"]) == (1, 2)
    assert first["instance_id"] == second["instance_id"]


def test_not_cold_after_a_real_request(new_runtime: Callable[..., Runtime]) -> None:
    runtime = new_runtime()
    runtime.handle({"inputs": ["first"]}, None)
    reply = runtime.handle({"source": "serverless-plugin-warmup"}, None)
    assert reply["cold"] is False
    assert reply["invocations"] == 2


def test_instances_have_distinct_ids(new_runtime: Callable[..., Runtime]) -> None:
    a, b = new_runtime(), new_runtime()
    assert a.handle({"warmer": True}, None)["instance_id"] != b.handle({"warmer": True}, None)["instance_id"]


def test_ping_does_not_run_the_model(new_runtime: Callable[..., Runtime], load_event: Callable[[str], Any]) -> None:
    runtime = new_runtime()
    calls = []
    real_run = runtime.backend.run

    def counting_run(feeds: Any) -> Any:
        calls.append(feeds)
        return real_run(feeds)

    runtime.backend.run = counting_run  # type: ignore[method-assign]
    for name in PINGS:
        assert runtime.handle(load_event(name), None)["warm"] is True
    assert calls == []
    runtime.handle({"inputs": ["the counter works"]}, None)
    assert len(calls) == 1


def test_correlation_id_is_echoed(onnx_runtime: Runtime) -> None:
    assert onnx_runtime.handle({"warmer": True, "correlation_id": "abc-123"}, None)["correlation_id"] == "abc-123"
    assert "correlation_id" not in onnx_runtime.handle({"warmer": True}, None)


def timed_ping(runtime: Runtime, hold: Any, context: Any = None) -> tuple[dict[str, Any], float]:
    t0 = time.perf_counter()
    reply = runtime.handle({"warmer": True, "hold_ms": hold}, context)
    return reply, (time.perf_counter() - t0) * 1000


@pytest.fixture(scope="module")
def holder(model_dir: Any) -> Runtime:
    return start(model_dir, "onnx", warmup=False, max_hold_ms=300)


def test_hold_ms_holds(holder: Runtime) -> None:
    reply, elapsed = timed_ping(holder, 120)
    assert reply["held_ms"] == 120
    assert elapsed >= 115  # sleep may wake a hair early on a coarse clock; never much


def test_hold_ms_is_capped_by_max_hold_ms(holder: Runtime) -> None:
    reply, elapsed = timed_ping(holder, 60_000)
    assert reply["held_ms"] == 300
    assert 290 <= elapsed < 5_000


def test_hold_ms_is_capped_by_the_remaining_time(holder: Runtime) -> None:
    reply, elapsed = timed_ping(holder, 60_000, FakeContext(remaining_ms=180))
    assert reply["held_ms"] == 80  # 100 ms kept to answer
    assert 75 <= elapsed < 5_000
    reply, _ = timed_ping(holder, 60_000, FakeContext(remaining_ms=50))
    assert reply["held_ms"] == 0


def test_no_hold_by_default(holder: Runtime) -> None:
    reply, elapsed = timed_ping(holder, 0)
    assert reply["held_ms"] == 0
    assert elapsed < 250


@pytest.mark.parametrize("hold", [-1, "100", True, None, [100]])
def test_bad_hold_ms_is_a_typed_error(hold: Any, holder: Runtime) -> None:
    with pytest.raises(RequestError) as info:
        holder.handle({"warmer": True, "hold_ms": hold}, None)
    assert type(info.value).__name__ == "InvalidInputError"
    assert "hold_ms" in str(info.value)
    assert holder.handle({"warmer": True}, None)["warm"] is True


@pytest.mark.parametrize(
    "event",
    [
        {"warmer": "yes"},
        {"warmer": 1},
        {"source": "aws.events", "detail-type": "Object Created"},
        {"source": "serverless-plugin-warmup-v2"},
    ],
)
def test_near_pings_are_requests(event: dict[str, Any], onnx_runtime: Runtime) -> None:
    with pytest.raises(RequestError, match='no "inputs"'):
        onnx_runtime.handle(event, None)
