"""What `warmstart pack` and `warmstart optimize` print, as a user reads it (issue 37 item 11): progress (when
stderr is not a terminal, a plain line per phase on stdout; on a terminal, one tqdm line on stderr), then a short
summary (what was written, sizes, the quality figure, the next command); `--json`: one parseable JSON object and
nothing else. A refusal stays one line on stderr."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.tiny_models import make_model_dir

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "infra.cli", *argv]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("src"), "bert", "sentence-transformers")


def test_pack_without_a_terminal_prints_phases_then_a_summary(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "m"
    done = cli("pack", "--from", str(source), "--out", str(out), "--backends", "onnx", "--quantize", "int8")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    phases = [line for line in lines if re.fullmatch(r"warmstart pack: [^:]+: [\d.]+ s", line)]
    assert phases == lines[: len(phases)], lines  # the phases as they end, then the summary
    assert phases[0].startswith("warmstart pack: reading the model directory: "), phases
    assert any(p.startswith("warmstart pack: exporting the ONNX graph: ") for p in phases), phases
    assert any(p.startswith("warmstart pack: quantizing (int8), the quality gate: ") for p in phases), phases
    summary = lines[len(phases) :]
    assert "{" not in done.stdout  # no JSON unless asked
    assert summary[0].startswith(f"warmstart pack: wrote {out} in "), summary
    assert "task embedding, backends onnx" in summary[0]
    assert re.fullmatch(r"  \d+ files, [\d.]+ KB: .*", summary[1]), summary
    assert re.fullmatch(r"  quality: 0\.\d{6} \(.*cosine.*\), the gate: 0\.99", summary[2]), summary
    worst = r"  worst text (['\"]).*\1, p1 cosine .*; retrieval top-1 [\d.]+, top-10 [\d.]+"
    assert re.fullmatch(worst, summary[3]), summary  # the gate's worst text: a figure users see
    assert summary[4] == f"next: warmstart optimize {out}   (pre-optimize it for this machine; optional)"
    assert summary[5].startswith(f"next: warmstart local --model {out}")


def test_pack_and_optimize_json_is_one_object(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "m"
    done = cli("pack", "--from", str(source), "--out", str(out), "--backends", "onnx", "--no-fuse", "--json")
    assert done.returncode == 0, done.stderr
    packed = json.loads(done.stdout)
    assert packed["packed"] == str(out) and packed["backends"] == ["onnx"]

    done = cli("optimize", str(out))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert done.stderr == "" and [line.split(":")[1].strip() for line in lines[:4]] == [
        "optimizing the graph for this CPU (prepacked weights)",
        "laying out the weights in the order a start reads them",
        "proving the optimized model bit-identical",
        "recording the byte ranges a start reads",
    ]
    summary = lines[4:]
    assert "touched_ranges" not in done.stdout and len(summary) == 3, summary
    assert re.fullmatch(
        rf"warmstart optimize: wrote model\.opt\.onnx.* into {re.escape(str(out))} in \d+ s \([\d.]+ [KM]B\), "
        r"bit-identical to the portable model on \d+ probes",
        summary[0],
    ), summary
    assert summary[1].startswith("  tokenizer shortcut: ") and summary[2].startswith("next: warmstart local --model")

    done = cli("optimize", str(out), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["optimized"]["model"] == "model.opt.onnx"
    done = cli("optimize", str(out), "--remove")
    assert done.stdout == f"warmstart optimize: removed the optimized model from {out}\n"


def test_a_refusal_is_the_only_line() -> None:
    done = cli("pack", "--from", "/nonexistent/model")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "warmstart pack: /nonexistent/model: not a directory (pass a local model directory; nothing is downloaded)"
    ]


def test_on_a_terminal_one_line_rewritten_and_cleared() -> None:
    from infra.cli.progress import Progress
    from infra.pack.progress import phase

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    with Progress("warmstart pack", stream):
        phase("loading the weights")
        phase("exporting the ONNX graph")
    text = stream.getvalue()
    assert "warmstart pack: loading the weights" in text and "warmstart pack: exporting the ONNX graph" in text
    assert "\r" in text and "\n" not in text.strip("\n")  # rewritten in place, never a new line per phase
    phase("after the command")  # nobody listens any more: nothing printed
    assert stream.getvalue() == text
