"""The local Lambda's REPORT line: Billed Duration must follow from the figures it prints.

A reader of the log (a cost dashboard, our own tests) has only the printed two-decimal values; billing the
unrounded sum could charge a millisecond the printed figures do not add up to (20.004 + 56.998 printed as
20.00 + 57.00 = 77.00, billed 78).
"""

from __future__ import annotations

import asyncio
import math
import re
from decimal import Decimal

import pytest

from infra.local.invocation import Invocation


def _invocation(
    duration_ms: float, init_ms: float | None, *, bill_init: bool, restore_ms: float | None = None
) -> Invocation:
    loop = asyncio.new_event_loop()
    try:
        inv = Invocation(
            request_id="r",
            payload=b"{}",
            version="$LATEST",
            function_arn="arn:aws:lambda:us-east-1:123456789012:function:f",
            done=loop.create_future(),
        )
    finally:
        loop.close()
    inv.started_at = 1000.0
    inv.ended_at = 1000.0 + duration_ms / 1000.0
    inv.init_duration_ms = init_ms
    inv.bill_init = bill_init
    inv.restore_duration_ms = restore_ms
    return inv


def _fields(inv: Invocation) -> dict[str, str]:
    line = inv.report_lines(memory_mb=128, status=None, error_type=None).splitlines()[1]
    return dict(re.findall(r"([A-Za-z ]+): ([^\t]+)", line.removeprefix("REPORT ")))


@pytest.mark.parametrize(
    ("duration", "init", "bill_init"),
    [
        (20.004, 56.998, True),  # the unrounded sum is over 77, the printed one is 77.00
        (20.006, 56.998, True),  # printed 20.01 + 57.00: over 77 either way
        (0.004, None, False),  # never under 1 ms
        (19.996, 56.0, False),  # printed 20.00: bills 20, not 21
        (41.3349, 12.0, False),
    ],
)
def test_billed_duration_is_the_ceiling_of_the_printed_figures(
    duration: float, init: float | None, bill_init: bool
) -> None:
    fields = _fields(_invocation(duration, init, bill_init=bill_init))
    printed = Decimal(fields["Duration"].split()[0])
    if bill_init and init is not None:
        printed += Decimal(fields["Init Duration"].split()[0])
    assert int(fields["Billed Duration"].split()[0]) == max(1, math.ceil(printed))


def test_billed_restore_duration_is_the_ceiling_of_the_printed_restore() -> None:
    fields = _fields(_invocation(5.0, None, bill_init=False, restore_ms=12.004))
    assert fields["Restore Duration"] == "12.00 ms"
    assert fields["Billed Restore Duration"] == "12 ms"
