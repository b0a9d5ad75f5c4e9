"""The local Lambda's limits: memory size as a cgroup quota and limit, OOM, the Runtime API guard, bounds."""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # the fixtures live under tests/, which is not an installed package
    sys.path.insert(0, ROOT)

from infra.local.cgroups import Cgroups, vcpus_for  # noqa: E402
from infra.local.invocation import LOG_KEEP_BYTES, MAX_REQUEST_PAYLOAD  # noqa: E402
from tests.fixtures.local_support import alive, invoke, report, running, wait_until  # noqa: E402

pytestmark = pytest.mark.integration

needs_cgroups = pytest.mark.skipif(
    (probe := Cgroups.detect()).mode == "none", reason=f"no writable cgroups here: {probe.reason}"
)
probe.close()


def runtime_address(local: Any) -> tuple[str, int]:
    inst = next(iter(local.pool.instances.values()))
    return "127.0.0.1", inst.server.port


# -- memory size is real -------------------------------------------------------------------------------


@needs_cgroups
def test_each_instance_runs_under_its_memory_sizes_quota_and_limit_and_the_handler_agrees() -> None:
    with running(memory_mb=512) as (local, client):
        _, body, _ = invoke(client, {"cpu": True})
        inst = next(iter(local.pool.instances.values()))
        group = inst.cgroup
        assert group is not None and all(inst.instance_id == d.name for d in group.dirs)
        assert inst.instance_id in body["cgroup"]  # the runtime process itself is in it
        if group.mode == "v1":
            quota = int(group.read("cpu.cfs_quota_us")) / int(group.read("cpu.cfs_period_us"))
            limit = int(group.read("memory.limit_in_bytes"))
        else:
            quota_us, period_us = group.read("cpu.max").split()
            quota, limit = int(quota_us) / int(period_us), int(group.read("memory.max"))
        assert quota == pytest.approx(512 / 1769, abs=0.001)
        assert limit == 512 * 1024 * 1024
        # The handler's thread sizing reads the same quota from its own cgroup.
        assert body["detail"]["cgroup_quota"] == pytest.approx(quota)
        assert body["cpus"] == 1
        dirs = list(group.dirs)
    assert not any(d.exists() for d in dirs)
    assert not any(d.parent.exists() for d in dirs)  # the local Lambda's own directories are gone too


@needs_cgroups
def test_a_daemon_in_a_session_of_its_own_dies_with_its_instance_and_the_cgroup_goes() -> None:
    """Lambda takes the whole sandbox: a child that left the process group (start_new_session) too."""
    with running(handler="tests.fixtures.spawns_child.handler") as (local, client):
        _, first, _ = invoke(client, {"daemon": True})
        inst = next(iter(local.pool.instances.values()))
        assert inst.cgroup is not None and alive(first["daemon"])
        dirs = list(inst.cgroup.dirs)
        assert local.retire_idle() == 1  # the instance goes, the local Lambda stays
        assert wait_until(lambda: not alive(first["daemon"]) and not alive(first["child"]), timeout=10)
        assert not any(d.exists() for d in dirs)  # removed with the instance, not left for shutdown
        _, second, _ = invoke(client, {"daemon": True})
        assert alive(second["daemon"])
    assert wait_until(lambda: not alive(second["daemon"]), timeout=10)


def test_quota_is_lambdas_rule_capped_at_six_and_the_host() -> None:
    assert vcpus_for(1769, host_cpus=64) == pytest.approx(1.0)
    assert vcpus_for(10_240, host_cpus=64) == pytest.approx(10_240 / 1769) and vcpus_for(10_240, host_cpus=64) <= 6
    assert vcpus_for(3008, host_cpus=1) == 1


@needs_cgroups
def test_exceeding_the_memory_size_is_runtime_out_of_memory() -> None:
    with running(memory_mb=128) as (_local, client):
        result, body, log = invoke(client, {"alloc_mb": 400})
        assert result["FunctionError"] == "Unhandled"
        assert body["errorType"] == "Runtime.OutOfMemory"
        assert "Runtime exited with error: signal: killed" in body["errorMessage"]
        fields = report(log)
        assert fields["Max Memory Used"] == "128 MB"
        assert fields["Error Type"] == "Runtime.OutOfMemory"
        result, body, _ = invoke(client, {"alloc_mb": 8})  # a new instance takes the next one
        assert "FunctionError" not in result and body == {"allocated_mb": 8}


