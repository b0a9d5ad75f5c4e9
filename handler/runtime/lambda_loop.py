"""Lambda's Runtime API loop, spoken by the shim itself, so a streaming task's answer can be a response stream.

awslambdaric 4.2.2 cannot stream: it posts the handler's return value as one buffered body (and raises when a
post fails, so a handler cannot post a response itself and return). For a function whose model's task streams,
`python -m handler` runs this loop instead (`handler.__main__`, `WARMSTART_LAMBDA_LOOP`); awslambdaric stays the
loop for everything else. When awslambdaric ships Python response streaming, follow it: the choice is one line
in `choose`.

What is awslambdaric's and stays so: the init (its handler import and init-error types, its logging setup and
log sink, its SnapStart hooks runner with the same exit codes), the invocation's context object, the error
bodies (`{"errorMessage", "errorType", "requestId", "stackTrace"}`) and their log lines. What is ours: the
transport (stdlib `http.client`; cold start is the product, nothing new is installed), and the streamed
response (`handler.runtime.streamed` says what is sent):

    POST /2018-06-01/runtime/invocation/{id}/response
    Content-Type: <text/event-stream | application/vnd.awslambda.http-integration-response>
    Lambda-Runtime-Function-Response-Mode: streaming
    Transfer-Encoding: chunked
    Trailer: Lambda-Runtime-Function-Error-Type, Lambda-Runtime-Function-Error-Body

each piece one chunk, written as it is made, then the last chunk `0\\r\\n` with, when the answer failed after its
first byte, the trailers `Lambda-Runtime-Function-Error-Type: <class name>` and
`Lambda-Runtime-Function-Error-Body: <base64 of the error JSON>` (AWS's custom-runtime guide, "Implementing
response streaming"; the Node.js runtime client's ResponseStream does the same).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import sys
import traceback
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from handler.core.errors import ConfigError

if TYPE_CHECKING:  # imported when serving: `python -m handler` reads the setting before init's prefetch starts
    import http.client

    from handler.runtime.streamed import Frame

PREFIX = "/2018-06-01/runtime"
RESPONSE_MODE = "Lambda-Runtime-Function-Response-Mode"
ERROR_TYPE = "Lambda-Runtime-Function-Error-Type"
ERROR_BODY = "Lambda-Runtime-Function-Error-Body"
XRAY_CAUSE = "Lambda-Runtime-Function-XRay-Error-Cause"
_XRAY_LIMIT = 1024 * 1024  # awslambdaric drops a larger X-Ray cause rather than send a huge header

Loop = Literal["auto", "awslambdaric", "streaming"]
LOOPS: tuple[Loop, ...] = ("auto", "awslambdaric", "streaming")


def loop_setting(environ: Mapping[str, str] | None = None) -> Loop:
    """`WARMSTART_LAMBDA_LOOP`: auto (default: the streaming loop when the served model's task streams),
    awslambdaric, or streaming."""
    env = os.environ if environ is None else environ
    raw = (env.get("WARMSTART_LAMBDA_LOOP") or "auto").strip().lower()
    for loop in LOOPS:
        if raw == loop:
            return loop
    raise ConfigError(f"WARMSTART_LAMBDA_LOOP={raw!r}; valid values: {', '.join(LOOPS)}")


def choose(environ: Mapping[str, str] | None = None) -> Loop:
    """Which loop `python -m handler` runs. awslambdaric alone runs Lambda Managed Instances' concurrent workers
    (`AWS_LAMBDA_MAX_CONCURRENCY`), so auto leaves those to it. When awslambdaric streams, this is the line
    to change: auto → awslambdaric."""
    env = os.environ if environ is None else environ
    loop = loop_setting(env)
    if loop == "auto" and env.get("AWS_LAMBDA_MAX_CONCURRENCY"):
        return "awslambdaric"
    return loop


class RuntimeApiError(RuntimeError):
    """A Runtime API call answered other than expected: the instance cannot go on (awslambdaric exits too)."""

    def __init__(self, path: str, status: int, body: bytes) -> None:
        super().__init__(f"Runtime API {path} answered {status}: {body[:200]!r}")
        self.status = status


@dataclass(frozen=True)
class Invocation:
    """`GET /invocation/next`: the event and the headers the context is made of."""

    request_id: str
    body: bytes
    content_type: str | None = None
    deadline_ms: int = 0
    function_arn: str | None = None
    trace_id: str | None = None
    client_context: str | None = None
    cognito_identity: str | None = None
    tenant_id: str | None = None


class RuntimeApi:
    """The Runtime API over one kept-alive connection (`next`, buffered answers, errors); a response stream on a
    connection of its own, closed once the stream is written (the custom-runtime guide asks for that)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        # Deferred: http.client imports ssl (~15 ms cold), which init never needs; awslambdaric defers it too.
        import http.client

        conn = http.client.HTTPConnection(self.address)
        conn.connect()
        # Small writes go out at once: a chunk or a headers-then-body pair never waits on a delayed ACK (~40 ms).
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _call(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> tuple[http.client.HTTPResponse, bytes]:
        for attempt in (0, 1):
            reused = self._conn is not None
            conn = self._conn or self._connect()
            self._conn = conn
            sent = False
            try:
                conn.request(method, PREFIX + path, body, dict(headers or {}))
                sent = True
                response = conn.getresponse()
                data = response.read()
            except (OSError, _http_exception()):
                self.close()
                # A kept-alive connection the other side had closed: once more on a new one, when that cannot
                # post an answer twice (a GET, or a request that never went out).
                if reused and attempt == 0 and (method == "GET" or not sent):
                    continue
                raise
            if response.will_close:
                self.close()
            if not 200 <= response.status < 300:
                raise RuntimeApiError(path, response.status, data)
            return response, data
        raise AssertionError("unreachable")

    def next(self) -> Invocation:
        response, body = self._call("GET", "/invocation/next")
        h = response.headers
        request_id = h.get("Lambda-Runtime-Aws-Request-Id")
        if not request_id:
            raise RuntimeApiError("/invocation/next", response.status, b"no Lambda-Runtime-Aws-Request-Id")
        return Invocation(
            request_id=request_id,
            body=body,
            content_type=h.get("Content-Type"),
            deadline_ms=int(h.get("Lambda-Runtime-Deadline-Ms") or 0),  # absent: 0 ms left, as awslambdaric reads it
            function_arn=h.get("Lambda-Runtime-Invoked-Function-Arn"),
            trace_id=h.get("Lambda-Runtime-Trace-Id"),
            client_context=h.get("Lambda-Runtime-Client-Context"),
            cognito_identity=h.get("Lambda-Runtime-Cognito-Identity"),
            tenant_id=h.get("Lambda-Runtime-Aws-Tenant-Id"),
        )

    def post_response(self, request_id: str, body: bytes, content_type: str) -> None:
        self._call("POST", f"/invocation/{request_id}/response", body, {"Content-Type": content_type})

    def post_error(self, request_id: str, error: Mapping[str, Any], xray: str | None = None) -> None:
        headers = {"Content-Type": "application/json", ERROR_TYPE: str(error.get("errorType") or "")}
        if xray and len(xray) < _XRAY_LIMIT:
            headers[XRAY_CAUSE] = xray
        self._call("POST", f"/invocation/{request_id}/error", _json(error), headers)

    def post_stream(self, request_id: str, content_type: str, chunks: Iterator[bytes]) -> BaseException | None:
        """Each chunk written as it comes; the error `chunks` raised after its first (sent as the trailers) is
        returned, for the log. A write that fails (the connection broke) closes `chunks` and raises."""
        conn = self._connect()
        failure: BaseException | None = None
        try:
            conn.putrequest("POST", f"{PREFIX}/invocation/{request_id}/response", skip_accept_encoding=True)
            for name, value in (
                ("Content-Type", content_type),
                (RESPONSE_MODE, "streaming"),
                ("Transfer-Encoding", "chunked"),
                ("Trailer", f"{ERROR_TYPE}, {ERROR_BODY}"),
            ):
                conn.putheader(name, value)
            conn.endheaders()
            while True:
                try:
                    chunk = next(chunks)
                except StopIteration:
                    break
                except Exception as e:
                    failure = e
                    break
                if chunk:  # an empty chunk would be the end of the body
                    conn.send(b"%X\r\n%s\r\n" % (len(chunk), chunk))
            conn.send(b"0\r\n" + (trailers(failure, request_id) if failure is not None else b"") + b"\r\n")
            response = conn.getresponse()
            data = response.read()
            if not 200 <= response.status < 300:
                raise RuntimeApiError(f"/invocation/{request_id}/response", response.status, data)
        finally:
            close = getattr(chunks, "close", None)
            if callable(close):
                close()  # a stream cut short (a failed write) stops its producer
            conn.close()
        return failure

    # -- init and SnapStart: the methods `awslambdaric.bootstrap.on_init_complete` calls, on the same wire -------

    def post_init_error(self, error: Mapping[str, Any], error_type_override: str | None = None) -> None:
        headers = {"Content-Type": "application/json", ERROR_TYPE: error_type_override or str(error["errorType"])}
        self._call("POST", "/init/error", _json(error), headers)

    def restore_next(self) -> None:
        self._call("GET", "/restore/next")

    def report_restore_error(self, error: Mapping[str, Any]) -> None:
        from awslambdaric.lambda_runtime_exception import FaultException

        headers = {"Content-Type": "application/json", ERROR_TYPE: FaultException.AFTER_RESTORE_ERROR}
        self._call("POST", "/restore/error", _json(error), headers)


def _http_exception() -> type[Exception]:
    import http.client  # loaded by `_connect` already

    return http.client.HTTPException


def _json(value: Any) -> bytes:
    return json.dumps(value, default=str).encode()


def error_body(error: BaseException, request_id: str | None = None) -> dict[str, Any]:
    """awslambdaric's error object for an exception (`bootstrap.make_error`), the loop's own frames left out of
    its stack trace as awslambdaric leaves out bootstrap.py's."""
    frames = traceback.extract_tb(error.__traceback__)
    here = __file__.removesuffix("c")
    while frames and frames[0].filename == here:
        del frames[0]
    return {
        "errorMessage": str(error),
        "errorType": type(error).__name__,
        "requestId": request_id or "",
        "stackTrace": traceback.format_list(frames),
    }


def trailers(error: BaseException, request_id: str | None = None) -> bytes:
    """The error trailers that end a failed stream: its type, and its body as base64 JSON (a header value
    cannot hold the body's newlines or non-ASCII text)."""
    body = base64.b64encode(_json(error_body(error, request_id))).decode("ascii")
    return f"{ERROR_TYPE}: {type(error).__name__}\r\n{ERROR_BODY}: {body}\r\n".encode("ascii")


# -- the loop ------------------------------------------------------------------------------------------------

Serve = Callable[[Any, Any], Generator["Frame", None, None]]


def serve_function(function: Callable[[Any, Any], Any]) -> Serve:
    """Any `MODULE.FUNCTION` handler in the loop: its return value, one buffered answer marshalled as
    awslambdaric marshals it (bytes as they are, anything else JSON)."""
    from awslambdaric.lambda_runtime_marshaller import LambdaMarshaller  # deferred: simplejson, on Lambda only

    from handler.runtime.streamed import Buffered

    marshaller = LambdaMarshaller()

    def serve(event: Any, context: Any) -> Generator[Frame, None, None]:
        body, content_type = marshaller.marshal_response(function(event, context))
        yield Buffered(body if isinstance(body, bytes) else body.encode("utf-8"), content_type)

    return serve


def invoke(api: RuntimeApi, inv: Invocation, serve: Serve, log_sink: Any) -> None:
    """One invocation, start to end. Never raises but for the Runtime API's own failures (which end the
    instance, as in awslambdaric): the function's errors are posted (`/error` before the first byte, the
    trailers after it) and logged as awslambdaric logs them."""
    from awslambdaric import bootstrap as ric  # loaded by `run` already
    from awslambdaric.lambda_runtime_exception import FaultException

    from handler.runtime.streamed import Buffered

    ric._GLOBAL_AWS_REQUEST_ID = inv.request_id  # the request id of its root-logger lines
    ric._GLOBAL_TENANT_ID = inv.tenant_id
    ric.update_xray_env_variable(inv.trace_id)  # `_X_AMZN_TRACE_ID`, which handler.observability.trace reads
    try:
        context = ric.create_lambda_context(
            inv.client_context,
            inv.cognito_identity,
            inv.deadline_ms,
            inv.request_id,
            inv.function_arn,
            inv.tenant_id,
        )
        event = ric.LambdaRuntimeClient.marshaller.unmarshal_request(inv.body, inv.content_type)
        frames = serve(event, context)
        head = next(frames)
    except FaultException as e:
        _post_error(api, inv, ric.make_error(e.msg, e.exception_type, e.trace, inv.request_id), None, log_sink)
        return
    except Exception as e:
        tb = [(f.filename, f.lineno, f.name, f.line) for f in traceback.extract_tb(e.__traceback__)]
        xray = ric.make_xray_fault(type(e).__name__, str(e), os.getcwd(), tb)
        _post_error(api, inv, error_body(e, inv.request_id), ric.to_json(xray), log_sink)
        return
    if isinstance(head, Buffered):
        try:
            api.post_response(inv.request_id, head.body, head.content_type)
        finally:
            frames.close()  # the invocation's bracket ends: its metrics are written
        return
    if isinstance(head, bytes):  # a stream must say its content type first
        raise TypeError("an invocation's first frame is Buffered or Streamed, not bytes")
    failure = api.post_stream(inv.request_id, head.content_type, frames)  # type: ignore[arg-type]
    if failure is not None:
        ric.log_error(error_body(failure, inv.request_id), log_sink)


def _post_error(api: RuntimeApi, inv: Invocation, error: dict[str, Any], xray: str | None, log_sink: Any) -> None:
    from awslambdaric import bootstrap as ric

    ric.log_error(error, log_sink)
    api.post_error(inv.request_id, error, xray)


def streaming_serve(handler: str, function: Callable[[Any, Any], Any]) -> tuple[Serve, bool]:
    """How the loop serves the handler's module: a warmstart runtime there (`handler.app.runtime`) answers
    through its frames (`Runtime.lambda_frames`); anything else through the function. True when that runtime's
    default model's task streams."""
    from handler.tasks.streaming import streams

    module = sys.modules.get(handler.rsplit(".", 1)[0])
    runtime = getattr(module, "runtime", None)
    lambda_frames = getattr(runtime, "lambda_frames", None)
    if not callable(lambda_frames):
        return serve_function(function), False
    return lambda_frames, streams(getattr(runtime, "task", None))


def run(handler: str, loop: Loop = "streaming", environ: Mapping[str, str] | None = None) -> NoReturn:
    """The process's life as awslambdaric's `bootstrap.run` lives it: init (the handler's module imported:
    warmstart's init phase), SnapStart's hooks when snapshotting, then invocations for ever. `loop="auto"`:
    when the runtime's model does not stream, awslambdaric's own loop serves the invocations."""
    env = os.environ if environ is None else environ
    # Deferred: awslambdaric's C client reads AWS_LAMBDA_RUNTIME_API when imported; only Lambda mode gets here.
    from awslambdaric import bootstrap as ric
    from awslambdaric.lambda_runtime_exception import FaultException

    address = env["AWS_LAMBDA_RUNTIME_API"]
    api = RuntimeApi(address)
    sys.stdout = ric.Unbuffered(sys.stdout)
    sys.stderr = ric.Unbuffered(sys.stderr)
    with ric.create_log_sink() as log_sink:
        error = None
        try:
            ric._setup_logging(ric._AWS_LAMBDA_LOG_FORMAT, ric._AWS_LAMBDA_LOG_LEVEL, log_sink)
            ric._log_preview_runtime_warning()
            function = ric._get_handler(handler)
            serve, streams = streaming_serve(handler, function)
        except FaultException as e:
            error = ric.make_error(e.msg, e.exception_type, e.trace)
        except Exception:
            error = ric.build_fault_result(sys.exc_info(), None)
        if error is not None:
            from awslambdaric.lambda_literals import lambda_unhandled_exception_warning_message

            logging.warning(lambda_unhandled_exception_warning_message)
            ric.log_error(error, log_sink)
            api.post_init_error(error)
            sys.exit(1)
        if env.get(ric.AWS_LAMBDA_INITIALIZATION_TYPE) == ric.INIT_TYPE_SNAP_START:
            # The same runner, hooks order and exit codes (64, 65) as awslambdaric, on this loop's wire.
            ric.on_init_complete(api, log_sink)
        if loop == "auto" and not streams:
            api.close()
            _awslambdaric_loop(address, function, log_sink)
        while True:
            invoke(api, api.next(), serve, log_sink)


def _awslambdaric_loop(address: str, function: Callable[[Any, Any], Any], log_sink: Any) -> NoReturn:
    """awslambdaric's invoke loop (`bootstrap.run`'s last lines), after the shared init: its C client, its
    `handle_event_request`, unchanged."""
    from awslambdaric import bootstrap as ric
    from awslambdaric.lambda_config import LambdaConfigProvider

    # /next polled on a thread where awslambdaric polls it so (3.12+ managed runtimes: signals stay handled).
    config = LambdaConfigProvider
    threaded = os.environ.get(config.AWS_EXECUTION_ENV) in config.SUPPORTED_THREADPOLLING_ENVS
    client = ric.LambdaRuntimeClient(address, threaded)
    while True:
        request = client.wait_next_invocation()
        ric._GLOBAL_AWS_REQUEST_ID = request.invoke_id
        ric._GLOBAL_TENANT_ID = request.tenant_id
        ric.update_xray_env_variable(request.x_amzn_trace_id)
        ric.handle_event_request(
            client,
            function,
            request.invoke_id,
            request.event_body,
            request.content_type,
            request.client_context,
            request.cognito_identity,
            request.invoked_function_arn,
            request.deadline_time_in_ms,
            request.tenant_id,
            log_sink,
            request.invocation_id,
        )
