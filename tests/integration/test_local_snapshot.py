"""`warmstart local --snapshot`: restored copies forked from a template that ran init and the hooks once."""

from __future__ import annotations

import os
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # the fixtures live under tests/, which is not an installed package
    sys.path.insert(0, ROOT)

from tests.fixtures.local_support import alive, invoke, report, running, wait_until  # noqa: E402

pytestmark = pytest.mark.integration
SNAP = "tests.fixtures.snap_handler.lambda_handler"
TEXTS = ["hello world", "a restored copy answers like the template would"]


def snapshotting(**settings: Any) -> Any:
    settings.setdefault("handler", SNAP)
    return running(init_type="snap-start", snapshot=True, **settings)


def draws_in_parallel(client: Any, n: int, hold_ms: int = 400) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(lambda _: invoke(client, {"draws": True, "hold_ms": hold_ms}), range(n)))
    for result, _body, log in results:
        assert "FunctionError" not in result, log
    return [body for _result, body, _log in results]


def test_restored_copies_are_unique_and_answer_like_the_template(model_dir: Path) -> None:
    with snapshotting(environment={"WARMSTART_MODEL": str(model_dir)}) as (local, client):
        result, first, log = invoke(client, {"inputs": TEXTS})
        assert "FunctionError" not in result, log
        fields = report(log)
        assert "Restore Duration" in fields and "Init Duration" not in fields  # restored, not initialized
        assert "Billed Restore Duration" in fields
        bodies = draws_in_parallel(client, 3)
        ids = {b["instance_id"] for b in bodies}
        assert len(ids) == 3 and len({b["pid"] for b in bodies}) == 3
        # Each RNG was used during init (so its state is in the snapshot): only the reseed separates them.
        assert len({b["numpy"] for b in bodies}) == 3
        assert len({b["random"] for b in bodies}) == 3
        for body in bodies:
            assert body["init_type"] == "snap-start"
            assert body["restore"]["mode"] == "fork"
            assert "numpy" in body["restore"]["reseeded"]
        # Determinism: every restored copy gives the same vectors for the same input.
        answers = [invoke(client, {"inputs": TEXTS})[1]["embeddings"] for _ in range(4)]
        for answer in answers:
            assert answer == first["embeddings"]

        template = local.pool.templates["$LATEST"]
        init = template.instance.init_report()
        assert init is not None and init["snapshot"] == "fork"
        assert init["threads"] == {**init["threads"], "intra_op": 1, "bound_by": "fork-snapshot"}
        assert template.ready_info is not None
        # The main thread and ONNX Runtime's one housekeeping thread (made at import): no pool of any kind.
        assert template.ready_info["threads"] <= 2
        assert template.instance.instance_id not in {i.instance_id for i in local.pool.instances.values()}
        assert all(i.template is template for i in local.pool.instances.values())


def test_embeddings_after_restore_equal_an_on_demand_instance(model_dir: Path) -> None:
    env = {"WARMSTART_MODEL": str(model_dir)}
    with running(handler=SNAP, environment=env) as (_local, client):
        _, on_demand, _ = invoke(client, {"inputs": TEXTS})
    with snapshotting(environment=env) as (_local, client):
        _, restored, _ = invoke(client, {"inputs": TEXTS})
    a, b = np.array(on_demand["embeddings"]), np.array(restored["embeddings"])
    assert np.allclose(a, b, atol=1e-6)


def test_torch_threads_come_back_after_restore(model_dir: Path) -> None:
    env = {"WARMSTART_MODEL": str(model_dir), "WARMSTART_BACKEND": "torch", "WARMSTART_THREADS": "2"}
    with snapshotting(environment=env) as (_local, client):
        bodies = draws_in_parallel(client, 2)
        assert bodies[0]["torch"] is not None and bodies[0]["torch"] != bodies[1]["torch"]
        assert all(b["restore"]["threads"]["intra_op"] == 2 for b in bodies)  # the template ran with one
        result, body, log = invoke(client, {"inputs": TEXTS})
        assert "FunctionError" not in result, log
        assert np.array(body["embeddings"]).shape == (2, 384)


def test_failing_before_snapshot_hook_is_before_snapshot_error_exit_64(model_dir: Path) -> None:
    env = {"WARMSTART_MODEL": str(model_dir), "SNAP_FIXTURE_FAIL": "before"}
    with snapshotting(environment=env) as (local, client):
        for _ in range(2):  # a later invocation tries a fresh template, and fails the same way
            result, body, log = invoke(client, {"inputs": TEXTS})
            assert result["FunctionError"] == "Unhandled"
            assert body["errorType"] == "Runtime.BeforeSnapshotError"
            assert "HookFailedError: before-snapshot hook failed on purpose" in body["errorMessage"]
            assert "Runtime exited with error: exit status 64" in log
        assert not local.pool.instances  # no copy was ever made


def test_failing_after_restore_hook_is_after_restore_error_exit_65(model_dir: Path) -> None:
    env = {"WARMSTART_MODEL": str(model_dir), "SNAP_FIXTURE_FAIL": "after"}
    with snapshotting(environment=env) as (local, client):
        result, body, log = invoke(client, {"inputs": TEXTS})
        assert result["FunctionError"] == "Unhandled"
        assert body["errorType"] == "Runtime.AfterRestoreError"
        assert "HookFailedError: after-restore hook failed on purpose" in body["errorMessage"]
        assert "Runtime exited with error: exit status 65" in log
        assert "Restore Duration" in report(log)
        template = local.pool.templates["$LATEST"]
        assert not template.dead and alive(template.ready_info["pid"])  # the snapshot itself is fine


def test_restored_copies_survive_their_template_and_the_next_restore_makes_a_new_one(model_dir: Path) -> None:
    with snapshotting(environment={"WARMSTART_MODEL": str(model_dir)}) as (local, client):
        _, before, _ = invoke(client, {"draws": True})
        old = local.pool.templates["$LATEST"]
        assert old.ready_info is not None
        os.kill(old.ready_info["pid"], signal.SIGKILL)
        assert wait_until(lambda: old.dead)
        result, again, log = invoke(client, {"draws": True})
        assert "FunctionError" not in result, log
        assert again["pid"] == before["pid"]  # on Lambda a restored instance does not need its snapshot
        bodies = draws_in_parallel(client, 2)  # a second copy at once: restored from a new template
        assert before["pid"] in {b["pid"] for b in bodies}
        assert local.pool.templates["$LATEST"] is not old
    assert wait_until(lambda: not alive(before["pid"]))  # shutdown still ends the orphaned copy


def test_retired_copies_are_replaced_by_new_restores_not_cold_starts(model_dir: Path) -> None:
    with snapshotting(environment={"WARMSTART_MODEL": str(model_dir)}) as (local, client):
        _, first, _ = invoke(client, {"draws": True})
        assert local.retire_idle() == 1
        assert not alive(first["pid"])
        result, second, log = invoke(client, {"draws": True})
        assert "FunctionError" not in result, log
        assert second["instance_id"] != first["instance_id"]
        fields = report(log)
        assert "Restore Duration" in fields and "Init Duration" not in fields
        assert local.pool.templates["$LATEST"].forked == 2


def test_demo_with_snapshot_reports_the_template_and_a_restore(model_dir: Path) -> None:
    import subprocess

    out = subprocess.run(
        [sys.executable, "-m", "infra.cli", "demo", "--snapshot", "--warm", "2", "--model", str(model_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "Init Duration (template: spawn → snapshot)" in out.stdout
    assert "restore: a new instance forked from the snapshot" in out.stdout
    assert "init: warmup" in out.stdout  # the template's init report was found
