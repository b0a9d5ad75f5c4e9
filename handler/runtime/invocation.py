"""`Runtime`: one function instance (`handler.runtime.instance`) with its request paths.

Two paths, one bracket (`_invocation`: counted, logged in its context, measured as metrics):
- `handle(event, context)`: a Lambda invocation. The event source is detected (direct invoke, API Gateway,
  Function URL, ALB); warm pings, status and admin events are answered without the model; a compatible API's
  path (OpenAI, TEI, Cohere) is translated (a stream asked for: its route's chunks buffered as one body of
  server-sent events; `GET /v1/models` answered without the model); the answer is shaped for the source.
- `handle_http(raw, route, ...)`: the HTTP host's POSTed body, run on a worker, with the same task and error
  contract (`handle_http_batch`: several; `handle_http_stream`: a streaming task's pieces, in the route's chunks).

Answers carry their floats as float32 arrays up to the edge, where `handler.api.encode.dumps` writes them once:
`handle_http`'s body bytes, an HTTP event's `body`, and `lambda_reply`, the Lambda entry point's bytes.

About one thing (an invocation's paths, which share its bracket, its route mapping and its error contract), hence
its length.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from handler.api.encode import dumps
from handler.api.ping import is_ping
from handler.api.sources import decode_body, infer_source
from handler.core import deadline, numpy_gate
from handler.core.config import LAMBDA_PAYLOAD_LIMIT, Config
from handler.core.errors import Abandoned, RequestError, internal_error_body
from handler.core.records import record
from handler.core.types import JSON, Event
from handler.models.registry import requested_model
from handler.observability import logs, report, trace
from handler.runtime import init
from handler.runtime.instance import Instance, check_served, usage
from handler.tasks import catalog
from handler.tasks.streaming import all_pieces, wants_stream

if TYPE_CHECKING:
    from handler.api.compat import Route
    from handler.api.media import Kind
    from handler.models.origins import ModelSources
    from handler.runtime.streamed import Frame
    from handler.runtime.workers import Batch  # loaded by HTTP hosts only, never on Lambda's init path
    from handler.tasks.batch import BatchModel, Prepared  # as `Batch`: imported by _run_batch where it runs

log = logging.getLogger("warmstart")
ADMIN_OVER_HTTP = "model admin events are accepted from direct invokes only"
EVENT_STREAM = "text/event-stream"  # a buffered stream's media type (the HTTP host's: handler.http_host.sse)


class Runtime(Instance):
    @classmethod
    def start(
        cls,
        config: Config | None = None,
        environ: Mapping[str, str] | None = None,
        emit: Callable[[dict[str, Any]], None] | None = report.emit,
        sources: ModelSources | None = None,
    ) -> Runtime:
        """The init phase (`handler.runtime.init`), building this class."""
        return init.start(cls, config, environ, emit, sources)

    # -- control replies (handler.runtime.control, loaded by the first: an inference never needs it) -----------

    def ping(self, payload: dict[str, Any], context: Any, cold: bool, count: int) -> dict[str, Any]:
        from handler.runtime import control

        return control.ping(self, payload, context, cold, count)

    def status(self, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        from handler.runtime import control

        return control.status(self, payload)

    def health(self) -> dict[str, Any]:
        from handler.runtime import control

        return control.health(self)

    # -- the request paths ---------------------------------------------------------------------------------

    def _begin(self, request_id: str | None, trace_id: str | None) -> tuple[logs.Invocation, int, float]:
        """An invocation starts: counted, and logged in its context (request id, trace id, cold)."""
        started = time.perf_counter()
        count = self.next_invocation()
        self._tick()
        inv = logs.Invocation(request_id, trace_id, count == 1, self.manifest.key)
        logs.enter(inv)
        return inv, count, started

    def _end(self, inv: logs.Invocation, started: float) -> None:
        """An invocation ends: recorded as metrics however it ended."""
        self.metrics.invocation(inv, (time.perf_counter() - started) * 1000, "restore" in self.init_report)
        logs.enter(None)

    @contextmanager
    def _invocation(self, request_id: str | None, trace_id: str | None) -> Iterator[tuple[logs.Invocation, int]]:
        """One invocation's bracket, for both paths: `_begin` and `_end` around it; an error escaping it is
        marked fault or not."""
        inv, count, started = self._begin(request_id, trace_id)
        try:
            yield inv, count
        except Exception as e:
            if inv.error is None:
                inv.error, inv.fault = type(e).__name__, not isinstance(e, RequestError)
            raise
        finally:
            self._end(inv, started)

    def lambda_reply(self, event: Event, context: Any = None) -> bytes:
        """One Lambda invocation's answer as the JSON bytes awslambdaric posts: its marshaller passes `bytes`
        through as they are (any other value it encodes again, with simplejson: 3.97 ms for 32 x 384 floats
        against 0.25 ms here). An error is raised, as from `handle`, for awslambdaric to report. At a lean start,
        numpy's import begins once the answer is written (handler.core.numpy_gate), on a thread of its own."""
        reply = dumps(self.handle(event, context))
        if numpy_gate.lean():
            numpy_gate.load_later()
        return reply

    @staticmethod
    @contextmanager
    def lambda_deadline(context: Any) -> Iterator[None]:
        """The invocation's deadline (`handler.core.deadline`), from its context, for as long as it runs: a long
        task (generation) stops before Lambda stops it. No context (a test, a local call): no deadline."""
        deadline.set_deadline(_deadline_ms(context))
        try:
            yield
        finally:
            deadline.set_deadline(None)

    def lambda_frames(self, event: Event, context: Any = None) -> Generator[Frame, None, None]:
        """One Lambda invocation as the streaming loop posts it (`handler.runtime.streamed`): how the answer
        goes out (one buffered body, or a response stream), then the stream's chunks as they are made."""
        from handler.runtime import streamed  # deferred: a response-streaming function's path only

        return streamed.frames(self, event, context)

    def handle(self, event: Event, context: Any = None) -> JSON:
        """One Lambda invocation: served by `_handle` inside the invocation bracket (and a span when traced)."""
        request_id = getattr(context, "aws_request_id", None)
        with self._invocation(request_id, trace.lambda_trace_id()) as (inv, count), self.lambda_deadline(context):
            if self.tracer is None:
                return self._handle(event, context, count, inv)
            with trace.span(self.tracer, "warmstart.invoke", {"warmstart.model": inv.model}):
                return self._handle(event, context, count, inv)

    def _handle(self, event: Event, context: Any, count: int, inv: logs.Invocation) -> JSON:
        source = infer_source(event)
        try:
            # Deferred (the compatible APIs, the OIP): an HTTP event's modules, never loaded by a direct invoke.
            if source.http:
                from handler.api import compat, oip
            oip_route = oip.match(source.path(event)) if source.http else None  # type: ignore[attr-defined]
            if oip_route is not None:  # the Open Inference Protocol (KServe v2): its own paths, answers, errors
                numpy_gate.need()  # its tensors are numpy arrays (a lean start: imported here, not lean after)
                if oip_route[0] != "infer":  # answered without a model run, as a status request is
                    inv.kind = "status"
                    self.count("status")
                method = source.method(event)  # type: ignore[attr-defined]
                try:
                    status, body = oip.lambda_answer(self, *oip_route, method, partial(source.payload, event), inv)
                except Exception as e:  # counted and logged as any request's; answered in the protocol's shape
                    status, _ = self._failure(e, source.name)
                    body = oip.error_answer(e)[1]
                return source.respond(event, body, status)
            if source.http and source.method(event) == "GET" and source.path(event) == compat.MODELS_PATH:  # type: ignore[attr-defined]
                inv.kind = "status"
                self.count("status")  # answered without a model run, as a status request is
                return source.respond(event, self.model_list())
            payload = source.payload(event)
            # Status and admin events carry "warmstart"; only they load the status and reload modules.
            control_event = isinstance(payload, dict) and "warmstart" in payload
            if not source.http:
                if is_ping(payload):
                    inv.kind = "ping"
                    self.count("ping")
                    return self.ping(payload, context, count == 1, count)
                if control_event and _is_status(payload):
                    inv.kind = "status"
                    self.count("status")
                    return self.status(payload)
                if control_event and _admin_action(payload):
                    inv.kind = "status"
                    self.count("status")  # an admin event is a status-like request: no model run
                    remaining = context.get_remaining_time_in_millis() if context is not None else None
                    return self.reloader.admin(payload, remaining)
            elif control_event and _admin_action(payload):
                _admin_over_http()
            else:  # a Function URL or API Gateway path naming a compatible API (any other path: native)
                path = source.path(event)  # type: ignore[attr-defined]
                if path in compat.LAMBDA_PATHS:
                    numpy_gate.need()  # its answers are shaped with numpy (a lean start: imported here)
                    route = compat.ROUTES[path]
                    native = route.request(payload, self.find)
                    if wants_stream(payload) and hasattr(route, "pieces"):  # buffered: one body of events
                        answer = self.infer(native, inv, route.check, all_pieces)
                        text = compat.event_stream(route, answer["pieces"], payload, self.served_key(native))
                        return source.respond_text(event, text, EVENT_STREAM)  # type: ignore[attr-defined]
                    answer = self.infer(native, inv, route.check, route.run)
                    return source.respond(event, route.response(answer, payload))
            return source.respond(event, self.infer(payload, inv))
        except Exception as e:
            status, body = self._failure(e, source.name, log_internal=source.http)
            if not source.http:
                # A direct invoke reports the error's class name as errorType (awslambdaric logs it with its
                # stack trace): a request error is raised from here, without our frames behind it.
                if isinstance(e, RequestError):
                    raise e.with_traceback(None) from None
                raise
            return source.respond(event, body, status)

    def handle_body(self, raw: bytes, trace_id: str | None = None, request_id: str | None = None) -> tuple[int, bytes]:
        """A POSTed JSON body → (status, JSON bytes): `handle_http` on the native route."""
        status, body, _ = self.handle_http(raw, trace_id=trace_id, request_id=request_id)
        return status, body

    def handle_http(
        self,
        raw: bytes,
        route: Route | None = None,
        content: Kind = "json",
        accept: Kind = "json",
        limit: int = LAMBDA_PAYLOAD_LIMIT,
        trace_id: str | None = None,
        request_id: str | None = None,
    ) -> tuple[int, bytes, str]:
        """A POSTed body → (status, body bytes, media type): the HTTP host's path, run on a worker. The same
        task and the same error contract as an HTTP event through `handle`; a ping-shaped body is an ordinary
        request. `content`/`accept`: the negotiated media kinds (`handler.api.media`); errors are always JSON."""
        with self._invocation(request_id, trace_id) as (inv, _):
            try:
                route, payload, native = self._http_request(raw, route, content, accept, limit)
                answer = self.serve(native, route.check, route.run)
                return self._http_answer(inv, route, payload, native, answer, accept)
            except Exception as e:
                return self._http_error(e)

    def _http_request(
        self, raw: bytes, route: Route | None, content: Kind, accept: Kind, limit: int
    ) -> tuple[Route, JSON, JSON]:
        """A POSTed body → (the route that serves it, the client's payload, the native request), checked.
        `route` None: the native one."""
        from handler.api.compat import NATIVE, ROOT, model_field  # loaded by the HTTP host's routes already
        from handler.api.media import npy_request

        route = NATIVE if route is None else route
        payload = self._npy_request(raw) if content == "npy" else decode_body(raw, limit)
        if isinstance(payload, dict) and "warmstart" in payload and _admin_action(payload):
            _admin_over_http()
        if route is ROOT:  # TEI's default route: the served model's task's route
            named = model_field(payload, self.find)
            route = ROOT.pick(payload, self.task_name(named), self.served_key(named), self.registry.tasks())
        native = route.request(payload, self.find)
        if accept == "npy":
            native = npy_request(native)  # a tensor's outputs as .npy; base64 refused before the model runs
        self.count("inference")
        return route, payload, native

    def _http_answer(
        self, inv: logs.Invocation, route: Route, payload: JSON, native: JSON, answer: dict[str, Any], accept: Kind
    ) -> tuple[int, bytes, str]:
        from handler.api.media import MEDIA_TYPES

        usage(inv, native, answer)
        if accept == "npy":
            return 200, route.npy(answer, payload), MEDIA_TYPES["npy"]  # the route's answer, as one array
        return 200, dumps(route.response(answer, payload)), MEDIA_TYPES["json"]

    def handle_http_batch(self, calls: Sequence[HttpCall], batch: Batch) -> None:
        """Several POSTed bodies (`HttpCall`s the worker pool gathered), each answered through
        `batch.settle` as `handle_http` answers it, as soon as its own rows are done. Each is checked and
        tokenized on its own; those for the same model run as one batch (`handler.tasks.batch`); one
        request's error is its own; a request on a route or task that does not batch goes back to the pool
        to run as its own job (never inline, where it would hold up the others); a request whose client
        has left is skipped. Never raises."""
        if len(calls) == 1:  # no batch-mates: the single request's path, unchanged
            c = calls[0]
            if batch.gone(0):
                batch.settle(0, Abandoned())
                return
            batch.settle(0, self.handle_http(c.raw, c.route, c.content, c.accept, c.limit, c.trace_id, c.request_id))
            return
        waiting: dict[str | None, list[_Pending]] = {}  # by the model each names
        for i, call in enumerate(calls):
            if batch.gone(i):
                batch.settle(i, Abandoned())
                continue
            inv, _, started = self._begin(call.request_id, call.trace_id)
            try:
                route, payload, native = self._http_request(call.raw, call.route, call.content, call.accept, call.limit)
                pending = _Pending(i, call, inv, started, route, payload, native)
                if batchable(route):
                    waiting.setdefault(requested_model(native), []).append(pending)
                else:  # `POST /` picked a route that does not batch
                    batch.alone(i, partial(self._alone, pending))
                continue
            except Exception as e:
                answer = self._http_error(e)
            self._end(inv, started)
            batch.settle(i, answer)
        logs.enter(None)
        for model, pending_ in waiting.items():
            self._run_batch(model, pending_, batch)

    def _run_batch(self, model_key: str | None, pending: list[_Pending], batch: Batch) -> None:
        """Requests for one model: prepared one by one, run together, each answered when its group is done."""
        # Deferred: only an HTTP host batches, and the module imports numpy (a genai start never does: its spec)
        from handler.tasks.batch import run_prepared

        max_tokens = self.workers.sizing.batch_tokens if self.workers is not None else 1 << 30
        try:
            with self.registry.lease(model_key) as model:
                ready: list[tuple[_Pending, Prepared]] = []
                for p in pending:
                    logs.enter(p.inv)
                    try:
                        check_served(p.route.check, model.task.name, model.key, self.registry.tasks)
                        if not catalog.spec(model.task.name).batches:  # its own job
                            p.done = True
                            batch.alone(p.index, partial(self._alone, p))
                            continue
                        ready.append((p, cast(Any, model.task).prepare(p.native)))
                    except Exception as e:
                        self._settle(p, batch, e)
                logs.enter(None)
                if ready:
                    # A task with its own batch runner (image-text: texts and images apart) runs it.
                    own = getattr(model.task, "run_batch", None)
                    run = own or partial(run_prepared, cast("BatchModel", model.task))
                    run(
                        [prep for _, prep in ready],
                        max_tokens,
                        lambda j, outcome: self._settle(ready[j][0], batch, outcome),
                        lambda j: not batch.gone(ready[j][0].index),
                    )
        except Exception as e:  # the lease itself (an unknown model): every request it named
            for p in pending:
                self._settle(p, batch, e)
        for p in pending:  # not reported: skipped between model runs, as its client had left
            self._settle(p, batch, Abandoned() if batch.gone(p.index) else RuntimeError("the batch gave no answer"))

    def _settle(self, p: _Pending, batch: Batch, outcome: Any) -> None:
        """One batched request's answer (or error) sent to its caller now, and its invocation ended; a
        request already answered is left as it is."""
        if p.done:
            return
        p.done = True
        logs.enter(p.inv)
        if isinstance(outcome, Abandoned):
            p.inv.error, p.inv.fault = type(outcome).__name__, False
            answer: Any = outcome
        else:
            try:
                if isinstance(outcome, BaseException):
                    raise outcome
                answer = self._http_answer(p.inv, p.route, p.payload, p.native, outcome, p.call.accept)
            except Exception as e:
                answer = self._http_error(e)
        self._end(p.inv, p.started)
        batch.settle(p.index, answer)

    def _alone(self, p: _Pending) -> tuple[int, bytes, str]:
        """A batch's request that does not batch, on its own job: the rest of `handle_http`."""
        logs.enter(p.inv)
        try:
            answer = self.serve(p.native, p.route.check, p.route.run)
            return self._http_answer(p.inv, p.route, p.payload, p.native, answer, p.call.accept)
        except Exception as e:
            return self._http_error(e)
        finally:
            self._end(p.inv, p.started)

    def _http_error(self, error: Exception) -> tuple[int, bytes, str]:
        from handler.api.media import MEDIA_TYPES

        status, body = self._failure(error, "http")
        return status, dumps(body), MEDIA_TYPES["json"]

    def handle_http_stream(
        self,
        raw: bytes,
        route: Route | None = None,
        content: Kind = "json",
        accept: Kind = "json",
        limit: int = LAMBDA_PAYLOAD_LIMIT,
        trace_id: str | None = None,
        request_id: str | None = None,
    ) -> Iterator[tuple[int, bytes, str] | dict[str, Any]]:
        """The HTTP host's path when the model's task streams, run on a worker (`WorkerPool.submit_stream`).
        A request asking `"stream": true` gets the task's pieces (dicts) as they are made. Anything else (a
        request without it: the pieces collected, `handler.tasks.streaming.collect`; an error before the first
        piece) is one `(status, body, media)` item, as `handle_http` answers it. An error after the first piece
        is raised into the stream; the consumer leaving closes this generator (the task's stream with it)."""
        with self._invocation(request_id, trace_id) as (inv, _):
            try:
                route, payload, native = self._http_request(raw, route, content, accept, limit)
                if not wants_stream(payload):  # the pieces collected (`serve`): a route's run is for one value
                    answer = self.serve(native, route.check)
                    yield self._http_answer(inv, route, payload, native, answer, accept)
                    return
                from handler.api import compat
                from handler.api.media import NotAcceptableError

                if accept == "npy":
                    raise NotAcceptableError('a "stream": true answer is text/event-stream; .npy is for one answer')
                pieces = compat.chunks(route, self.serve_stream(native, route.check), payload, self.served_key(native))
                first = next(pieces, None)
            except Exception as e:
                yield self._http_error(e)
                return
            sent = 0
            try:
                if first is not None:
                    yield first
                    sent = 1
                    for piece in pieces:
                        yield piece
                        sent += 1
            except GeneratorExit:  # the client left: not a fault
                inv.error, inv.fault = Abandoned.__name__, False
                pieces.close()
                raise
            except Exception as e:
                self._failure(e, "http")  # counted and logged here: the host sends it as an SSE error event
                raise
            finally:
                inv.batch, inv.tokens = 1, sent  # a stream's metrics: its pieces

    def _npy_request(self, raw: bytes) -> JSON:
        """An `application/x-npy` body as the default tensor model's one input."""
        from handler.api.media import UnsupportedMediaTypeError

        inputs = getattr(self.task, "inputs", None)
        if not catalog.spec(self.task.name).npy_input or not isinstance(inputs, dict):
            takes = " or ".join(catalog.having(lambda spec: spec.npy_input))
            raise UnsupportedMediaTypeError(f"a {self.task.name} model reads JSON only; .npy is for {takes} models")
        if len(inputs) != 1:
            raise UnsupportedMediaTypeError(f"this model takes inputs {sorted(inputs)}: send JSON with each named")
        (name,) = inputs
        return {"inputs": {name: raw}}  # parsed by the task, header and size checked before any allocation

    def _failure(self, error: Exception, source: str, log_internal: bool = True) -> tuple[int, JSON]:
        """Count and log a failed request; the HTTP status and error body it maps to. (A direct invoke's
        internal error is logged by the runtime client when it re-raises: `log_internal=False`.)"""
        inv = logs.current()
        if inv is not None:
            inv.error, inv.fault = type(error).__name__, not isinstance(error, RequestError)
        if isinstance(error, RequestError):
            self.count("rejected")
            log.warning("rejected request from %s: %s: %s", source, type(error).__name__, error)
            return error.status, error.to_body()
        self.count("failed")
        if log_internal:
            log.error("internal error", exc_info=error)
        return 500, internal_error_body(error)


