"""The stream contract's one check (`streams`), the request's `"stream"` field, and the buffered shape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from handler.core.errors import InvalidInputError
from handler.tasks.streaming import collect, streams, wants_stream


class Streams:
    streams = True

    def stream(self, payload: Any) -> Iterator[dict[str, Any]]:
        yield {"i": 0}


class Declares:  # says it streams, has nothing to stream with
    streams = True


class Truthy(Streams):
    streams = "yes"  # type: ignore[assignment]


def test_streams_needs_the_declaration_and_the_method() -> None:
    assert streams(Streams())
    assert not streams(Declares()) and not streams(Truthy()) and not streams(object())


@pytest.mark.parametrize(("payload", "wanted"), [({"stream": True}, True), ({"stream": False}, False), ({}, False)])
def test_wants_stream(payload: Any, wanted: bool) -> None:
    assert wants_stream(payload) is wanted
    assert wants_stream(["not", "an", "object"]) is False


@pytest.mark.parametrize("value", ["true", 1, None, [True]])
def test_stream_must_be_a_boolean(value: Any) -> None:
    with pytest.raises(InvalidInputError, match='"stream" must be true or false'):
        wants_stream({"stream": value})


def test_collect_keeps_the_order_or_uses_the_tasks_gather() -> None:
    assert collect(Streams(), iter([{"i": 0}, {"i": 1}])) == {"pieces": [{"i": 0}, {"i": 1}]}

    class Joins(Streams):
        def gather(self, pieces: Any) -> dict[str, Any]:
            return {"n": sum(1 for _ in pieces)}

    assert collect(Joins(), iter([{}, {}, {}])) == {"n": 3}