def test_without_cgroups_one_line_says_so(tmp_path: Path) -> None:
    (tmp_path / "cgroup").write_text("0::/\n")
    (tmp_path / "mounts").write_text("proc /proc proc rw 0 0\n")
    none = Cgroups.detect(proc_cgroup=tmp_path / "cgroup", mounts=tmp_path / "mounts")
    assert none.mode == "none" and none.create("x", 512) is None
    line = none.describe(512)
    assert line.startswith("cgroups: none (v2: no cgroup2 mount; v1: no cpu hierarchy mounted)")
    assert "only shows in REPORT" in line
    assert "killed by process group: a child in a session of its own outlives its instance" in line
    assert Cgroups.detect("off").describe(512).startswith("cgroups: none (turned off")


# -- the Runtime API answers only its own instance ---------------------------------------------------


def test_a_hostile_local_client_can_neither_take_nor_answer_invocations() -> None:
    with running() as (local, client):
        invoke(client, {})
        host, port = runtime_address(local)
        inst = next(iter(local.pool.instances.values()))
        assert wait_until(lambda: inst.parked)
        stranger = http.client.HTTPConnection(host, port, timeout=10)
        stranger.request("GET", "/2018-06-01/runtime/invocation/next")
        answer = stranger.getresponse()
        assert answer.status == 403
        assert json.loads(answer.read())["errorType"] == "AccessDeniedException"
        stranger.close()

        # While a real invocation runs, a forged answer for its request id is refused too.
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(invoke, client, {"sleep_ms": 600})
            assert wait_until(lambda: inst.current is not None)
            request_id = inst.current.request_id
            # The refusal comes at connect time: the body may meet a closed socket instead of a 403.
            forger = http.client.HTTPConnection(host, port, timeout=10)
            try:
                forger.request("POST", f"/2018-06-01/runtime/invocation/{request_id}/response", b'{"forged": true}')
                assert forger.getresponse().status == 403
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                forger.close()
            result, body, _ = pending.result()
        assert "FunctionError" not in result and body["event"] == {"sleep_ms": 600}
        assert body["pid"] == inst.proc.pid and inst.server.refused == 2


def test_the_instances_own_child_processes_may_use_its_runtime_api() -> None:
    """The guard's unit is the instance's session (its sandbox), as on Lambda where anything in the sandbox
    reaches the Runtime API: a child gets the route's own answer (404 here), not the stranger's 403."""
    with running() as (local, client):
        result, body, log = invoke(client, {"child_probe": True})
        assert "FunctionError" not in result, log
        assert body == {"child_status": 404}
        assert next(iter(local.pool.instances.values())).server.refused == 0


# -- bounds ----------------------------------------------------------------------------------------------


def test_event_queue_is_bounded_and_answers_429_when_full() -> None:
    with running(max_concurrency=1, max_queued_events=2) as (local, client):
        event = json.dumps({"sleep_ms": 1500})
        codes = [client.invoke(FunctionName="warmstart", InvocationType="Event", Payload=event)["StatusCode"]]
        codes.append(client.invoke(FunctionName="warmstart", InvocationType="Event", Payload=event)["StatusCode"])
        with pytest.raises(client.exceptions.TooManyRequestsException) as caught:
            client.invoke(FunctionName="warmstart", InvocationType="Event", Payload=event)
        assert codes == [202, 202]
        assert caught.value.response["Reason"] == "EventQueueFull"
        assert wait_until(lambda: local.queued_events == 0, timeout=30)
        assert client.invoke(FunctionName="warmstart", InvocationType="Event", Payload="{}")["StatusCode"] == 202


def test_history_is_bounded_in_bytes_and_logs_keep_their_tail() -> None:
    with running(history_bytes=200_000) as (local, client):
        for _ in range(6):
            _result, _, log = invoke(client, {"print": "y" * 300_000})
            assert log.rstrip().splitlines()[-1].startswith("REPORT ")  # the 4 KB tail is still the tail
        assert all(len(inv.log) <= LOG_KEEP_BYTES for inv in local.history)
        assert sum(inv.history_size() for inv in local.history) <= 200_000
        assert b"the local Lambda dropped log output here" in local.history[-1].log