def _deadline_ms(context: Any) -> float | None:
    """The invocation's deadline (ms since the epoch) from its Lambda context: the time left read now, or none
    without a context (a test's direct call, a local host)."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if not callable(remaining):
        return None
    try:
        left = float(remaining())
    except (TypeError, ValueError):
        return None
    return time.time() * 1000 + left


@record
class HttpCall:
    """One POSTed body as the HTTP host queues it for `Runtime.handle_http_batch`."""

    raw: bytes
    route: Route | None = None  # None: the native route
    content: Kind = "json"
    accept: Kind = "json"
    limit: int = LAMBDA_PAYLOAD_LIMIT
    trace_id: str | None = None
    request_id: str | None = None


class _Pending:
    """A request of a batch between its check and its answer."""

    __slots__ = ("call", "done", "index", "inv", "native", "payload", "route", "started")

    def __init__(
        self,
        index: int,
        call: HttpCall,
        inv: logs.Invocation,
        started: float,
        route: Route,
        payload: JSON,
        native: JSON,
    ) -> None:
        self.index, self.call, self.inv, self.started = index, call, inv, started
        self.route, self.payload, self.native = route, payload, native
        self.done = False  # answered, or handed back to run alone


def batchable(route: Route) -> bool:
    """An inference route whose run is the task's own call (not `/tokenize`, not a route that checks more
    in its run): its requests may share a model run."""
    from handler.api.compat import Base

    return getattr(type(route), "run", None) is Base.run


def _admin_action(payload: JSON) -> str | None:
    # Deferred: the admin module loads when a control event arrives, as the status module does.
    from handler.models.admin import admin_action

    return admin_action(payload)


def _admin_over_http() -> None:
    from handler.models.admin import AdminNotAllowedError

    raise AdminNotAllowedError(ADMIN_OVER_HTTP)


def _is_status(payload: JSON) -> bool:
    # Deferred: the status module (tracemalloc, diagnostics) loads only when a control event arrives.
    from handler.runtime import status

    return status.is_status(payload)
