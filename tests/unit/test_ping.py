"""is_ping and hold_ms."""

from __future__ import annotations

import math
from typing import Any

import pytest

from handler.api.ping import hold_ms, is_ping
from handler.core.errors import InvalidInputError


@pytest.mark.parametrize(
    "payload",
    [
        {"warmer": True},
        {"warmer": True, "concurrency": 5, "hold_ms": 100},
        {"source": "serverless-plugin-warmup"},
        {"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}},
    ],
)
def test_pings(payload: dict[str, Any]) -> None:
    assert is_ping(payload)


@pytest.mark.parametrize(
    "payload",
    [
        {"warmer": "yes"},
        {"warmer": "true"},
        {"warmer": 1},
        {"warmer": False},
        {"source": "aws.events"},
        {"source": "aws.events", "detail-type": "EC2 Instance State-change Notification"},
        {"detail-type": "Scheduled Event"},
        {"source": "Serverless-Plugin-Warmup"},
        {"inputs": ["warmer"]},
        [{"warmer": True}],
        "warmer",
        None,
        True,
    ],
)
def test_not_pings(payload: Any) -> None:
    assert not is_ping(payload)


@pytest.mark.parametrize(
    ("raw", "cap", "remaining", "expected"),
    [
        (None, 1000, None, 0),  # absent
        (250, 1000, None, 250),
        (250.9, 1000, None, 250),
        (5000, 1000, None, 1000),
        (math.inf, 1000, None, 1000),
        (5000, 1000, 400, 300),  # 100 ms kept to answer
        (5000, 1000, 50, 0),
        (200, 1000, 5000, 200),
        (0, 0, None, 0),
    ],
)
def test_hold_ms_bounds(raw: Any, cap: int, remaining: int | None, expected: int) -> None:
    payload = {} if raw is None else {"hold_ms": raw}
    held = hold_ms(payload, cap, remaining)
    assert held == expected
    assert isinstance(held, int)


@pytest.mark.parametrize("raw", [-1, -0.5, math.nan, True, False, "100", None, [1], {"ms": 1}])
def test_hold_ms_rejects(raw: Any) -> None:
    with pytest.raises(InvalidInputError, match="hold_ms must be a non-negative number"):
        hold_ms({"hold_ms": raw}, 1000, None)
