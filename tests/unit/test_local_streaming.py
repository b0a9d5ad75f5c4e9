"""The local Lambda's response streaming parts: the event stream encoder (held to botocore's decoder), the
chunked body reader, the bounded ResponseStream, and the Runtime API listener streaming a body with
back-pressure."""

from __future__ import annotations

import asyncio
import binascii
import json
import socket
import struct
import threading

import pytest
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer

from infra.local import eventstream, function_url
from infra.local.chunked import ChunkedDecoder, ChunkedError
from infra.local.config import LocalLambdaConfig
from infra.local.runtime_http import Response, RuntimeHTTPServer
from infra.local.stream import ResponseStream

# -- the event stream encoder ------------------------------------------------------------------------------


def decode(data: bytes) -> list[tuple[dict[str, object], bytes]]:
    buf = EventStreamBuffer()
    buf.add_data(data)
    return [(dict(m.headers), m.payload) for m in buf]


def test_payload_chunk_round_trips_through_botocore() -> None:
    payload = bytes(range(256)) * 40
    [(headers, body)] = decode(eventstream.payload_chunk(payload))
    assert headers == {
        ":event-type": "PayloadChunk",
        ":content-type": "application/octet-stream",
        ":message-type": "event",
    }
    assert body == payload


def test_invoke_complete_carries_only_what_is_set() -> None:
    [(headers, body)] = decode(eventstream.invoke_complete("StreamBoom", '{"errorMessage": "x"}', "TG9n"))
    assert headers[":event-type"] == "InvokeComplete"
    assert headers[":content-type"] == "application/json"
    assert json.loads(body) == {"ErrorCode": "StreamBoom", "ErrorDetails": '{"errorMessage": "x"}', "LogResult": "TG9n"}
    [(_, empty)] = decode(eventstream.invoke_complete())
    assert json.loads(empty) == {}


def test_messages_decode_one_after_another_and_empty_payloads() -> None:
    data = eventstream.payload_chunk(b"a") + eventstream.payload_chunk(b"") + eventstream.invoke_complete()
    events = decode(data)
    assert [h[":event-type"] for h, _ in events] == ["PayloadChunk", "PayloadChunk", "InvokeComplete"]
    assert [p for _, p in events[:2]] == [b"a", b""]


def test_prelude_and_message_crcs_are_the_wire_formats() -> None:
    msg = eventstream.payload_chunk(b"hello")
    total, headers_len, prelude_crc = struct.unpack("!III", msg[:12])
    assert total == len(msg)
    assert prelude_crc == binascii.crc32(msg[:8])
    assert struct.unpack("!I", msg[-4:])[0] == binascii.crc32(msg[:-4])
    assert msg[12 + headers_len : -4] == b"hello"
    assert msg[12] == len(":event-type") and msg[13 : 13 + 11] == b":event-type" and msg[24] == 7  # string
    corrupt = bytearray(msg)
    corrupt[-6] ^= 0xFF  # a payload byte: the message CRC no longer matches
    with pytest.raises(ChecksumMismatch):
        decode(bytes(corrupt))


def test_oversized_payload_is_refused() -> None:
    with pytest.raises(ValueError, match="over"):
        eventstream.payload_chunk(b"x" * (eventstream.MAX_PAYLOAD + 1))


# -- the chunked body reader -------------------------------------------------------------------------------

BODY = (
    b"5\r\nhello\r\n"
    b"6;ext=1\r\n world\r\n"
    b"0\r\n"
    b"Lambda-Runtime-Function-Error-Type: StreamBoom\r\n"
    b"Lambda-Runtime-Function-Error-Body: eyJ4IjogMX0=\r\n"
    b"\r\n"
    b"GET /next"
)


def test_chunked_whole_body_with_trailers_and_what_follows() -> None:
    dec = ChunkedDecoder()
    assert b"".join(dec.feed(BODY)) == b"hello world"
    assert dec.done
    assert dec.trailers == {
        "lambda-runtime-function-error-type": "StreamBoom",
        "lambda-runtime-function-error-body": "eyJ4IjogMX0=",
    }
    assert dec.rest == b"GET /next"


def test_chunked_fed_byte_by_byte_gives_data_as_it_arrives() -> None:
    dec = ChunkedDecoder()
    out = []
    for i in range(len(BODY)):
        out += dec.feed(BODY[i : i + 1])
        if i == 5:  # "5\r\nhel": the first bytes of a chunk come out before the chunk is whole
            assert b"".join(out) == b"hel"
    assert b"".join(out) == b"hello world"
    assert dec.done and dec.rest == b"GET /next"
    assert dec.trailers["lambda-runtime-function-error-type"] == "StreamBoom"


