"""The streaming loop's wire format (handler.runtime.lambda_loop, handler.api.prelude): the HTTP integration
prelude's bytes, which events get it, the chunked body and its error trailers byte for byte, the context and
the deadline an invocation gets from the Runtime API's headers, and the loop setting."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from handler.api import prelude, sse
from handler.core import deadline
from handler.core.errors import ConfigError
from handler.http_host import sse as host_sse
from handler.runtime import lambda_loop
from handler.runtime.invocation import Runtime
from tests.integration.runtime_api_fake import FakeRuntimeApi

EVENTS = Path(__file__).resolve().parents[1] / "events"


def test_the_prelude_is_json_then_eight_nul_bytes() -> None:
    got = prelude.prelude(201, {"content-type": "text/event-stream"}, ["a=b"])
    assert got == b'{"statusCode":201,"headers":{"content-type":"text/event-stream"},"cookies":["a=b"]}' + b"\0" * 8
    assert prelude.CONTENT_TYPE == "application/vnd.awslambda.http-integration-response"


def test_a_buffered_http_answer_becomes_prelude_and_body() -> None:
    answer = {"statusCode": 400, "headers": {"content-type": "application/json"}, "body": '{"e":1}'}
    head, delimiter, body = prelude.buffered(answer).partition(prelude.DELIMITER)
    assert json.loads(head) == {"statusCode": 400, "headers": {"content-type": "application/json"}, "cookies": []}
    assert (delimiter, body) == (b"\0" * 8, b'{"e":1}')
    encoded = {
        "statusCode": 200,
        "headers": {},
        "body": base64.b64encode(b"\x00\xff").decode(),
        "isBase64Encoded": True,
    }
    assert prelude.buffered(encoded).endswith(b"\0" * 8 + b"\x00\xff")


@pytest.mark.parametrize(
    ("name", "streams"),
    [
        ("function_url.json", True),  # a Function URL (RESPONSE_STREAM reads the prelude)
        ("apigw_v1.json", True),  # a REST API (a streaming integration reads it)
        ("http_api_v2.json", False),  # an HTTP API always buffers
        ("http_api_v1_named_stage.json", False),  # an HTTP API's payload 1.0
        ("alb.json", False),
        ("direct.json", False),
    ],
)
def test_which_events_get_the_prelude(name: str, streams: bool) -> None:
    assert prelude.streams(json.loads((EVENTS / name).read_text())) is streams


def test_the_host_and_the_loop_send_the_same_event_bytes() -> None:
    assert (host_sse.event, host_sse.error_event, host_sse.DONE) == (sse.event, sse.error_event, sse.DONE)
    assert sse.event({"text": "é"}) == b'data: {"text":"\xc3\xa9"}\n\n'


def _fails() -> None:
    raise ValueError("bad\nnews ✓")


def test_the_trailers_carry_the_type_and_base64_json() -> None:
    try:
        _fails()
    except ValueError as e:
        error = e
    raw = lambda_loop.trailers(error, "req-1")
    first, second, end = raw.split(b"\r\n")
    assert first == b"Lambda-Runtime-Function-Error-Type: ValueError" and end == b""
    name, _, value = second.partition(b": ")
    assert name == b"Lambda-Runtime-Function-Error-Body"
    body = json.loads(base64.b64decode(value))
    assert body["errorType"] == "ValueError" and body["errorMessage"] == "bad\nnews ✓"
    assert body["requestId"] == "req-1" and "_fails" in "".join(body["stackTrace"])


class _Capture:
    """A socket server that keeps every byte of one request (ended by the chunked body's last CRLF CRLF)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.data = b""
        self.arrivals: list[tuple[float, bytes]] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            while not (b"\r\n0\r\n" in self.data and self.data.endswith(b"\r\n\r\n")):
                got = conn.recv(65536)
                if not got:
                    return
                self.arrivals.append((time.perf_counter(), got))
                self.data += got
            conn.sendall(b'HTTP/1.1 202 Accepted\r\nContent-Length: 15\r\n\r\n{"status":"OK"}')
        self.sock.close()


def _chunks(items: list[Any], gap_s: float = 0.0) -> Iterator[bytes]:
    for item in items:
        if isinstance(item, Exception):
            raise item
        if gap_s:
            time.sleep(gap_s)
        yield item


def test_a_stream_is_chunked_with_the_streaming_headers() -> None:
    capture = _Capture()
    api = lambda_loop.RuntimeApi(capture.address)
    failure = api.post_stream("id-1", "text/event-stream", _chunks([b"data: 1\n\n", b"", b"data: 22\n\n"]))
    capture.thread.join(5)
    assert failure is None
    head, _, body = capture.data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /2018-06-01/runtime/invocation/id-1/response HTTP/1.1"
    headers = dict(line.split(b": ", 1) for line in lines[1:])
    assert headers[b"Content-Type"] == b"text/event-stream"
    assert headers[b"Lambda-Runtime-Function-Response-Mode"] == b"streaming"
    assert headers[b"Transfer-Encoding"] == b"chunked"
    assert headers[b"Trailer"] == b"Lambda-Runtime-Function-Error-Type, Lambda-Runtime-Function-Error-Body"
    assert b"Content-Length" not in headers
    # An empty piece is skipped (a zero-size chunk would end the body); no trailers when nothing failed.
    assert body == b"9\r\ndata: 1\n\n\r\nA\r\ndata: 22\n\n\r\n0\r\n\r\n"


def test_an_error_after_the_first_chunk_ends_the_body_with_trailers() -> None:
    capture = _Capture()
    api = lambda_loop.RuntimeApi(capture.address)
    closed: list[bool] = []

    def chunks() -> Iterator[bytes]:
        try:
            yield b"abc"
            raise KeyError("gone")
        finally:
            closed.append(True)

    failure = api.post_stream("id-2", "application/octet-stream", chunks())
    capture.thread.join(5)
    assert isinstance(failure, KeyError) and closed == [True]
    body = capture.data.partition(b"\r\n\r\n")[2]
    assert body.startswith(b"3\r\nabc\r\n0\r\nLambda-Runtime-Function-Error-Type: KeyError\r\n")
    assert body.endswith(b"\r\n\r\n")


def test_each_chunk_leaves_when_it_is_made() -> None:
    capture = _Capture()
    api = lambda_loop.RuntimeApi(capture.address)
    start = time.perf_counter()
    api.post_stream("id-3", "text/plain", _chunks([b"one", b"two", b"three"], gap_s=0.2))
    capture.thread.join(5)
    seen = [t - start for t, data in capture.arrivals if b"one" in data or b"two" in data or b"three" in data]
    assert len(seen) == 3 and seen[1] - seen[0] > 0.1 and seen[2] - seen[1] > 0.1  # not gathered at the end


def test_the_context_and_the_deadline_come_from_the_headers(onnx_runtime: Runtime) -> None:
    from awslambdaric import bootstrap as ric

    with FakeRuntimeApi() as fake:
        request_id = fake.send({"n": 1}, deadline_in_s=30)
        inv = lambda_loop.RuntimeApi(fake.address).next()
    assert inv.request_id == request_id and json.loads(inv.body) == {"n": 1}
    assert inv.function_arn == "arn:aws:lambda:us-east-1:123456789012:function:stream"
    assert inv.trace_id is not None and inv.trace_id.startswith("Root=1-5759e988")
    context = ric.create_lambda_context(None, None, inv.deadline_ms, inv.request_id, inv.function_arn, None)
    assert 28_000 < context.get_remaining_time_in_millis() <= 30_000
    with onnx_runtime.lambda_deadline(context):
        left = deadline.remaining_s()
        assert left is not None and 28 < left <= 30
        seen: list[float | None] = []
        other = threading.Thread(target=lambda: seen.append(deadline.remaining_s()))  # per thread
        other.start()
        other.join()
        assert seen == [None]
    assert deadline.remaining_s() is None  # cleared when the invocation ends
    with onnx_runtime.lambda_deadline(None):
        assert deadline.remaining_s() is None  # no context: no deadline


def test_the_deadline() -> None:
    deadline.set_deadline(time.time() * 1000 - 500)
    try:
        left = deadline.remaining_s()
        assert left is not None and -1 < left < 0  # past it: negative
    finally:
        deadline.set_deadline(None)
    assert deadline.remaining_s() is None and deadline.deadline_ms() is None


@pytest.mark.parametrize(
    ("env", "loop"),
    [
        ({}, "auto"),
        ({"WARMSTART_LAMBDA_LOOP": ""}, "auto"),
        ({"WARMSTART_LAMBDA_LOOP": " Streaming "}, "streaming"),
        ({"WARMSTART_LAMBDA_LOOP": "awslambdaric"}, "awslambdaric"),
        ({"AWS_LAMBDA_MAX_CONCURRENCY": "4"}, "awslambdaric"),
        ({"AWS_LAMBDA_MAX_CONCURRENCY": "4", "WARMSTART_LAMBDA_LOOP": "streaming"}, "streaming"),
    ],
)
def test_the_loop_setting(env: dict[str, str], loop: str) -> None:
    assert lambda_loop.choose(env) == loop


def test_an_unknown_loop_names_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="valid values: auto, awslambdaric, streaming"):
        lambda_loop.loop_setting({"WARMSTART_LAMBDA_LOOP": "fast"})


