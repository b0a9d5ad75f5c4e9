"""The commands docs/http-host.md shows, run as shown: `curl` against a real `python -m handler` (only the port
differs). The first of them once sent a form-encoded body and got 415 while its test sent JSON."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.fixtures.drain_scenario import start

pytestmark = pytest.mark.integration
PAGE = ROOT / "docs" / "http-host.md"


def curl_lines() -> list[str]:
    blocks = re.findall(r"^```sh\n(.*?)^```", PAGE.read_text(), re.M | re.S)
    return [line for block in blocks for line in block.splitlines() if line.startswith("curl ")]


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    proc, port = start(tmp_path_factory.mktemp("host"), running=1, queue_max=8, sleep_s=0, drain_s=1)
    try:
        yield port
    finally:
        proc.kill()
        proc.communicate()  # reaps it and closes its pipes


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_curl_lines_of_http_host_md(port: int, tmp_path: Path) -> None:
    lines = curl_lines()
    assert len(lines) >= 5, lines  # the page's first block and its compatible-API block
    for line in lines:
        argv = shlex.split(line.replace("127.0.0.1:8080", f"127.0.0.1:{port}"))
        out = subprocess.run([*argv, "-w", "\n%{http_code}"], capture_output=True, text=True, timeout=60, check=True)
        body, _, status = out.stdout.rpartition("\n")
        assert status == "200", (line, status, body[:300])
        answer = json.loads(body)
        if "/ping" in line:
            assert answer["status"] == "ok", answer
        elif isinstance(answer, dict):  # native and OpenAI answers
            assert "error" not in answer and (answer.get("embeddings") or answer.get("data")), (line, answer)
        else:  # TEI's /embed: one vector per input
            assert len(answer) == 2 and len(answer[0]) == 384, (line, str(answer)[:200])
