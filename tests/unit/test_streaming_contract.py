"""The stream contract's one check (`streams`), the request's `"stream"` field, and the buffered shape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from handler.core.errors import InvalidInputError
from handler.tasks import catalog
from handler.tasks.streaming import collect, streams, wants_stream
from tests.fixtures.streaming_toy import SPEC


class Streams:
    name = "count"  # the toy streaming task's spec (tests/fixtures/streaming_toy.py) says streams=True

    def stream(self, payload: Any) -> Iterator[dict[str, Any]]:
        yield {"i": 0}


class Declares:  # its spec says it streams; it has nothing to stream with
    name = "count"


class Undeclared(Streams):  # can stream, but its spec answers one value
    name = "embedding"


class Unknown(Streams):  # no spec at all: a stand-in the catalog does not know
    name = "no-such-task"


@pytest.fixture(autouse=True)
def toy_spec() -> Iterator[None]:
    catalog._specs.setdefault(SPEC.name, SPEC)
    yield
    catalog._specs.pop(SPEC.name, None)


def test_streams_needs_the_spec_and_the_method() -> None:
    assert streams(Streams())
    assert not streams(Declares()) and not streams(Undeclared()) and not streams(Unknown()) and not streams(object())


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