def raw_post(endpoint: str, head: str, body_parts: list[bytes]) -> tuple[int, bytes]:
    """Send a request head and as much of the body as the server takes; its status line and body."""
    host, port = endpoint.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(head.encode())
        try:
            for part in body_parts:
                sock.sendall(part)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused mid-stream: what it answered is still there to read
        data = b""
        while True:  # the head, then the body as long as its Content-Length says
            head, sep, body = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            if sep and length and len(body) >= int(length.group(1)):
                break
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.partition(b"\r\n\r\n")[2]


def test_request_bodies_are_refused_on_content_length_and_while_streaming() -> None:
    path = "/2015-03-31/functions/warmstart/invocations"
    with running() as (local, _client):
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {300 * 1024 * 1024}\r\n\r\n"
        status, body = raw_post(local.endpoint, head, [b"{" + b" " * 1024])  # nothing near 300 MB is sent
        assert status == 413 and b"Request must be smaller than" in body
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        chunk = b" " * (1024 * 1024)
        parts = [b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(MAX_REQUEST_PAYLOAD // len(chunk) + 4)]
        status, body = raw_post(local.endpoint, head, [*parts, b"0\r\n\r\n"])
        assert status == 413


def test_simultaneous_cold_starts_wait_for_an_init_slot_and_all_succeed() -> None:
    env = {"FIXTURE_INIT_CPU_S": "0.3"}
    handler = "tests.fixtures.cpu_init.handler"
    with running(handler=handler, environment=env, max_concurrency=6, init_slots=2, init_timeout_s=10.0) as (
        local,
        client,
    ):
        started = time.perf_counter()
        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(lambda _: invoke(client, {}), range(6)))
        elapsed_ms = (time.perf_counter() - started) * 1000
        for result, _body, log in results:
            assert "FunctionError" not in result, log
        assert len({body["pid"] for _r, body, _l in results}) == 6
        assert local.pool.slots.peak == 2
        # Three waves of two: each init's clock started with its slot, so none counts the waves before it.
        inits = [float(report(log)["Init Duration"].split()[0]) for _r, _b, log in results]
        assert max(inits) < 0.75 * elapsed_ms, (inits, elapsed_ms)


def test_cold_starts_whose_init_sleeps_do_not_wait_for_each_others_slot_and_all_time_out_at_once() -> None:
    """Slots ration CPU, not wall time: an init that sleeps (or blocks) lets the next one start. On Lambda
    each sandbox inits on its own, so six inits that outlast the init timeout all fail at about T."""
    timeout_s = 8.0
    env = {"FIXTURE_INIT_SLEEP_S": "120"}
    settings = {"init_slots": 1, "init_timeout_s": timeout_s, "max_concurrency": 6, "environment": env}
    with running(handler="tests.fixtures.slow_init.handler", **settings) as (_local, client):  # type: ignore[arg-type]

        def timed(_: int) -> tuple[float, Any]:
            started = time.perf_counter()
            result, body, _log = invoke(client, {})
            return time.perf_counter() - started, (result, body)

        with ThreadPoolExecutor(6) as pool:
            outcomes = list(pool.map(timed, range(6)))
    for _elapsed, (result, body) in outcomes:
        assert result["FunctionError"] == "Unhandled"
        assert body["errorType"] == "Sandbox.Timedout" and "Init phase timed out" in body["errorMessage"]
    elapsed = sorted(e for e, _ in outcomes)
    # Serialized, they would fail at T, 2T, ... 6T; rationed, only each one's start-up CPU staggers them.
    assert elapsed[-1] < 1.75 * timeout_s, elapsed  # the second alone would fail at 2T
    assert elapsed[-1] - elapsed[0] < 0.6 * timeout_s, elapsed


def test_client_context_is_passed_as_one_json_header_line() -> None:
    with running() as (_local, client):
        custom = {"a": "x\r\nLambda-Runtime-Aws-Request-Id: forged\r\n\r\n{}"}
        context = base64.b64encode(json.dumps({"custom": custom}).encode()).decode()
        result, body, _ = invoke(client, {}, ClientContext=context)
        assert "FunctionError" not in result
        assert body["client_context"] == custom
        for bad in ("not base64!", base64.b64encode(b"not json").decode(), base64.b64encode(b"[1]").decode()):
            with pytest.raises(client.exceptions.InvalidParameterValueException):
                invoke(client, {}, ClientContext=bad)
