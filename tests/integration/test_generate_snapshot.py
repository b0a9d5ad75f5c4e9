"""Snapshot-safe sampling (issue 34, item 4): the `generate` task served by `handler.app.lambda_handler` from the
local Lambda in snapshot mode, every instance forked from one template that ran init (the task's warm-up
generation included). A request without a `seed` draws a fresh one from os.urandom, so no sampler state is
copied into the forks: two restored instances, and one instance asked twice, give different samples; the same
`seed` gives the same answer on either instance.

Which instance answered is read from the log tail: a restored instance's first invocation carries its
`{"warmstart": "restore"}` line (its new instance id, and the template's as `snapshot_instance_id`); a warm
ping's reply names the instance it held."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # the fixtures live under tests/, which is not an installed package
    sys.path.insert(0, ROOT)

from tests.fixtures.lm_pack import pack_tiny_lm  # noqa: E402
from tests.fixtures.local_support import alive, invoke, report, running, wait_until  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
REAL = "handler.app.lambda_handler"
SAMPLED = {"messages": [{"role": "user", "content": "tell me a story"}], "temperature": 1.0, "max_tokens": 16}
SEEDED = {**SAMPLED, "seed": 1234}
HOLD_MS = 4000  # a ping keeps the first instance busy this long, so the next invokes restore a second one


@pytest.fixture(scope="module")
def snap_lambda(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    pack = pack_tiny_lm(tmp_path_factory.mktemp("lm"), "qwen3")
    settings = {"handler": REAL, "init_type": "snap-start", "snapshot": True}
    with running(environment={"WARMSTART_MODEL": str(pack)}, **settings) as (local, client):
        yield local, client


def restore_line(log: str) -> dict[str, Any] | None:
    """The `{"warmstart": "restore"}` report line of an invocation's log tail (a restored instance's first)."""
    for line in log.splitlines():
        if line.startswith("{") and '"warmstart":"restore"' in line:
            record: dict[str, Any] = json.loads(line)
            return record
    return None


def generate(client: Any, event: dict[str, Any]) -> tuple[dict[str, Any], str]:
    result, body, log = invoke(client, event)
    assert "FunctionError" not in result, (body, log)
    assert body["finish_reason"] in ("length", "stop") and body["usage"]["completion_tokens"] >= 1, body
    return body, log


def answer(body: dict[str, Any]) -> tuple[str, int]:
    return body["text"], body["usage"]["completion_tokens"]


def test_forked_instances_draw_their_own_samples_and_a_seed_repeats(snap_lambda: tuple[Any, Any]) -> None:
    local, client = snap_lambda
    local.retire_idle()  # no instance left: the next invoke is a restore from the template

    # Instance A: restored from the snapshot, then asked twice more while it is the only instance.
    a1, log = generate(client, SAMPLED)
    fields = report(log)
    assert "Restore Duration" in fields and "Init Duration" not in fields  # restored, not initialized
    restored_a = restore_line(log)
    assert restored_a is not None and restored_a["mode"] == "fork", log
    a2, log = generate(client, SAMPLED)
    assert restore_line(log) is None and '"cold_start":false' in log  # the same (warm) instance
    a_seeded, _ = generate(client, SEEDED)
    assert len(local.pool.instances) == 1

    # The template ran init, its warm-up generation included, before any copy was forked.
    template = local.pool.templates["$LATEST"]
    init = template.instance.init_report()
    assert init is not None and init["snapshot"] == "fork" and "warmup" in init["phases_ms"], init

    # Instance B: A is held busy by a ping, so the next invokes restore a second copy of the same snapshot.
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(invoke, client, {"warmer": True, "hold_ms": HOLD_MS})
        assert wait_until(lambda: local.pool.inflight == 1)
        b1, log = generate(client, SAMPLED)
        restored_b = restore_line(log)
        assert restored_b is not None, log
        b_seeded, log = generate(client, SEEDED)
        assert restore_line(log) is None and '"cold_start":false' in log
        assert local.pool.inflight == 1 and len(local.pool.instances) == 2  # A still held: B answered both
        _, ping, _ = held.result(timeout=60)
    assert ping["instance_id"] == restored_a["instance_id"] != restored_b["instance_id"]
    assert restored_a["snapshot_instance_id"] == restored_b["snapshot_instance_id"]  # forks of one template
    pids = [i.proc.pid for i in local.pool.instances.values() if i.proc is not None]
    assert len(set(pids)) == 2 and all(alive(pid) for pid in pids)

    # (a) two instances forked from one snapshot, the same request without a seed: different samples.
    assert answer(a1) != answer(b1) and answer(a2) != answer(b1)
    # (c) one instance asked twice without a seed: different samples.
    assert answer(a1) != answer(a2)
    # (b) the same seed: the same answer on either instance.
    assert a_seeded == b_seeded
    assert generate(client, SEEDED)[0] == a_seeded  # and again, whichever instance takes it
