"""What a person sees from a real `python -m handler` (issue 37 items 3, 6, 7): Ctrl-C stops it without a
traceback (exit 130), a startup failure says its sentence first (exit 3), a "listening on" line names the port
and the models, and each request gets one JSON access line (route, method, status, ms, model, request id)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def host(model: Path, **env: str) -> subprocess.Popen[str]:
    environ = {**os.environ, "PORT": str(free_port()), "HOST": "127.0.0.1", "WARMSTART_MODEL": str(model), **env}
    environ.pop("AWS_LAMBDA_RUNTIME_API", None)
    return subprocess.Popen(
        [sys.executable, "-m", "handler"],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def records(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


class Host:
    """A running host: its stdout read by a thread (a pipe read blocks), stderr read when it ends."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.lines = proc, list[str]()
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def listening(self) -> dict[str, Any]:
        """The startup record, once it is written (30 s at most)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if line.startswith("{") and json.loads(line).get("message", "").startswith("listening on "):
                    return dict(json.loads(line))
            time.sleep(0.05)
        self.proc.kill()
        raise AssertionError(f"no listening line: {''.join(self.lines)}{self.end()[1]}")

    def end(self) -> tuple[str, str]:
        """stdout and stderr, once the process has exited."""
        assert self.proc.stderr is not None
        stderr = self.proc.stderr.read()
        self.proc.wait(timeout=30)
        self.reader.join(timeout=30)
        self.proc.stderr.close()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return "".join(self.lines), stderr

    def interrupt(self) -> tuple[str, str]:
        self.proc.send_signal(signal.SIGINT)
        return self.end()


def test_ctrl_c_stops_with_a_line_not_a_traceback(model_dir: Path) -> None:
    proc = Host(host(model_dir))
    started = proc.listening()
    assert started["port"] > 0 and started["address"] == "127.0.0.1"
    assert started["models"] == ["all-minilm-l6-v2@0.1.0"] and started["host"] == "http"
    assert f"http://127.0.0.1:{started['port']}" in started["message"]
    _, stderr = proc.interrupt()
    assert proc.proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "CancelledError" not in stderr and "KeyboardInterrupt" not in stderr
    assert stderr.strip().splitlines() == ["warmstart: stopped (Ctrl-C); requests in flight were answered first"]


def test_each_request_gets_one_access_line(model_dir: Path) -> None:
    proc = Host(host(model_dir))
    try:
        started = proc.listening()
        base = f"http://127.0.0.1:{started['port']}"
        body = json.dumps({"inputs": "a secret sentence"}).encode()
        request = urllib.request.Request(
            f"{base}/invocations", body, {"content-type": "application/json", "x-request-id": "req-1"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{base}/nowhere", timeout=30)
    finally:
        stdout, _ = proc.interrupt()
    access = [r for r in records(stdout) if r.get("logger") == "warmstart.access"]
    assert [(r["method"], r["route"], r["status"]) for r in access] == [
        ("POST", "/invocations", 200),
        ("GET", "/nowhere", 404),
    ]
    first = access[0]
    assert first["level"] == "INFO" and first["request_id"] == "req-1" and first["model"] == "all-minilm-l6-v2@0.1.0"
    assert isinstance(first["ms"], float) and first["ms"] >= 0
    assert "secret" not in stdout  # bodies are never logged


def startup_failure(model: Path) -> tuple[str, str]:
    proc = host(model)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 3, stderr
    assert "Traceback" not in stdout + stderr
    return stdout, stderr


def test_no_model_says_what_is_wrong_and_the_fix_first(tmp_path: Path) -> None:
    stdout, stderr = startup_failure(tmp_path / "nowhere")
    first = stderr.splitlines()[0]
    assert first.startswith("warmstart: the HTTP host cannot start: model directory ")
    assert "does not exist" in first and "warmstart pack --default" in first
    assert any(r["message"].startswith("ModelLoadError: model directory") for r in records(stdout))


def test_an_unpacked_directory_says_so_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    _, stderr = startup_failure(tmp_path)
    assert stderr.splitlines()[0].startswith("warmstart: the HTTP host cannot start: ")


def test_a_bad_setting_says_so_without_a_traceback(model_dir: Path) -> None:
    proc = host(model_dir, PORT="0")
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 3 and "Traceback" not in stderr
    assert stderr.splitlines()[0] == "warmstart: the HTTP host cannot start: PORT=0 is outside [1, 65535]"


def test_a_model_configured_twice_says_so_without_a_traceback(model_dir: Path) -> None:
    proc = host(model_dir, WARMSTART_MODELS=str(model_dir))
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 3, stderr
    assert "Traceback" not in stdout + stderr
    assert stderr.splitlines()[0].startswith("warmstart: the HTTP host cannot start: model all-minilm-l6-v2@0.1.0 is")
