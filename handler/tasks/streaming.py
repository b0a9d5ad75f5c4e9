"""The stream contract: a task whose answer is a sequence of pieces rather than one value.

A streaming task's spec declares `streams=True` and the task exposes `stream(payload) -> Iterator[dict]`: each
piece is a JSON object, produced as the task makes it (a generated token, a chunk). The layers above carry the
pieces end to end: the worker pool (`handler.runtime.pieces`: a bounded buffer, a consumer that leaves stops the
producer at its next piece), the HTTP host (server-sent events when the request asks `"stream": true`), Lambda
(one buffered answer, `collect`). Whether a task streams is asked in one place only, `streams`.

A streaming task's `stream` may check its payload lazily (at the first `next`): an error raised before the
first piece is the request's ordinary typed error; one raised after it ends the stream with an error piece.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from handler.core.errors import ConfigError, InvalidInputError, UnsupportedRequestError
from handler.core.types import JSON
from handler.tasks import catalog

if TYPE_CHECKING:  # for type checkers only: a Protocol class costs ~0.1 ms of Lambda init to build
    from typing import Protocol

    class StreamingTask(Protocol):
        name: str
        streams: bool

        def stream(self, payload: JSON) -> Iterator[dict[str, Any]]: ...


def streams(task: object) -> bool:
    """Does this task answer with a stream of pieces? The one check every layer uses: its spec's `streams`
    (`handler.tasks.spec.TaskSpec`), and a `stream` to call. A task object the catalog does not know (a test's
    stand-in) answers one value."""
    try:
        declared = catalog.spec(getattr(task, "name", "")).streams
    except ConfigError:
        return False
    return declared and callable(getattr(task, "stream", None))


def wants_stream(payload: JSON) -> bool:
    """The request's `"stream"` field (OpenAI's name): true asks for the pieces as they come (HTTP hosts);
    absent or false, one answer. Anything but a boolean is refused, naming the field."""
    if not isinstance(payload, dict) or "stream" not in payload:
        return False
    value = payload["stream"]
    if not isinstance(value, bool):
        raise InvalidInputError(f'"stream" must be true or false, got {type(value).__name__}')
    return value


def collect(task: object, pieces: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """A stream buffered into one answer (Lambda's RequestResponse invokes, HTTP requests without
    `"stream": true`): the task's own `gather(pieces)` when it has one (generation joins its text), else
    `{"pieces": [piece, ...]}` in the order produced."""
    gather = getattr(task, "gather", None)
    if callable(gather):
        answer: dict[str, Any] = gather(pieces)
        return answer
    return {"pieces": list(pieces)}


def all_pieces(task: Any, payload: JSON) -> dict[str, Any]:
    """Every piece of a streaming task's answer, in order, as `{"pieces": [...]}` (a stream buffered whole: a
    Lambda HTTP event asking `"stream": true` gets its events in one body). A task that does not stream is
    refused, as `"stream": true` is on the HTTP host."""
    if not streams(task):
        name = getattr(task, "name", "this")
        raise UnsupportedRequestError(f'a {name} model answers one value; "stream": true is for streaming tasks')
    return {"pieces": list(task.stream(payload))}
