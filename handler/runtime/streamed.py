"""A Lambda invocation answered as a response stream, for the streaming loop (`handler.runtime.lambda_loop`).

`frames(runtime, event, context)` is one generator per invocation, inside the invocation's bracket (counted,
logged, its metrics written when the generator ends), yielding first how the answer goes out, then its bytes:

- `Buffered(body)`: one answer, posted as it is (`POST /response`): a direct invoke that did not ask to stream,
  a control event, an HTTP API or ALB event (they always buffer). A direct invoke's error is raised from the
  first `next` (the loop posts it to `/error`, as awslambdaric does).
- `Streamed(content_type)`, then the body's chunks, each written as it is made:
  - a direct invoke asking `"stream": true` (`InvokeWithResponseStream`): server-sent events, the very bytes the
    HTTP host sends (`handler.api.sse`);
  - a Function URL or REST API event (`handler.api.prelude.streams`): the HTTP integration response: its
    prelude (status, headers), then the events; a request that did not ask to stream, and any error before the
    first piece, is the prelude with its status and the one JSON body the buffered answer would have had.
  An error after the first piece is an SSE `error` event, then raised: the loop ends the body with the error
  trailers.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from handler.api import prelude, sse
from handler.api.compat import LAMBDA_PATHS, NATIVE, ROUTES, chunks
from handler.api.encode import dumps
from handler.api.ping import is_ping
from handler.api.sources import EventSource, infer_source
from handler.core import numpy_gate
from handler.core.errors import Abandoned, RequestError
from handler.core.records import record
from handler.core.types import Event
from handler.observability import trace
from handler.tasks import catalog
from handler.tasks.streaming import wants_stream

if TYPE_CHECKING:  # for type checkers only (a Protocol class costs init time); not invocation's Runtime: a cycle
    from contextlib import AbstractContextManager
    from typing import Protocol

    from handler.core.types import JSON
    from handler.observability.logs import Invocation

    class Runtime(Protocol):
        """What the frames need of `handler.runtime.invocation.Runtime`."""

        tracer: Any

        def _invocation(
            self, request_id: str | None, trace_id: str | None
        ) -> AbstractContextManager[tuple[Invocation, int]]: ...
        def lambda_deadline(self, context: Any) -> AbstractContextManager[None]: ...
        def _handle(self, event: Event, context: Any, count: int, inv: Invocation) -> JSON: ...
        def _failure(self, error: Exception, source: str, log_internal: bool = True) -> tuple[int, JSON]: ...
        def count(self, kind: str) -> None: ...
        def find(self, model_id: str) -> str | None: ...
        def task_name(self, payload: JSON) -> str: ...
        def serve_stream(self, payload: JSON, check: Any = None) -> Generator[dict[str, Any], None, None]: ...
        def served_key(self, payload: JSON) -> str: ...


@record
class Buffered:
    """One whole answer, posted as it is."""

    body: bytes
    content_type: str = "application/json"


@record
class Streamed:
    """A response stream of this content type: the generator's next items are its chunks (bytes)."""

    content_type: str


Frame = Buffered | Streamed | bytes


def frames(rt: Runtime, event: Event, context: Any) -> Generator[Frame, None, None]:
    request_id = getattr(context, "aws_request_id", None)
    with ExitStack() as stack:
        inv, count = stack.enter_context(rt._invocation(request_id, trace.lambda_trace_id()))
        stack.enter_context(rt.lambda_deadline(context))
        if rt.tracer is not None:
            stack.enter_context(trace.span(rt.tracer, "warmstart.invoke", {"warmstart.model": inv.model}))
        source = infer_source(event)
        http = source.http and prelude.streams(event)
        opened = _open(rt, source, event, http) if http or source.name == "direct" else None
        if opened is None:  # one answer, exactly as `handle` gives it (a direct invoke's error raised)
            answer = rt._handle(event, context, count, inv)
            if http:
                yield Streamed(prelude.CONTENT_TYPE)
                yield prelude.buffered(answer)
            else:
                yield Buffered(dumps(answer))
            if numpy_gate.lean():  # a lean start: numpy's import once the answer is out (handler.core.numpy_gate)
                numpy_gate.load_later()
            return
        if isinstance(opened, bytes):  # refused before the first piece, on an HTTP source
            yield Streamed(prelude.CONTENT_TYPE)
            yield opened
            return
        pieces, first = opened
        yield Streamed(prelude.CONTENT_TYPE if http else sse.EVENT_STREAM)
        if http:
            yield prelude.prelude(200, sse.HEADERS)
        sent = 0
        try:
            if first is not None:
                yield sse.event(first)
                sent = 1
                for piece in pieces:
                    yield sse.event(piece)
                    sent += 1
            yield sse.DONE
        except GeneratorExit:  # the loop could not write on (the Runtime API connection broke): not a fault
            inv.error, inv.fault = Abandoned.__name__, False
            pieces.close()
            raise
        except Exception as e:  # after the first piece: an error event, then the trailers (the loop's)
            rt._failure(e, source.name, log_internal=False)  # the loop logs it, as awslambdaric logs errors
            yield sse.error_event(e)
            raise
        finally:
            inv.batch, inv.tokens = 1, sent  # a stream's metrics: its pieces


def _open(
    rt: Runtime, source: EventSource, event: Event, http: bool
) -> tuple[Generator[Any, None, None], Any] | bytes | None:
    """A request asking `"stream": true` of a streaming model: its pieces and the first of them (None when there
    are none). None for anything else (`handle` answers it); an HTTP source's error before the first piece as its
    whole integration response; a direct invoke's raised."""
    try:
        payload = source.payload(event)
    except Exception:
        return None  # `handle` refuses it, as it always has
    if not isinstance(payload, dict) or "stream" not in payload or "warmstart" in payload:
        return None
    if not http and is_ping(payload):
        return None
    try:
        if not wants_stream(payload):  # false; a non-boolean is refused, naming the field
            return None
        route = ROUTES[path] if http and (path := source.path(event)) in LAMBDA_PATHS else NATIVE  # type: ignore[attr-defined]
        native = route.request(payload, rt.find)
        if not catalog.spec(rt.task_name(native)).streams:
            return None  # a model that answers one value: `handle` answers it, "stream" or not
        rt.count("inference")
        # In the route's own chunks (OpenAI's for /v1/chat/completions), as the HTTP host streams them.
        pieces = chunks(route, rt.serve_stream(native, route.check), payload, rt.served_key(native))
        return pieces, next(pieces, None)
    except Exception as e:
        status, body = rt._failure(e, source.name, log_internal=http)
        if http:
            return prelude.buffered(source.respond(event, body, status))
        if isinstance(e, RequestError):  # reported by its class name, without our frames (as `handle` does)
            raise e.with_traceback(None) from None
        raise
