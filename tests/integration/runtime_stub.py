"""A minimal Lambda Runtime API (2018-06-01) for tests: hands out queued events, records what comes back.

Just enough of the protocol for the real `awslambdaric` to run against it; the full emulator is infra/.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PREFIX = "/2018-06-01/runtime"


@dataclass
class Outcome:
    kind: str  # "response" | "error"
    body: bytes
    content_type: str = ""  # as the runtime client posted it

    def json(self) -> Any:
        return json.loads(self.body)


class RuntimeStub:
    def __init__(self) -> None:
        self.events: queue.Queue[tuple[str, bytes, str]] = queue.Queue()
        self.outcomes: dict[str, queue.Queue[Outcome]] = {}
        self.init_errors: queue.Queue[dict[str, Any]] = queue.Queue()
        self.restore_errors: queue.Queue[dict[str, Any]] = queue.Queue()
        self.error_types: list[str] = []  # Lambda-Runtime-Function-Error-Type of init and restore errors
        self.restored = threading.Event()  # a SnapStart runtime asked /restore/next
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms delayed-ACK stall

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
                if self.path == f"{PREFIX}/restore/next":  # no snapshot here: "restored" at once
                    stub.restored.set()
                    return self._reply(200)
                if self.path != f"{PREFIX}/invocation/next":
                    return self._reply(404)
                request_id, body, content_type = stub.events.get()
                self._reply(
                    200,
                    body,
                    {
                        "Content-Type": content_type,
                        "Lambda-Runtime-Aws-Request-Id": request_id,
                        "Lambda-Runtime-Deadline-Ms": str(int(time.time() * 1000) + 60_000),
                        "Lambda-Runtime-Invoked-Function-Arn": "arn:aws:lambda:us-east-1:123456789012:function:test",
                        "Lambda-Runtime-Trace-Id": "Root=1-00000000-000000000000000000000000",
                    },
                )

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path in (f"{PREFIX}/init/error", f"{PREFIX}/restore/error"):
                    stub.error_types.append(self.headers.get("Lambda-Runtime-Function-Error-Type", ""))
                    errors = stub.init_errors if self.path.endswith("init/error") else stub.restore_errors
                    errors.put(json.loads(body))
                    return self._reply(202, b'{"status":"OK"}')
                parts = self.path[len(PREFIX) :].strip("/").split("/")  # invocation/{id}/{response|error}
                if len(parts) == 3 and parts[0] == "invocation" and parts[1] in stub.outcomes:
                    stub.outcomes[parts[1]].put(Outcome(parts[2], body, self.headers.get("Content-Type", "")))
                    return self._reply(202, b'{"status":"OK"}')
                self._reply(400, b'{"errorType":"InvalidRequestID"}')

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a runtime killed mid-long-poll resets its connection: expected, not news

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host}:{port}"

    def __enter__(self) -> RuntimeStub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def invoke(self, event: Any, timeout: float = 120.0, content_type: str = "application/json") -> Outcome:
        request_id = str(uuid.uuid4())
        self.outcomes[request_id] = queue.Queue()
        body = event if isinstance(event, bytes) else json.dumps(event).encode()
        self.events.put((request_id, body, content_type))
        return self.outcomes[request_id].get(timeout=timeout)
