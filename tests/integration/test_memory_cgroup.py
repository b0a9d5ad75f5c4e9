"""The worst request the documented limits allow, on a real `python -m handler` inside the deploy manifests'
`limits.memory: 1Gi` (issue 32 fault 4): max inputs x max chars with a prompt, as CJK text (one token a
character: the most tokens, and the largest UTF-8 body), answered 200 with the host alive and under the limit.
Before, one request of 256 x 256 tokens ran as one model run: 1,655 MB peak on the default model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from handler.core.config import Config
from infra.local.cgroups import Cgroups, InstanceCgroup
from tests.fixtures.drain_scenario import ROOT, _request, free_port

pytestmark = pytest.mark.integration

MEMORY_MB = 1024  # the deploy manifests' limits.memory: 1Gi
LIMIT = MEMORY_MB * 2**20
CPUS = 2  # the manifests' limits.cpu


@pytest.fixture
def cgroup() -> Iterator[InstanceCgroup]:
    if os.geteuid() != 0:
        pytest.skip("needs root to make a memory cgroup")
    cgroups = Cgroups.detect()
    if cgroups.mode == "none":
        pytest.skip(f"no writable memory cgroup: {cgroups.reason}")
    group = cgroups.create(f"memtest-{uuid.uuid4().hex[:8]}", MEMORY_MB)
    assert group is not None
    # The manifests give 2 CPUs beside 1Gi; Lambda's share for 1,024 MB (0.58 vCPU) would only be slower.
    if group.mode == "v2":
        (group.dirs[0] / "cpu.max").write_text(f"{CPUS * 100_000} 100000")
    else:
        (group.dirs[0] / "cpu.cfs_quota_us").write_text(str(CPUS * 100_000))
    try:
        yield group
    finally:
        group.kill()
        cgroups.release(group)
        cgroups.close()


def peak_bytes(group: InstanceCgroup) -> int:
    return int(group.read("memory.peak" if group.mode == "v2" else "memory.max_usage_in_bytes"))


def test_worst_documented_request_fits_1gib(cgroup: InstanceCgroup, model_dir: Path, tmp_path: Path) -> None:
    limits = Config(model_dir=model_dir, backend=None)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WARMSTART_", "AWS_LAMBDA_", "K_", "SAGEMAKER_"))}
    # Knative's 32 MB body limit: the manifests' host, and room for the largest UTF-8 body.
    env.update(PYTHONPATH=str(ROOT), PORT=str(port), HOST="127.0.0.1", WARMSTART_MODEL=str(model_dir))
    env.update(WARMSTART_HOST="knative", WARMSTART_WORKERS_MAX=str(CPUS))
    with (tmp_path / "stderr").open("w") as stderr:
        proc = subprocess.Popen(
            cgroup.wrap([sys.executable, "-m", "handler"]), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            try:
                if _request(port, "GET", "/ping", timeout=2).status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "no /ping"
            time.sleep(0.2)
        after_init = peak_bytes(cgroup)
        half = limits.max_chars // 2  # the prompt goes in front of every input: together within max chars
        body: dict[str, Any] = {"inputs": ["文" * half] * limits.max_inputs, "prompt": "中" * half}
        raw = json.dumps(body, ensure_ascii=False).encode()
        started = time.monotonic()
        answer = _request(port, "POST", "/invocations", raw, timeout=300)
        took = time.monotonic() - started
        assert answer.status == 200, answer.body
        vectors = answer.body["embeddings"]
        assert len(vectors) == limits.max_inputs and {len(v) for v in vectors} == {384}
        assert _request(port, "GET", "/ping", timeout=10).status == 200 and proc.poll() is None
        peak = peak_bytes(cgroup)
        assert not cgroup.oom_killed()
        assert peak < LIMIT, peak
        print(
            f"\nbody {len(raw) / 2**20:.1f} MB, {took:.1f} s; cgroup peak {after_init / 2**20:.0f} MB after init, "
            f"{peak / 2**20:.0f} MB after the request (limit {LIMIT / 2**20:.0f} MB)"
        )
    finally:
        proc.kill()
        proc.wait()
