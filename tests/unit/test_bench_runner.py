"""bench/runner.py, the harness under every bench: the order of a round, medians with ranges, ratios within
rounds, a long-lived child spoken to in JSON lines, the files a run writes. Offline; no cgroup is made."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest

from bench import runner

CHILD = """
import json, sys
print("noise before the answer", flush=True)
print("m:" + json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    ask = json.loads(line)
    if ask.get("die"):
        sys.exit(3)
    print("m:" + json.dumps({"twice": ask["x"] * 2}), flush=True)
"""


def test_every_variant_takes_every_place_over_the_rounds() -> None:
    names = ["a", "b", "c"]
    rounds = [runner.order(names, r) for r in range(6)]
    assert rounds[0] == ["a", "b", "c"] and rounds[1] == ["a", "c", "b"]
    for name in names:
        assert {r.index(name) for r in rounds} == {0, 1, 2}
    assert all(sorted(r) == names for r in rounds)
    assert runner.order([], 3) == []


def test_a_median_with_its_range() -> None:
    s = runner.Stat.of([3.0, 1.0, 2.0, math.nan])
    assert (s.median, s.lo, s.hi, s.n) == (2.0, 1.0, 3.0, 3)
    assert s.fmt(1, " ms") == "2.0 ms (1.0-3.0)"
    assert runner.Stat.of([4.25]).fmt(2) == "4.25"  # one value: no range to show
    assert runner.Stat.of([]).fmt() == "-"


def test_ratios_are_taken_within_a_round_and_shown_with_their_range() -> None:
    rows = [
        {"round": 0, "variant": "ours", "ms": 5.0},
        {"round": 0, "variant": "peer", "ms": 10.0},
        {"round": 1, "variant": "ours", "ms": 9.0},  # a noisy round: both slow, the ratio holds
        {"round": 1, "variant": "peer", "ms": 12.0},
        {"round": 2, "variant": "ours", "ms": 1.0},  # its peer did not run: no ratio
    ]
    assert runner.ratios(rows, "ms", "ours", "peer") == [0.5, 0.75]
    assert runner.fmt_ratio([0.5, 0.75, 0.6]) == "0.60x (0.50-0.75)"
    assert runner.fmt_ratio([1.5]) == "1.50x"
    assert runner.fmt_ratio([]) == "-"


def test_a_closed_choice_is_refused_with_the_valid_ones() -> None:
    assert runner.csv("a,c", ["a", "b", "c"]) == ["a", "c"]
    with pytest.raises(SystemExit, match=r"unknown variants \['x'\]; valid: a, b"):
        runner.csv("a,x", ["a", "b"])
    with pytest.raises(SystemExit, match="unknown caches"):
        runner.csv("", ["warm", "cold"], "caches")


def test_children_get_none_of_our_settings() -> None:
    env = runner.base_env({"PATH": "/bin", "WARMSTART_THREADS": "8", "AWS_REGION": "x", "OMP_NUM_THREADS": "2"})
    assert env == {"PATH": "/bin", "PYTHONPATH": str(runner.ROOT), "HF_HUB_OFFLINE": "1"}
    lam = runner.lambda_env(2.0)
    assert lam["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] == "3538" and lam["AWS_LAMBDA_INITIALIZATION_TYPE"] == "on-demand"
    assert runner.lambda_env(0.5)["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] == "884"


def test_a_quota_wraps_a_command_so_its_whole_start_runs_in_the_group(tmp_path: Path) -> None:
    q = runner.Quota.__new__(runner.Quota)  # no cgroup made: only the command it builds
    q.path = tmp_path / "grp"
    argv = q.wrap([sys.executable, "-c", "print(1)"])
    assert argv[:2] == ["sh", "-c"] and f"{tmp_path}/grp/cgroup.procs" in argv[2] and 'exec "$@"' in argv[2]
    assert argv[-3:] == [sys.executable, "-c", "print(1)"]
    with pytest.raises(ValueError, match="positive number of vCPUs"):
        q.set(0)


def test_a_long_lived_child_answers_line_by_line_and_its_death_is_an_error() -> None:
    child = runner.Child([sys.executable, "-c", CHILD], {"PATH": "/usr/bin:/bin"}, "m:")
    try:
        assert child.hello == {"ready": True} and child.ready_ms > 0
        assert [child.ask({"x": i})["twice"] for i in (1, 2, 3)] == [2, 4, 6]
        assert runner.cpu_time_ms(child.pid) > 0 and runner.peak_rss_mb(child.pid) > 1
        with pytest.raises(RuntimeError, match="ended without an answer"):
            child.ask({"die": True})
    finally:
        child.close()


def test_results_are_written_as_json_and_markdown(tmp_path: Path) -> None:
    res = runner.Results("bench/x.py", meta={"model": "m"})
    for rnd, ms in enumerate((2.0, 1.0, 3.0)):
        res.add(round=rnd, variant="ours", ms=ms)
    assert res.stat("ms", variant="ours").fmt(1) == "2.0 (1.0-3.0)"
    res.save(tmp_path, runner.table(["variant", "ms"], [["ours", res.stat("ms").fmt(1)]]))
    saved = json.loads((tmp_path / "runs.json").read_text())
    assert saved["meta"]["bench"] == "bench/x.py" and saved["meta"]["model"] == "m" and len(saved["rows"]) == 3
    md = (tmp_path / "results.md").read_text()
    assert md.startswith("`bench/x.py`") and "| ours | 2.0 (1.0-3.0) |" in md and "|---|---|" in md


def bench_imports() -> dict[str, set[str]]:
    """bench's modules and the bench modules each imports (at any depth in the file: deferred ones count)."""
    import ast

    root = runner.ROOT
    mods = {
        ".".join(p.relative_to(root).with_suffix("").parts): p
        for p in (root / "bench").rglob("*.py")
        if p.name != "__init__.py"
    }
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            graph[mod] |= {n for n in names if n in mods and n != mod}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle, or []."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str]:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return [*stack[stack.index(n) :], n]
            if n not in state and (found := visit(n)):
                return found
        state[m] = 2
        stack.pop()
        return []

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return []


def test_bench_has_no_import_cycle_and_the_check_finds_one() -> None:
    graph = bench_imports()
    assert "bench.runner" in graph["bench.peers.run"] and "bench.pack.models" in graph["bench.pack.memory"]
    assert cycle(graph) == []
    assert graph["bench.runner"] == set()  # the harness is at the bottom: it imports no bench
    found = cycle({**graph, "bench.pack.models": {"bench.pack.memory"}})  # the circle there was, put back
    assert len(found) == 3 and found[0] == found[-1] and set(found) == {"bench.pack.memory", "bench.pack.models"}
    # Imports by full name only: a folder put on sys.path (`from big_models import ...`) hides edges from this.
    hacks = [
        p.name for p in (runner.ROOT / "bench").rglob("*.py") if re.search(r"sys\.path\.\w+\([^)]*bench", p.read_text())
    ]
    assert not hacks


def test_coldstart_starts_each_variant_as_lambda_would_with_its_own_code_first(tmp_path: Path) -> None:
    from bench.coldstart import run as cs

    argv, env, cwd = cs.command("ours", 1.0, None, tmp_path)
    assert argv[1:] == ["-m", "awslambdaric", cs.APP] and cwd == runner.ROOT
    assert env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] == "1769" and env["WARMSTART_MODEL"] == str(runner.OPTIMIZED)
    argv, env, cwd = cs.command("main-no-optimized", None, tmp_path / "ref", tmp_path / "model")
    assert env["PYTHONPATH"].split(":")[0] == str(tmp_path / "ref") and cwd == tmp_path / "ref"
    assert env["WARMSTART_MODEL"] == str(tmp_path / "model") and env["WARMSTART_ORT_OPTIMIZED"] == "0"
    assert env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] == "3538"  # --quotas none: this host's 2 CPUs
    _, env, _ = cs.command("imports_only_torch", 0.29, None, tmp_path)
    assert env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] == "512" and "WARMSTART_BACKEND" not in env
    assert {"ours", "main", "floor_ort", "naive_st", "imports_only_onnx", "ours+sha"} <= set(cs.VARIANTS)