def test_chunked_without_trailers() -> None:
    dec = ChunkedDecoder()
    assert dec.feed(b"3\r\nabc\r\n0\r\n\r\n") == [b"abc"]
    assert dec.done and dec.trailers == {} and dec.rest == b""


@pytest.mark.parametrize(
    "bad",
    [b"zz\r\n", b"0x5\r\nhello\r\n", b"-1\r\n", b"3\r\nabcXY", b"1" * 5000, b"0\r\nno colon here\r\n\r\n"],
)
def test_chunked_refuses_bad_framing(bad: bytes) -> None:
    with pytest.raises(ChunkedError):
        ChunkedDecoder().feed(bad)


# -- the bounded stream ------------------------------------------------------------------------------------


def test_stream_pauses_the_writer_past_its_buffer_and_resumes_at_half() -> None:
    async def scenario() -> list[str]:
        calls: list[str] = []
        s = ResponseStream(buffer_bytes=100)
        s.pause, s.resume = (lambda: calls.append("pause")), (lambda: calls.append("resume"))
        for _ in range(4):
            s.write(b"x" * 30)  # 120 >= 100: paused once
        assert calls == ["pause"] and s.queued == 120
        reader = s.chunks()
        await reader.__anext__()  # 90 left: still paused
        await reader.__anext__()  # 60: still over half
        assert calls == ["pause"]
        await reader.__anext__()  # 30 <= 50: resumed
        s.end()
        assert [d async for d in reader] == [b"x" * 30]
        return calls

    assert asyncio.run(scenario()) == ["pause", "resume"]


def test_stream_past_its_limit_ends_with_lambdas_error_and_discard_drops_everything() -> None:
    async def scenario() -> None:
        s = ResponseStream(max_bytes=10)
        s.write(b"123456")
        s.write(b"7890AB")
        assert s.ended and s.error is not None and s.error[0] == "Function.ResponseSizeTooLarge"
        assert [d async for d in s.chunks()] == [b"123456"]
        t = ResponseStream()
        t.write(b"abc")
        t.discard()
        t.write(b"def")
        assert t.queued == 0 and t.total == 6 and bytes(t.head) == b"abcdef"

    asyncio.run(scenario())


