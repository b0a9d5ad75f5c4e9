"""`python -m handler`: Lambda's runtime client when AWS_LAMBDA_RUNTIME_API is set, the HTTP host otherwise,
`serve` (SageMaker) always HTTP; an image's CMD (a handler name) reaches the runtime client (in process:
tests/integration/test_entrypoint_lambda.py runs it for real)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import awslambdaric.__main__ as ric
import pytest

from handler import __main__ as entry
from handler.http_host import server as http_server
from handler.models import loader
from handler.runtime import lambda_loop


@pytest.fixture(autouse=True)
def _own_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """`server()` sets the process's runs at once for the init it starts: back as it was after each test."""
    monkeypatch.setattr(loader, "host_runs", loader.host_runs)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    seen: list[Any] = []
    monkeypatch.setattr(ric, "main", lambda argv: seen.append(("lambda", argv)))
    monkeypatch.setattr(lambda_loop, "run", lambda handler, loop: seen.append(("loop", handler, loop)))
    for name in ("WARMSTART_LAMBDA_LOOP", "AWS_LAMBDA_MAX_CONCURRENCY"):
        monkeypatch.delenv(name, raising=False)

    def serve_http(start: Any, sagemaker: bool = False) -> None:
        assert start is entry.lambda_runtime  # the entry point owns init: the HTTP host never imports handler.app
        seen.append(("http", sagemaker))

    monkeypatch.setattr(http_server, "serve_http", serve_http)
    monkeypatch.delenv("AWS_LAMBDA_RUNTIME_API", raising=False)
    return seen


HANDLER = "handler.app.lambda_handler"
RIC = ["awslambdaric"]  # the runtime client's argv, as `python -m awslambdaric HANDLER` would give it


@pytest.mark.parametrize(
    ("runtime_api", "argv", "expected"),
    [
        # auto: our loop does awslambdaric's init, then streams or hands the invocations to awslambdaric's loop
        ("127.0.0.1:9001", [], ("loop", "handler.app.lambda_handler", "auto")),
        ("127.0.0.1:9001", ["mine.app.handle"], ("loop", "mine.app.handle", "auto")),
        ("127.0.0.1:9001", ["serve"], ("http", True)),
        (None, [], ("http", False)),
        (None, ["serve"], ("http", True)),
        (None, ["handler.app.lambda_handler"], ("http", False)),  # the image's CMD on Cloud Run / Knative
    ],
)
def test_dispatch(
    calls: list[Any], monkeypatch: pytest.MonkeyPatch, runtime_api: str | None, argv: list[str], expected: Any
) -> None:
    if runtime_api:
        monkeypatch.setenv("AWS_LAMBDA_RUNTIME_API", runtime_api)
    entry.main(argv)
    assert calls == [expected]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WARMSTART_LAMBDA_LOOP": "awslambdaric"}, ("lambda", [*RIC, "handler.app.lambda_handler"])),
        ({"WARMSTART_LAMBDA_LOOP": "Streaming"}, ("loop", "handler.app.lambda_handler", "streaming")),
        ({"AWS_LAMBDA_MAX_CONCURRENCY": "8"}, ("lambda", [*RIC, "handler.app.lambda_handler"])),  # its workers
        ({"AWS_LAMBDA_MAX_CONCURRENCY": "8", "WARMSTART_LAMBDA_LOOP": "streaming"}, ("loop", HANDLER, "streaming")),
    ],
)
def test_the_lambda_loop_setting(
    calls: list[Any], monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: Any
) -> None:
    monkeypatch.setenv("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    entry.main([])
    assert calls == [expected]


def test_a_bad_lambda_loop_setting_exits_naming_the_valid_ones(
    calls: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001")
    monkeypatch.setenv("WARMSTART_LAMBDA_LOOP", "fast")
    with pytest.raises(SystemExit) as info:
        entry.main([])
    assert "WARMSTART_LAMBDA_LOOP='fast'; valid values: auto, awslambdaric, streaming" in str(info.value.code)
    assert calls == []


@pytest.mark.parametrize("argv", [["train"], ["serve", "extra"], ["--helpme"]])
def test_unknown_arguments_exit_with_usage(calls: list[Any], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        entry.main(argv)
    assert "usage: python -m handler" in str(info.value.code)
    assert calls == []


def test_server_takes_port_and_drain_from_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"SAGEMAKER_BIND_TO_PORT": "9081", "PORT": "8080", "WARMSTART_DRAIN_S": "3", "HOST": "127.0.0.1"}
    server = http_server.server(entry.lambda_runtime, env, sagemaker=True)
    assert (server.config.port, server.config.host, server.config.workers) == (9081, "127.0.0.1", 1)
    assert server.config.timeout_graceful_shutdown == 4  # the drain answers by 3 s; uvicorn's is the backstop
    assert server.drain.drain_s == 3


def test_signal_starts_the_drain_before_uvicorn_notices(monkeypatch: pytest.MonkeyPatch) -> None:
    server = http_server.server(entry.lambda_runtime, {"PORT": "8123"})
    begun: list[int] = []
    monkeypatch.setattr(server.drain, "begin_threadsafe", lambda: begun.append(1))
    server.handle_exit(15, None)
    assert begun == [1] and server.should_exit


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_says_what_each_host_gets_and_exits_0(
    calls: list[Any], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    entry.main([flag])
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m handler") and "AWS_LAMBDA_RUNTIME_API" in out and "/invocations" in out
    assert calls == []  # neither the runtime client nor the HTTP host started


def test_version_is_the_projects(calls: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    import tomllib

    from tests.conftest import ROOT

    entry.main(["--version"])
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out.strip() == f"warmstart {version}"
    assert calls == []


def test_project_metadata_builds_without_deprecation_warnings(tmp_path: Path) -> None:
    # `license = { text = ... }` warned on every install ("an error from 2027-02-18"): the SPDX string form.
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = (
        "import warnings, sys; warnings.simplefilter('error');"
        "from setuptools import build_meta; print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    metadata = next(tmp_path.glob("*.dist-info/METADATA")).read_text()
    assert "License-Expression: MIT" in metadata