def test_coldstart_reads_counts_resident_data_files_and_compares_the_other_layout(tmp_path: Path) -> None:
    from bench.coldstart import reads

    model, other = tmp_path / "model", tmp_path / "elsewhere"
    model.mkdir()
    other.mkdir()
    data, code = model / "m.data", other / "lib.so"
    for path in (data, code):
        path.write_bytes(b"x" * (3 * 4096))
        path.read_bytes()  # just written and read: resident
    weights, total = reads.read_mb({str(data), str(code), str(tmp_path / "gone")}, model)
    assert weights == 3 * 4096 / 2**20 and total == 2 * weights  # only the model's *.data count as weights

    res = runner.Results("bench/coldstart/reads.py")
    for rnd, (ours, other_ms) in enumerate([(90.0, 100.0), (110.0, 100.0)]):
        res.add(round=rnd, quota=1.0, variant="ours", weights_mb=90.5, all_mb=170.0, first_ms=ours, cpu_ms=200.0)
        res.add(
            round=rnd, quota=1.0, variant="ours@other", weights_mb=93.1, all_mb=173.0, first_ms=other_ms, cpu_ms=200.0
        )
    text = reads.summarize(res, [1.0], ["ours", "ours@other"], "here")
    assert "| 1 | ours / ours@other | 1.00x (0.90-1.10) | 1.00x (1.00-1.00) |" in text
    assert "| 1 | ours | 90.5 (90.5-90.5) |" in text

    sessions = runner.Results("bench/coldstart/reads.py")
    for rnd, (ours, other_ms) in enumerate([(180.0, 200.0), (220.0, 200.0)]):
        for name, ms in (("ours", ours), ("ours@other", other_ms)):
            sessions.add(
                round=rnd, quota=0.5, variant=name, session_ms=ms, run_ms=10.0, total_ms=ms + 10, weights_mb=90.5
            )
    assert "| 0.5 | 1.00x (0.90-1.10) | 1.00x (1.00-1.00) |" in reads.summarize_sessions(sessions, [0.5], "here")