def test_runtime_listener_streams_a_chunked_body_with_back_pressure() -> None:
    """A runtime posts 4 MB chunked while the reader takes 64 KB every few ms: the listener stops reading
    the socket past the buffer, so what waits in memory stays near the buffer, not the body."""
    total, piece = 4 * 1024 * 1024, 16 * 1024

    async def scenario() -> tuple[int, ResponseStream, dict[str, str]]:
        stream = ResponseStream(buffer_bytes=64 * 1024)
        seen: dict[str, str] = {}

        class Sink:
            def attach(self, pause, resume):  # type: ignore[no-untyped-def]
                stream.pause, stream.resume = pause, resume

            def write(self, data: bytes) -> None:
                stream.write(data)

            def close(self, trailers: dict[str, str]) -> Response:
                seen.update(trailers)
                stream.end()
                return Response(202, b"{}")

            def abort(self) -> None:
                stream.end(("aborted", ""))

        server = RuntimeHTTPServer(lambda r: Response(404))
        server.open_stream = lambda request: Sink()
        host, port = (await server.start()).split(":")

        def post() -> None:
            with socket.create_connection((host, int(port))) as sock:
                sock.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
                for _ in range(total // piece):
                    sock.sendall(f"{piece:x}\r\n".encode() + b"y" * piece + b"\r\n")
                sock.sendall(b"0\r\nX-Done: yes\r\n\r\n")
                assert sock.recv(100).startswith(b"HTTP/1.1 202")

        writer = threading.Thread(target=post)
        writer.start()
        got = 0
        async for data in stream.chunks():
            got += len(data)
            await asyncio.sleep(0.002)
        await asyncio.to_thread(writer.join, 30)
        server.close()
        return got, stream, seen

    got, stream, trailers = asyncio.run(scenario())
    assert got == total and stream.error is None
    assert trailers == {"x-done": "yes"}
    assert stream.pauses > 0
    assert stream.peak_queued < 64 * 1024 + 512 * 1024  # the buffer plus at most a few socket reads


# -- the Function URL's formats ----------------------------------------------------------------------------


def test_function_url_event_is_payload_format_2() -> None:
    ev = function_url.event(
        method="POST",
        path="/v1/chat/completions",
        query="a=1&a=2&b=",
        headers=[("Content-Type", "application/json"), ("Cookie", "s=1; t=2"), ("X-A", "1"), ("x-a", "2")],
        body=b'{"x": 1}',
        source_ip="127.0.0.1",
        request_id="rid",
        function_name="warmstart",
        region="us-east-1",
    )
    assert ev["version"] == "2.0" and ev["rawPath"] == "/v1/chat/completions" and ev["rawQueryString"] == "a=1&a=2&b="
    assert ev["queryStringParameters"] == {"a": "1,2", "b": ""}
    assert ev["cookies"] == ["s=1", "t=2"] and "cookie" not in ev["headers"] and ev["headers"]["x-a"] == "1,2"
    assert ev["body"] == '{"x": 1}' and ev["isBase64Encoded"] is False
    ctx = ev["requestContext"]
    assert ctx["http"]["method"] == "POST" and ctx["stage"] == "$default"
    assert ctx["domainName"].endswith(".lambda-url.us-east-1.on.aws")
    binary = function_url.event(
        method="PUT", path="/", query="", headers=[("content-type", "application/octet-stream")], body=b"\xff\x00",
        source_ip="::1", request_id="r", function_name="f", region="us-east-1",
    )  # fmt: skip
    assert binary["isBase64Encoded"] is True and binary["body"] == "/wA="


def test_function_url_buffered_answers_and_preludes() -> None:
    answer = {"statusCode": 201, "headers": {"x-a": "1"}, "cookies": ["c=1"], "body": "aGk=", "isBase64Encoded": True}
    assert function_url.buffered(json.dumps(answer).encode()) == (201, [("x-a", "1"), ("set-cookie", "c=1")], b"hi")
    assert function_url.buffered(b'{"plain": 1}') == (200, [("content-type", "application/json")], b'{"plain": 1}')
    prelude = json.dumps({"statusCode": 203, "headers": {"content-type": "text/plain"}}).encode() + b"\0" * 8
    assert function_url.split_prelude(prelude[:10]) is None
    assert function_url.split_prelude(prelude + b"body") == ((203, [("content-type", "text/plain")]), b"body")
    with pytest.raises(function_url.PreludeError):
        function_url.split_prelude(b"x" * (function_url.MAX_PRELUDE + 1))
    with pytest.raises(function_url.PreludeError):
        function_url.split_prelude(b"[1]" + b"\0" * 8)


# -- the instance's command --------------------------------------------------------------------------------


def test_command_replaces_awslambdaric_and_default_is_unchanged() -> None:
    default = LocalLambdaConfig(python="/py")
    assert default.argv() == ["/py", "-m", "awslambdaric", "handler.app.lambda_handler"]
    assert LocalLambdaConfig(python="/py", command=("python", "-m", "handler")).argv() == ["/py", "-m", "handler"]
    assert LocalLambdaConfig(command=("/bin/run", "x")).argv() == ["/bin/run", "x"]
    with pytest.raises(ValueError, match="invoke_mode must be one of BUFFERED, RESPONSE_STREAM"):
        LocalLambdaConfig(invoke_mode="STREAM")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="snapshot"):
        LocalLambdaConfig(command=("python", "-m", "handler"), init_type="snap-start", snapshot=True)


def test_runtime_listener_buffers_a_chunked_body_nobody_streams_and_keeps_the_connection() -> None:
    """A chunked body the opener does not take (no streaming mode) is buffered and dispatched as usual, its
    trailers with it; a body past max_body arrives as too_large; the next request on the connection follows."""

    async def scenario() -> tuple[list[tuple[bytes, bool, dict[str, str]]], bytes]:
        seen: list[tuple[bytes, bool, dict[str, str]]] = []

        def handler(request):  # type: ignore[no-untyped-def]
            seen.append((request.body, request.too_large, request.trailers))
            return Response(202, b"{}")

        server = RuntimeHTTPServer(handler, max_body=8)
        server.open_stream = lambda request: None
        host, port = (await server.start()).split(":")

        def post() -> bytes:
            with socket.create_connection((host, int(port))) as sock:
                head = b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                sock.sendall(head + b"3\r\nabc\r\n2\r\nde\r\n0\r\nX-T: 1\r\n\r\n")
                sock.sendall(head + b"9\r\n123456789\r\n0\r\n\r\n")  # over max_body
                sock.sendall(b"POST /y HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok")
                data = b""
                while data.count(b"HTTP/1.1 202") < 3:
                    data += sock.recv(4096)
                return data

        data = await asyncio.to_thread(post)
        server.close()
        return seen, data

    seen, _data = asyncio.run(scenario())
    assert seen == [(b"abcde", False, {"x-t": "1"}), (b"", True, {}), (b"ok", False, {})]
