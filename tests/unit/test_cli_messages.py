"""The CLI's messages as a newcomer meets them (issue 37 items 5, 8, 10): the first line says what is wrong and
the command that fixes it, no traceback; `invoke` prints a summary of a long answer."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.cli import local as local_cli
from infra.cli import main
from tests.conftest import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_invoke_with_nothing_listening_says_start_warmstart_local(capsys: pytest.CaptureFixture[str]) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    assert main(["invoke", "--endpoint-url", endpoint]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"warmstart invoke: nothing answers at {endpoint}; start the local Lambda first: `warmstart local` "
        "(in another terminal), or pass --endpoint-url"
    ]


def test_serve_points_to_the_http_host(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve"]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("warmstart serve: not a warmstart command; the HTTP host is `python -m handler`")


def test_invoke_prints_a_summary_of_a_long_answer(capsys: pytest.CaptureFixture[str]) -> None:
    body = json.dumps({"embeddings": [[0.125] * 384], "model": "m@1", "usage": {"tokens": 3}}).encode()
    local_cli.show(body, argparse.Namespace(full=False, json=False))
    out = capsys.readouterr().out
    assert len(out.splitlines()) < 12
    assert '"[0.125, 0.125, 0.125, 0.125, ...] (384 numbers; --full for all)"' in out
    local_cli.show(body, argparse.Namespace(full=True, json=False))
    assert len(capsys.readouterr().out.splitlines()) > 384
    local_cli.show(body, argparse.Namespace(full=False, json=True))
    assert json.loads(capsys.readouterr().out) == json.loads(body)


def test_the_default_event_is_the_default_models_example() -> None:
    from handler.tasks import catalog

    assert catalog.spec("embedding").example == local_cli.DEFAULT_EVENT


def local(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "local", "--port", str(free_port()), *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_local_refuses_an_unpacked_model_at_start_with_the_pack_command(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    proc = local("--model", str(tmp_path))
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError("`warmstart local --model UNPACKED` started instead of refusing") from None
    assert proc.returncode == 2 and "Traceback" not in err
    assert err.splitlines()[0] == (
        f"warmstart local: --model {tmp_path} is not a packed model (no manifest.json); pack it first: "
        f"`warmstart pack --from {tmp_path} --out models/{tmp_path.name}`, then "
        f"`warmstart local --model models/{tmp_path.name}`"
    )


def test_local_banner_names_the_model_and_a_valid_request(model_dir: Path) -> None:
    proc = local("--model", str(model_dir))
    time.sleep(0.1)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(5)]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert lines[1].strip() == f"model:  all-minilm-l6-v2@0.1.0 (embedding) from {model_dir}"
    assert 'warmstart invoke \'{"inputs": "hello"}\'' in lines[2]
    assert 'curl -d \'{"inputs": "hello"}\' ' in lines[4] and "'{}'" not in "".join(lines)


def test_readme_says_to_activate_the_venv_before_warmstart_local() -> None:
    readme = (ROOT / "README.md").read_text()
    line = readme[readme.index("Then try it by hand") :].split("\n\n")[0]
    assert ". .venv/bin/activate" in line and "warmstart local" in line


def test_every_task_example_is_a_valid_request() -> None:
    from handler.api import schemas
    from handler.tasks import catalog

    for spec in catalog.specs():
        if spec.example is not None:
            assert schemas.errors(spec.example, spec.request) == [], spec.name
    assert {s.name for s in catalog.specs() if s.example is None} <= {"tensor"}  # its inputs are the model's
