"""bench/peers/run.py's pure parts, the harness it runs on (bench/runner.py) and its closed-loop client, offline:
nothing here installs or starts a peer."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bench.load import closed_loop
from bench.peers import run as bp
from bench.peers.driver import SENTENCES

ENV = {"PATH": "/usr/bin", "AWS_LAMBDA_RUNTIME_API": "x", "WARMSTART_THREADS": "8", "OMP_NUM_THREADS": "4"}


def test_install_commands_pin_each_peer_in_its_own_venv(tmp_path: Path) -> None:
    for name, pins in bp.PINS.items():
        venv, pip = bp.install_commands(name, tmp_path, python="/py")
        assert venv == ["/py", "-m", "venv", "--clear", str(tmp_path / name)]
        assert pip[:4] == [str(tmp_path / name / "bin" / "python"), "-m", "pip", "install"]
        assert pip[-len(pins) :] == pins
        assert all("==" in p for p in pins), pins  # pinned, every one
    assert any(p == "torch==2.13.0" for p in bp.PINS["infinity"])
    with pytest.raises(ValueError, match="valid: fastembed, infinity, export"):
        bp.install_commands("sentence-transformers")


def test_children_get_no_aws_or_warmstart_settings_and_no_hub() -> None:
    env = bp.base_env(ENV)
    assert not [k for k in env if k.startswith(("AWS_", "WARMSTART_", "OMP_"))]
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["INFINITY_ANONYMOUS_USAGE_STATS"] == "0"
    assert env["PATH"] == "/usr/bin"


def test_driver_commands() -> None:
    argv, env = bp.driver_command("ours", "serve", threads="2", environ=ENV)
    assert argv[:2] == [sys.executable, str(bp.DRIVER)]
    assert argv[2:4] == ["serve", "ours"] and argv[-2:] == ["--threads", "2"]
    assert env["WARMSTART_THREADS"] == "2" and env["WARMSTART_MODEL"] == str(bp.OURS_MODEL)
    # The CPUs its cgroup gives it, as Lambda's memory size says them: not 1 vCPU's against the peer's 2.
    assert env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] == "3538"
    assert env["AWS_LAMBDA_INITIALIZATION_TYPE"] == "on-demand"
    argv, env = bp.driver_command("fastembed", "serve", threads="2", environ=ENV)
    assert argv[-2:] == ["--threads", "2"]  # the same threads for the peer

    _, env = bp.driver_command("ours-optimized", "cold", environ=ENV)
    assert "WARMSTART_THREADS" not in env  # its default: the one it picks
    assert env["WARMSTART_MODEL"] == str(bp.OURS_OPTIMIZED)

    argv, env = bp.driver_command("fastembed", "cold", environ=ENV)
    assert argv[0] == str(bp.venv_python("fastembed")) and argv[3] == "fastembed"
    assert argv[argv.index("--model") + 1] == str(bp.EXPORT)
    assert not [k for k in env if k.startswith(("AWS_", "WARMSTART_"))]

    _, env = bp.driver_command("ours-spin", "serve", threads="2", environ=ENV)
    assert "AWS_LAMBDA_FUNCTION_NAME" not in env  # off Lambda: its plan lets the threads spin
    assert env["WARMSTART_MODEL"] == str(bp.OURS_MODEL) and env["WARMSTART_THREADS"] == "2"

    with pytest.raises(ValueError, match="valid: ours, ours-optimized, ours-spin, fastembed"):
        bp.driver_command("infinity", "cold")
    with pytest.raises(ValueError, match="threads"):
        bp.driver_command("ours", "serve", threads="two")
    with pytest.raises(ValueError, match="valid: cold, serve"):
        bp.driver_command("ours", "warm")


def test_server_commands() -> None:
    argv, env = bp.server_command("ours", 8123, environ=ENV)
    assert argv == [sys.executable, "-m", "handler"]
    assert (env["PORT"], env["HOST"], env["WARMSTART_MODEL"]) == ("8123", "127.0.0.1", str(bp.OURS_MODEL))
    assert "WARMSTART_THREADS" not in env  # sized from its own cgroup

    argv, env = bp.server_command("infinity", 8124, environ=ENV)
    assert argv[0].endswith("build/peers/infinity/bin/infinity_emb") and argv[1] == "v2"
    flags = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert flags["--engine"] == "optimum" and flags["--device"] == "cpu"
    assert flags["--pooling-method"] == "mean"  # its CLS default would be another model's answer
    assert (flags["--host"], flags["--port"], flags["--model-id"]) == ("127.0.0.1", "8124", str(bp.EXPORT))
    assert bp.ROUTES == {"ours": "/v1/embeddings", "infinity": "/embeddings"}

    with pytest.raises(ValueError, match="valid: ours, infinity"):
        bp.server_command("tei", 1)


def test_export_command_uses_its_own_venvs_optimum(tmp_path: Path) -> None:
    cmd = bp.export_command(Path("/pkg/model"), tmp_path / "out", tmp_path)
    assert cmd[:3] == [str(tmp_path / "export" / "bin" / "python"), "-m", "optimum.exporters.onnx"]
    assert cmd[cmd.index("--task") + 1] == "feature-extraction"
    assert cmd[cmd.index("--library-name") + 1] == "transformers"
    assert cmd[-1] == str(tmp_path / "out")


def test_ratios_are_taken_within_a_round() -> None:
    runs = [
        {"round": 0, "variant": "ours", "first_ms": 500.0},
        {"round": 0, "variant": "fastembed", "first_ms": 1000.0},
        {"round": 1, "variant": "ours", "first_ms": 900.0},  # a noisy round: both slow
        {"round": 1, "variant": "fastembed", "first_ms": 1800.0},
        {"round": 2, "variant": "ours", "first_ms": 400.0},  # its peer did not run: no ratio
    ]
    assert bp.round_ratios(runs, "first_ms", "ours", "fastembed") == [0.5, 0.5]
    http = [
        {"round": 0, "server": "ours", "quota": 1.0, "users": 8, "rps": 60.0},
        {"round": 0, "server": "infinity", "quota": 1.0, "users": 8, "rps": 40.0},
        {"round": 0, "server": "ours", "quota": 2.0, "users": 8, "rps": 10.0},
        {"round": 0, "server": "infinity", "quota": 2.0, "users": 8, "rps": 40.0},
    ]
    assert bp.round_ratios(http, "rps", "ours", "infinity", by="server", quota=1.0, users=8) == [1.5]
    assert bp.round_ratios(http, "rps", "ours", "infinity", by="server", quota=2.0, users=8) == [0.25]


def test_summary_tables() -> None:
    data = {
        "when": "now",
        "cpus": 2,
        "load": "1.0",
        "step_s": 8.0,
        "min_cosine": 0.9999999,
        "cold": [
            {"round": r, "variant": v, "first_ms": ms, "cpu_ms": 1.0, "rss_mb": 100.0}
            for r in range(2)
            for v, ms in (("ours", 600.0), ("fastembed", 1200.0))
        ],
        "warm": [
            {"round": 0, "variant": v, "threads": t, "b1_ms": b1, "b32_ms": 100.0}
            for t in ("1", "2")
            for v, b1 in (("ours", 4.5), ("fastembed", 5.0))
        ],
        "http": [
            {"round": 0, "quota": 1.0, "users": 32, "server": s, "rps": rps, "p50_ms": 1.0, "p99_ms": 2.0}
            | {"requests": 100, "ok": ok, "cpu_ms_per_ok": cpu}
            for s, rps, ok, cpu in (("ours", 90.0, 84, 12.0), ("infinity", 60.0, 100, 27.0))
        ],
    }
    md = bp.summarize(data)
    assert "| ours | 600 (600-600) | 1 | 100 | 0.50x (0.50-0.50) |" in md  # two rounds: their range
    assert "| 1 | ours | 4.50 | 0.90x | 100.00 | 1.00x |" in md
    assert "| 1 | 32 | ours | 90.0 | 1.0 | 2.0 | 16.0% | 12.0 | 1.50x |" in md
    assert "| 1 | 32 | infinity | 60.0 | 1.0 | 2.0 | 0.0% | 27.0 | 1 |" in md
    assert "1 - cosine to ours ≤ 1.0e-07 for every variant" in md


def test_a_peer_that_answers_differently_is_refused() -> None:
    bp.check_same_model({"fastembed": 0.9999999, "http-infinity": 1.0})
    with pytest.raises(RuntimeError, match=r"http-infinity.*0\.416"):
        bp.check_same_model({"fastembed": 1.0, "http-infinity": 0.416437})
    with pytest.raises(RuntimeError, match="nan"):
        bp.check_same_model({"fastembed": float("nan")})
    assert bp.cosine([1.0, 0.0], [1.0, 0.0]) == 1.0
    assert abs(bp.cosine([1.0, 0.0], [0.0, 2.0])) < 1e-12


def test_docs_section_is_inserted_once_then_replaced() -> None:
    doc = "# Benchmarks\n\n## HTTP\n\ntext\n\n## Figures quoted beside their settings\n\nlast\n"
    once = bp.replace_section(doc, bp.docs_section("| table one |"))
    assert once.index("| table one |") < once.index("## Figures quoted")
    assert once.startswith(doc.split("## Figures")[0]) and once.endswith("last\n")
    assert "<!-- not run by tests:" in once and "bench/peers/run.py --write-docs" in once
    twice = bp.replace_section(once, bp.docs_section("| table two |"))
    assert "| table one |" not in twice and twice.count(bp.BEGIN) == 1 and twice.endswith("last\n")
    assert twice == once.replace("| table one |", "| table two |")
    assert bp.replace_section("# x\n", "S").endswith("# x\n\nS\n")
    assert max(len(line) for line in once.splitlines() if not line.startswith("|")) <= 112


def test_plans() -> None:
    assert bp.FULL.users == bp.QUICK.users == (1, 8, 32)
    assert bp.FULL.quotas == (1.0, 2.0)
    assert bp.QUICK.step_s < bp.FULL.step_s and bp.QUICK.http_rounds <= bp.FULL.http_rounds
    assert bp.FULL.threads == (1, 2)  # every warm row gives both sides the same threads (and as many vCPUs)
    assert len(SENTENCES) == 32 and len(set(SENTENCES)) == 32  # the batch-32 call, all distinct


def test_process_cpu_counts_this_process() -> None:
    import os

    before = bp.process_cpu_ms(os.getpid())
    sum(i * i for i in range(3_000_000))  # ~0.1-0.3 s of CPU
    assert bp.process_cpu_ms(os.getpid()) - before >= 20


def test_percentile_is_nearest_rank() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert closed_loop.percentile(xs, 50) == 50.0
    assert closed_loop.percentile(xs, 99) == 99.0
    assert closed_loop.percentile([3.0, 1.0], 99) == 3.0
    assert closed_loop.percentile([], 50) != closed_loop.percentile([], 50)  # NaN


class _Server(BaseHTTPRequestHandler):
    """Answers every third request 503 and every fifth one with a wrong body; the rest a 384-d embedding."""

    count = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        with _Server.lock:
            _Server.count += 1
            n = _Server.count
        status, dim = (503, 384) if n % 3 == 0 else (200, 3 if n % 5 == 0 else 384)
        body = json.dumps({"data": [{"embedding": [0.0] * dim}]}).encode()
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield int(httpd.server_address[1])
    httpd.shutdown()
    httpd.server_close()


def test_closed_loop_counts_answers_by_status(server: int) -> None:
    bodies = [closed_loop.openai_body(s, "m") for s in SENTENCES[:4]]
    res = closed_loop.run("127.0.0.1", server, "/embeddings", bodies, users=4, duration_s=0.3, check=bp.embedding_of)
    assert res.requests == _Server.count > 10
    assert res.statuses[503] == _Server.count // 3
    assert res.statuses[299] > 0  # the wrong-dimension 200s, kept apart from the good ones
    assert res.ok == len(res.latencies_ms) == res.requests - res.statuses[503] - res.statuses[299]
    assert res.error_rate == pytest.approx(1 - res.ok / res.requests)
    assert res.rps == pytest.approx(res.ok / res.elapsed_s) and res.elapsed_s >= 0.3
    assert json.loads(bodies[0]) == {"input": [SENTENCES[0]], "model": "m"}
    with pytest.raises(ValueError):
        closed_loop.run("127.0.0.1", server, "/", bodies, users=0, duration_s=0.1)


def test_closed_loop_counts_a_refused_connection_as_a_transport_error() -> None:
    port = bp.free_port()  # nothing listens there
    res = closed_loop.run("127.0.0.1", port, "/", [b"{}"], users=1, duration_s=0.05, timeout_s=1)
    assert res.transport_errors > 0 and res.ok == 0 and res.error_rate == 1.0


class _Busy(BaseHTTPRequestHandler):
    """Refuses every request: 503 with Retry-After: 1."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(503)
        self.send_header("retry-after", "1")
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


def test_closed_loop_waits_as_retry_after_says_unless_told_not_to() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Busy)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = int(httpd.server_address[1])
    try:
        honored = closed_loop.run("127.0.0.1", port, "/", [b"{}"], users=2, duration_s=0.3)
        ignored = closed_loop.run("127.0.0.1", port, "/", [b"{}"], users=2, duration_s=0.3, honor_retry_after=False)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert honored.requests == honored.statuses[503] == 2  # one each, then waiting out the step
    assert honored.elapsed_s < 0.9  # the wait is cut at the step's end
    assert ignored.requests == ignored.statuses[503] > 10
    assert honored.error_rate == ignored.error_rate == 1.0
