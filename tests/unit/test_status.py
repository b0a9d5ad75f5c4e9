"""Tracing windows: started by the operator (env or direct invoke), bounded, stopped by themselves."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Iterator

import pytest

from handler.core.config import Config
from handler.core.errors import ConfigError, InvalidInputError
from handler.runtime import status
from handler.runtime.invocation import Runtime


@pytest.fixture(autouse=True)
def no_tracing_left() -> Iterator[None]:
    yield
    status.Diagnostics().stop_tracing()
    assert not tracemalloc.is_tracing()


class Clock:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = time.monotonic()
        monkeypatch.setattr(status, "_now", lambda: self.now)


def test_a_direct_invoke_starts_a_window_that_stops_by_itself(
    new_runtime: Callable[..., Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, clock = new_runtime(), Clock(monkeypatch)
    first = rt.handle({"warmstart": "status", "tracemalloc": True, "tracemalloc_s": 60}, None)
    assert first["tracemalloc"]["started"] is True and first["tracemalloc"]["stops_in_s"] == 60
    clock.now += 30
    rt.handle({"inputs": ["a"]}, None)
    second = rt.handle({"warmstart": "status", "tracemalloc": True}, None)
    assert "growth_kb" in second["tracemalloc"] and second["tracemalloc"]["stops_in_s"] == 30
    clock.now += 31
    rt.handle({"inputs": ["b"]}, None)  # any invocation past the deadline stops it
    assert not tracemalloc.is_tracing()
    assert rt.health()["tracemalloc"] is False


def test_the_default_window_is_bounded(new_runtime: Callable[..., Runtime]) -> None:
    rt = new_runtime()
    reply = rt.handle({"warmstart": "status", "tracemalloc": True}, None)
    assert reply["tracemalloc"]["stops_in_s"] == status.DEFAULT_TRACE_S


@pytest.mark.parametrize("seconds", [0, 3601, "60", True])
def test_the_window_must_be_a_bounded_number_of_seconds(new_runtime: Callable[..., Runtime], seconds: object) -> None:
    with pytest.raises(InvalidInputError, match=r"tracemalloc_s must be an integer number of seconds in \[1, 3600\]"):
        new_runtime().handle({"warmstart": "status", "tracemalloc": True, "tracemalloc_s": seconds}, None)
    assert not tracemalloc.is_tracing()


def test_the_operator_may_start_it_from_the_environment(
    new_runtime: Callable[..., Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(monkeypatch)
    rt = new_runtime(tracemalloc_s=5)
    assert tracemalloc.is_tracing() and rt.init_report["tracemalloc_s"] == 5
    clock.now += 5
    rt.handle({"warmer": True}, None)
    assert not tracemalloc.is_tracing()


def test_settings() -> None:
    env = {"WARMSTART_HTTP_STATUS": "full", "WARMSTART_TRACEMALLOC_S": "120"}
    config = Config.from_environ(env)
    assert (config.http_status, config.tracemalloc_s) == ("full", 120)
    assert Config.from_environ({}).http_status == "basic"
    with pytest.raises(ConfigError, match="WARMSTART_HTTP_STATUS='all'; valid values: basic, full"):
        Config.from_environ({"WARMSTART_HTTP_STATUS": "all"})
    with pytest.raises(ConfigError, match=r"WARMSTART_TRACEMALLOC_S=3601 is outside \[0, 3600\]"):
        Config.from_environ({"WARMSTART_TRACEMALLOC_S": "3601"})