def test_a_kept_alive_connection_the_api_closed_is_replaced() -> None:
    """The Runtime API may close an idle kept-alive connection: `next` goes on over a new one."""
    sock = socket.create_server(("127.0.0.1", 0))
    accepted: list[int] = []

    def serve() -> None:
        for n in range(2):
            conn, _ = sock.accept()
            accepted.append(n)
            with conn:
                while b"\r\n\r\n" not in conn.recv(65536):
                    pass
                head = f"HTTP/1.1 200 OK\r\nLambda-Runtime-Aws-Request-Id: id-{n}\r\nContent-Length: 2\r\n\r\n{{}}"
                conn.sendall(head.encode())  # then closed, without saying so (no Connection: close)
        sock.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    api = lambda_loop.RuntimeApi(f"127.0.0.1:{sock.getsockname()[1]}")
    assert api.next().request_id == "id-0"
    time.sleep(0.05)  # the server has closed it by now
    assert api.next().request_id == "id-1"
    thread.join(5)
    assert accepted == [0, 1]


def test_a_broken_connection_stops_the_producer() -> None:
    sock = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = sock.accept()
        conn.recv(1024)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset
        conn.close()
        sock.close()

    threading.Thread(target=serve, daemon=True).start()
    made: list[int] = []
    closed: list[bool] = []

    def chunks() -> Iterator[bytes]:
        try:
            for i in range(10_000):
                made.append(i)
                yield b"x" * 65536
        finally:
            closed.append(True)

    api = lambda_loop.RuntimeApi(f"127.0.0.1:{sock.getsockname()[1]}")
    with pytest.raises(OSError):
        api.post_stream("id-4", "text/plain", chunks())
    assert closed == [True] and len(made) < 10_000  # stopped at the write that failed, not run to its end
