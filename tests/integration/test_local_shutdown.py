"""Shutdown with long-polls parked: no hang, no process left, the CLI included."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # the fixtures live under tests/, which is not an installed package
    sys.path.insert(0, ROOT)

from infra.cli.local import lambda_client  # noqa: E402
from infra.local.config import LocalLambdaConfig  # noqa: E402
from infra.local.server import LocalLambda  # noqa: E402
from tests.fixtures.local_support import alive, invoke, wait_until  # noqa: E402

pytestmark = pytest.mark.integration
CHILD = "tests.fixtures.spawns_child.handler"


def test_stop_with_parked_long_polls_leaves_no_processes() -> None:
    local = LocalLambda(LocalLambdaConfig(port=0, handler=CHILD, max_concurrency=3, init_timeout_s=60))
    local.start()
    try:
        client = lambda_client(local.endpoint, read_timeout=120)
        with ThreadPoolExecutor(3) as pool:
            bodies = [body for _, body, _ in pool.map(lambda _: invoke(client, {"sleep_ms": 1000}), range(3))]
        pids = {b["pid"] for b in bodies} | {b["child"] for b in bodies}
        assert len(pids) == 6  # three instances, each with a child in its process group
        assert wait_until(lambda: all(i.parked for i in list(local.pool.instances.values())))
        client.close()  # its pooled sockets now, not at a later test's gc
    finally:
        started = time.monotonic()
        local.stop()
    assert time.monotonic() - started < 15  # generous: it must not hang on the parked /next
    assert wait_until(lambda: not any(alive(pid) for pid in pids), timeout=10)


def test_stop_answers_an_invocation_in_flight() -> None:
    local = LocalLambda(LocalLambdaConfig(port=0, handler=CHILD, init_timeout_s=60))
    local.start()
    client = lambda_client(local.endpoint, read_timeout=120)
    outcome: dict[str, Any] = {}
    caller = threading.Thread(target=lambda: outcome.update(r=invoke(client, {"sleep_ms": 60_000})))
    caller.start()
    assert wait_until(lambda: local.pool.inflight == 1 and any(local.pool.instances))
    time.sleep(0.3)
    local.stop()
    caller.join(30)
    client.close()
    assert not caller.is_alive()
    result, _body, _ = outcome["r"]
    assert result["FunctionError"] == "Unhandled"


def test_cli_local_and_invoke_then_sigint() -> None:
    env = {**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "infra.cli", "local", "--port", "0", "--handler", CHILD]
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as server:
        try:
            assert server.stdout is not None
            first = server.stdout.readline()
            match = re.search(r"at (http://127\.0\.0\.1:\d+)", first)
            assert match, first
            endpoint = match.group(1)
            event = json.dumps({"sleep_ms": 0})
            invoked = subprocess.run(
                [sys.executable, "-m", "infra.cli", "invoke", "--endpoint-url", endpoint, event],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert invoked.returncode == 0, invoked.stderr
            body = json.loads(invoked.stdout)
            assert "REPORT RequestId:" in invoked.stderr
            assert "Init Duration" in invoked.stderr
            server.send_signal(signal.SIGINT)
            assert server.wait(30) == 0
            banner = server.stdout.read()
            # One line says what memory size means here: a cgroup mode with the quota, or why none.
            assert re.search(r"^  cgroups: (v1|v2); each instance gets 1\.16 vCPU|^  cgroups: none \(", banner, re.M)
            assert "init slots" in banner
        finally:
            if server.poll() is None:
                server.kill()
    assert wait_until(lambda: not alive(body["pid"]) and not alive(body["child"]), timeout=10)
