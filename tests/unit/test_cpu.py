"""cpu_budget: the CPUs this process may really use, from affinity, cgroup quota and Lambda's memory rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from handler.core.cpu import cpu_budget


@pytest.fixture
def affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend the process may run on 8 cores, whatever this machine has."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)


@pytest.fixture
def cgroup(tmp_path: Path) -> Path:
    return tmp_path / "cgroup"


def v2(root: Path, text: str) -> Path:
    root.mkdir(exist_ok=True)
    (root / "cpu.max").write_text(text + "\n")
    return root


def v1(root: Path, quota: int, period: int = 100_000) -> Path:
    (root / "cpu").mkdir(parents=True)
    (root / "cpu" / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (root / "cpu" / "cpu.cfs_period_us").write_text(f"{period}\n")
    return root


@pytest.mark.usefixtures("affinity")
def test_no_cgroup_no_lambda_is_affinity(cgroup: Path) -> None:
    budget = cpu_budget({}, cgroup)
    assert (budget.cpus, budget.source) == (8, "affinity")
    assert budget.detail == {"affinity": 8, "cgroup_quota": None, "lambda_vcpus": None}


@pytest.mark.usefixtures("affinity")
def test_v2_unlimited(cgroup: Path) -> None:
    budget = cpu_budget({}, v2(cgroup, "max 100000"))
    assert (budget.cpus, budget.source, budget.detail["cgroup_quota"]) == (8, "affinity", None)


@pytest.mark.usefixtures("affinity")
@pytest.mark.parametrize(("text", "cpus"), [("150000 100000", 1), ("400000 100000", 4), ("50000 100000", 1)])
def test_v2_quota_rounds_down_with_a_floor_of_one(cgroup: Path, text: str, cpus: int) -> None:
    budget = cpu_budget({}, v2(cgroup, text))
    assert (budget.cpus, budget.source) == (cpus, "cgroup-v2")


@pytest.mark.usefixtures("affinity")
def test_v1_quota(cgroup: Path) -> None:
    budget = cpu_budget({}, v1(cgroup, 300_000))
    assert (budget.cpus, budget.source, budget.detail["cgroup_quota"]) == (3, "cgroup-v1", 3.0)


@pytest.mark.usefixtures("affinity")
def test_v1_unlimited_quota(cgroup: Path) -> None:
    assert cpu_budget({}, v1(cgroup, -1)).source == "affinity"


@pytest.mark.usefixtures("affinity")
def test_garbled_v2_falls_back_to_v1(cgroup: Path) -> None:
    v1(cgroup, 200_000)
    budget = cpu_budget({}, v2(cgroup, "garbage"))
    assert (budget.cpus, budget.source) == (2, "cgroup-v1")


@pytest.mark.usefixtures("affinity")
@pytest.mark.parametrize(("memory", "cpus"), [("3538", 2), ("1769", 1), ("10240", 5), ("128", 1)])
def test_lambda_memory_rule(cgroup: Path, memory: str, cpus: int) -> None:
    budget = cpu_budget({"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": memory}, cgroup)
    assert (budget.cpus, budget.source) == (cpus, "lambda-memory")


def test_affinity_bounds_lambda_memory(cgroup: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    budget = cpu_budget({"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "10240"}, cgroup)
    assert (budget.cpus, budget.source) == (1, "affinity")


@pytest.mark.usefixtures("affinity")
def test_tightest_bound_wins(cgroup: Path) -> None:
    budget = cpu_budget({"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "10240"}, v2(cgroup, "300000 100000"))
    assert (budget.cpus, budget.source) == (3, "cgroup-v2")


@pytest.mark.usefixtures("affinity")
def test_non_numeric_memory_is_ignored(cgroup: Path) -> None:
    assert cpu_budget({"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "lots"}, cgroup).source == "affinity"


@pytest.mark.usefixtures("affinity")
def test_v1_quota_of_the_process_own_cgroup_wins_over_the_root(cgroup: Path, tmp_path: Path) -> None:
    """The local Lambda puts each instance in its own cgroup, outside any cgroup namespace."""
    v1(cgroup, -1)
    own = cgroup / "cpu" / "warmstart-1-1" / "abc"
    own.mkdir(parents=True)
    (own / "cpu.cfs_quota_us").write_text("28942\n")
    (own / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text("4:memory:/elsewhere\n1:cpu:/warmstart-1-1/abc\n0::/\n")
    budget = cpu_budget({"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512"}, cgroup, proc)
    assert budget.detail["cgroup_quota"] == pytest.approx(0.28942)
    assert (budget.cpus, budget.source) == (1, "cgroup-v1")


def test_thread_plan_shares_the_cpus_between_runs_and_spins_only_with_a_cpu_each() -> None:
    from handler.core.cpu import plan_threads

    one = plan_threads(cpus=2, runs=1)
    assert (one.threads, one.spin) == (2, True)  # a lone run: every CPU, spinning (each thread has one)
    shared = plan_threads(cpus=2, runs=2)
    assert (shared.threads, shared.spin) == (1, False)  # the HTTP host's 2 workers: a thread each
    assert plan_threads(cpus=8, runs=2).describe() == {
        "intra_op": 4,
        "runs": 2,
        "spin": True,
        "why": "8 CPUs / 2 runs at once",
    }
    over = plan_threads(cpus=2, runs=2, threads=2)  # WARMSTART_THREADS=2 beside 2 workers: 4 threads on 2 CPUs
    assert (over.threads, over.spin) == (2, False) and "over-subscribed (4 threads on 2 CPUs)" in over.why
    billed = plan_threads(cpus=4, runs=1, spin_allowed=False)  # Lambda: never spin
    assert (billed.threads, billed.spin) == (4, False) and "billed" in billed.why
    assert plan_threads(cpus=1, runs=4).threads == 1  # never fewer than one
