"""A fake Lambda Runtime API that reads what a streaming runtime sends: chunked bodies chunk by chunk, each
with the time it arrived, and the trailers after the last one. Enough of the 2018-06-01 protocol for
handler.runtime.lambda_loop (and awslambdaric) to run against it."""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PREFIX = "/2018-06-01/runtime"


@dataclass
class Posted:
    """One answer as the runtime posted it."""

    kind: str  # "response" | "error"
    headers: dict[str, str]
    body: bytes = b""
    chunks: list[tuple[float, bytes]] = field(default_factory=list)  # (perf_counter at arrival, data)
    trailers: dict[str, str] = field(default_factory=dict)
    ended: float = 0.0  # perf_counter when the whole answer had arrived

    @property
    def streamed(self) -> bool:
        return self.headers.get("lambda-runtime-function-response-mode") == "streaming"

    def json(self) -> Any:
        return json.loads(self.body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a runtime killed with its connection open: not this server's failure


class FakeRuntimeApi:
    def __init__(self) -> None:
        self.events: queue.Queue[tuple[str, bytes, dict[str, str]]] = queue.Queue()
        self.posted: dict[str, queue.Queue[Posted]] = {}
        self.init_errors: queue.Queue[tuple[dict[str, str], Any]] = queue.Queue()
        self.restore_errors: queue.Queue[tuple[dict[str, str], Any]] = queue.Queue()
        self.restored = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == f"{PREFIX}/restore/next":
                    fake.restored.set()
                    return self._reply(200)
                if self.path != f"{PREFIX}/invocation/next":
                    return self._reply(404)
                request_id, body, headers = fake.events.get()
                self._reply(200, body, {"Lambda-Runtime-Aws-Request-Id": request_id, **headers})

            def _read_chunked(self, posted: Posted) -> None:
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if size == 0:
                        break
                    data = self.rfile.read(size)
                    posted.chunks.append((time.perf_counter(), data))
                    self.rfile.readline()  # the CRLF after the data
                while (line := self.rfile.readline().rstrip(b"\r\n")) != b"":
                    name, _, value = line.decode("latin-1").partition(":")
                    posted.trailers[name.strip().lower()] = value.strip()
                posted.body = b"".join(data for _, data in posted.chunks)

            def do_POST(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                posted = Posted("error" if self.path.endswith("/error") else "response", headers)
                if headers.get("transfer-encoding", "").lower() == "chunked":
                    self._read_chunked(posted)
                else:
                    posted.body = self.rfile.read(int(headers.get("content-length") or 0))
                posted.ended = time.perf_counter()
                if self.path in (f"{PREFIX}/init/error", f"{PREFIX}/restore/error"):
                    errors = fake.init_errors if self.path.endswith("init/error") else fake.restore_errors
                    errors.put((headers, json.loads(posted.body)))
                    return self._reply(202, b'{"status":"OK"}')
                parts = self.path.split("/")  # /2018-06-01/runtime/invocation/{id}/{response|error}
                if len(parts) != 6 or parts[3] != "invocation":
                    return self._reply(404)
                fake._answers(parts[4]).put(posted)
                self._reply(202, b'{"status":"OK"}')

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _answers(self, request_id: str) -> queue.Queue[Posted]:
        return self.posted.setdefault(request_id, queue.Queue())

    def __enter__(self) -> FakeRuntimeApi:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def send(self, event: Any, deadline_in_s: float = 60, content_type: str = "application/json") -> str:
        """Queue an invocation; its request id."""
        request_id = str(uuid.uuid4())
        self._answers(request_id)
        body = event if isinstance(event, bytes) else json.dumps(event).encode()
        headers = {
            "Content-Type": content_type,
            "Lambda-Runtime-Deadline-Ms": str(int((time.time() + deadline_in_s) * 1000)),
            "Lambda-Runtime-Invoked-Function-Arn": "arn:aws:lambda:us-east-1:123456789012:function:stream",
            "Lambda-Runtime-Trace-Id": "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1",
        }
        self.events.put((request_id, body, headers))
        return request_id

    def answer(self, request_id: str, timeout: float = 60) -> Posted:
        return self._answers(request_id).get(timeout=timeout)

    def invoke(self, event: Any, timeout: float = 60) -> Posted:
        return self.answer(self.send(event), timeout)
