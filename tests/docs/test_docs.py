"""The docs are tested: every command shown is run by a test or says why not, flags exist, links resolve.

Every fenced ```sh block in README.md and docs/*.md is split into commands. Each command is either in
RUN_BY below (the test or make target that runs it, checked to exist) or its block is preceded by an HTML
comment `<!-- not run by tests: <reason> -->`. Independently of that, every `warmstart SUB --flag` shown
(in sh blocks and in inline code) must be in `warmstart SUB --help`, every `bench/**.py` and `layers.build`
flag in that script's source (or bench/runner.py's, for a bench built on it), every repository path a command
names must exist, and every make target must be in the Makefile. Relative links (and their #anchors) must
resolve, and a backticked name (a variable, an error type) may head a row in one table only.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import write_tiny_onnx

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 150

# Commands the suite runs, as the docs show them (normalized: `.venv/bin/` dropped, comments stripped), each
# with "path::name" of the test (or Makefile target) that runs it and, after " — ", how.
RUN_BY: dict[str, str] = {
    "warmstart pack --default [--out DIR] [--backends onnx,torch] [--no-fuse] [--force]": (
        "Makefile::setup — `make setup` (a prerequisite of `make test`) runs `warmstart pack --default --force`"
    ),
    "warmstart pack --onnx model.onnx --id my-model --version 3 --out models/my-model": (
        "tests/docs/test_docs.py::test_pack_onnx_as_documented — this very line, on a tiny ONNX model"
    ),
    "warmstart pack --from bge-small-en-v1.5 --id bge-small --version 1 --out models/bge-small": (
        "tests/docs/test_docs.py::test_pack_from_as_documented — this very line, on a tiny random BERT embedder"
        " (tests/tiny_models.py) with CLS pooling and normalize, as bge-small's directory has"
    ),
    "warmstart local --port 9000 --max-concurrency 4": (
        "tests/integration/test_local_shutdown.py::test_cli_local_and_invoke_then_sigint"
        " — `warmstart local --port 0` with a fixture handler, then SIGINT"
    ),
    'warmstart invoke \'{"inputs": ["hello"]}\' --endpoint-url http://127.0.0.1:9000': (
        "tests/integration/test_local_shutdown.py::test_cli_local_and_invoke_then_sigint"
        " — `warmstart invoke --endpoint-url ... EVENT` against that local Lambda"
    ),
    'curl -s -d \'{"inputs": ["hello"]}\' http://127.0.0.1:9000/2015-03-31/functions/function/invocations': (
        "tests/integration/test_local_invoke.py::test_emulator_path_for_curl_habits — the same POST with http.client"
    ),
    "warmstart local --snapshot --port 9000": (
        "tests/integration/test_local_snapshot.py::test_demo_with_snapshot_reports_the_template_and_a_restore"
        " — `warmstart demo --snapshot` (the same local Lambda and flag); the file's other tests drive it in-process"
    ),
    "warmstart warm --function warmstart --concurrency 8 --endpoint-url http://127.0.0.1:9000": (
        "tests/warmers/test_local.py::test_cli_json_alias_payload_style_and_a_missing_target"
        " — `warmstart warm ... --endpoint-url` against a local Lambda"
    ),
    "warmstart local --memory 512 --port 9000": (
        "tests/integration/test_local_limits.py::test_each_instance_runs_under_its_memory_sizes_quota_and_limit_and"
        "_the_handler_agrees — a local Lambda with memory 512 in-process (the quota and limit read back)"
    ),
    "warmstart tune --sizes 512,1024,1769,3008 --cold 5 --warm 50 --target-ms 50": (
        "tests/integration/test_tune.py::test_a_small_run_writes_the_table_the_json_and_the_plot"
        " — `warmstart tune` in-process on the echo fixture: two sizes, 1 cold + 3 warm"
    ),
    "PORT=8080 python -m handler": (
        "tests/integration/test_http_drain.py::test_sigterm_finishes_in_flight_and_answers_queued_503"
        " — `python -m handler` as a real process with PORT set (tests/fixtures/drain_scenario.py)"
    ),
    **{
        line: "tests/integration/test_docs_http.py::test_the_curl_lines_of_http_host_md — this very line, run by"
        " curl against a real `python -m handler` (the port changed)"
        for line in (
            "curl -s http://127.0.0.1:8080/invocations -H 'content-type: application/json'"
            ' -d \'{"inputs": ["hello"]}\'',
            "curl -s http://127.0.0.1:8080/ping",
            "curl -s http://127.0.0.1:8080/v1/embeddings -H 'content-type: application/json'"
            ' -d \'{"input": ["hello"], "model": "text-embedding-3-small"}\'',
            "curl -s http://127.0.0.1:8080/v1/embeddings -H 'content-type: application/json'"
            ' -d \'{"input": "hello", "dimensions": 128, "encoding_format": "base64"}\'',
            "curl -s http://127.0.0.1:8080/embed -H 'content-type: application/json'"
            ' -d \'{"inputs": ["hello", "world"]}\'',
        )
    },
}

NOT_RUN = re.compile(r"<!--\s*not run by tests:\s*(?P<reason>.*?)\s*-->", re.S)
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\s*$")
SEPARATORS = {"&&", "||", ";", "|"}
REPO_DIRS = ("handler/", "infra/", "bench/", "tests/", "layers/", "warmers/", "docs/")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


@dataclass(frozen=True)
class Command:
    doc: Path
    line: int
    text: str  # normalized
    reason: str | None  # the block's "not run by tests" reason, if any

    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}: {self.text}"


def strip_fences(text: str) -> str:
    """The text with fenced blocks blanked (line numbers kept), for links and tables."""
    out, inside = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            inside = not inside
            out.append("")
            continue
        out.append("" if inside else line)
    return "\n".join(out)


def blocks(doc: Path) -> list[tuple[str, int, list[str], str | None]]:
    """(language, first line number, lines, not-run reason) of every fenced block."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i].strip())
        if not m:
            i += 1
            continue
        start, i = i, i + 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        i += 1
        before = "\n".join(lines[:start]).rstrip()
        reason = None
        if before.endswith("-->"):
            comment = before[before.rfind("<!--") :]
            hit = NOT_RUN.fullmatch(comment)
            reason = hit.group("reason") if hit else None
        found.append((m.group("lang"), start + 2, body, reason))
    return found


def normalize(tokens: list[str]) -> str:
    """One spelling per command: `.venv/bin/` dropped, quotes only where a token needs them."""
    return " ".join(quote(t.removeprefix(".venv/bin/")) for t in tokens)


def quote(token: str) -> str:
    return token if re.fullmatch(r"[\w@%+=:,./\[\]-]+", token) else shlex.quote(token)


def commands() -> list[Command]:
    found = []
    for doc in DOCS:
        for lang, first, body, reason in blocks(doc):
            if lang != "sh":
                continue
            joined: list[tuple[int, str]] = []
            for n, line in enumerate(body, first):
                if joined and joined[-1][1].endswith("\\"):
                    joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line)
                else:
                    joined.append((n, line))
            for n, line in joined:
                tokens = shlex.split(line, comments=True)
                part: list[str] = []
                for token in [*tokens, ";"]:
                    if token in SEPARATORS:
                        if part:
                            found.append(Command(doc, n, normalize(part), reason))
                        part = []
                    else:
                        part.append(token)
    return found


def program(command: str) -> list[str]:
    """The command's tokens without leading VAR=value assignments."""
    tokens = shlex.split(command)
    while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tokens[0]):
        tokens.pop(0)
    return tokens


@functools.cache
def cli_help(*subcommand: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "infra.cli", *subcommand, "--help"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def inline_warmstart_commands() -> list[tuple[Path, str]]:
    """`warmstart SUB ...` as inline code in the prose (outside fenced blocks)."""
    found = []
    for doc in DOCS:
        for span in re.findall(r"`(warmstart [^`]+)`", strip_fences(doc.read_text(encoding="utf-8"))):
            found.append((doc, span))
    return found


def test_there_are_commands_to_check() -> None:
    assert len(commands()) >= 20


def test_every_command_is_run_by_a_test_or_says_why_not() -> None:
    orphans = [c.where() for c in commands() if c.reason is None and c.text not in RUN_BY]
    assert not orphans, "commands neither in RUN_BY nor under <!-- not run by tests: ... -->:\n" + "\n".join(orphans)
    empty = [c.where() for c in commands() if c.reason is not None and len(c.reason) < 10]
    assert not empty, "a not-run comment must give a reason:\n" + "\n".join(empty)


def test_run_by_entries_are_shown_in_the_docs_and_their_tests_exist() -> None:
    shown = {c.text for c in commands()}
    for command, by in RUN_BY.items():
        assert command in shown, f"RUN_BY lists a command no doc shows: {command}"
        path, name = by.split(" — ", 1)[0].split("::")
        source = (ROOT / path).read_text(encoding="utf-8")
        pattern = rf"^{re.escape(name)}:" if path == "Makefile" else rf"^def {re.escape(name)}\("
        assert re.search(pattern, source, re.M), f"{by}: no {name} in {path}"
        if path == "Makefile":  # the recipe runs the command itself, not just something under that target
            assert " ".join(program(command)[:3]) in source, f"{by}: the Makefile does not run {command}"


def test_only_sh_blocks_hold_commands() -> None:
    """Commands are checked in ```sh blocks, so a command may not hide in an unlabelled or bash fence."""
    bad = []
    for doc in DOCS:
        for lang, first, _body, _reason in blocks(doc):
            if lang in ("", "bash", "shell", "console", "zsh"):
                bad.append(f"{doc.relative_to(ROOT)}:{first - 1}: ```{lang}")
    assert not bad, "label fences ```sh (commands) or ```text/json/...:\n" + "\n".join(bad)


def test_warmstart_subcommands_and_flags_exist() -> None:
    shown: dict[str, set[str]] = defaultdict(set)
    for c in commands():
        tokens = program(c.text)
        if tokens and tokens[0] == "warmstart":
            shown[tokens[1]] |= set(FLAG.findall(c.text))
    for _doc, span in inline_warmstart_commands():
        sub, *rest = span.split()[1:] or [""]
        if re.fullmatch(r"[a-z]+", sub):
            shown[sub] |= set(FLAG.findall(" ".join(rest)))
    assert {"pack", "local", "invoke", "warm", "demo"} <= set(shown), sorted(shown)
    top = cli_help()
    unknown = [sub for sub in shown if not re.search(rf"\b{sub}\b", top)]
    assert not unknown, f"not subcommands of warmstart: {unknown}\n{top}"
    missing = {
        sub: sorted(f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", cli_help(sub)))
        for sub, flags in sorted(shown.items())
    }
    missing = {sub: flags for sub, flags in missing.items() if flags}
    assert not missing, f"flags the docs show that `warmstart SUB --help` does not list: {missing}"


def test_console_script_answers_help() -> None:
    """`warmstart` (the console script the docs show as `.venv/bin/warmstart`) is the same CLI."""
    script = Path(sys.executable).parent / "warmstart"
    if not script.exists():
        pytest.skip(f"no console script next to {sys.executable} (not installed with pip install -e)")
    out = subprocess.run([str(script), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == cli_help()


def script_of(tokens: list[str]) -> Path | None:
    """The file a `python X.py` / `python -m X` command runs (pytest and `-m handler` aside), if any."""
    if tokens[0] != "python" or len(tokens) < 2:
        return None
    if tokens[1].endswith(".py"):
        return ROOT / tokens[1]
    if tokens[1] == "-m" and tokens[2] not in ("pytest", "handler"):
        module = ROOT / tokens[2].replace(".", "/")
        return module / "__main__.py" if module.is_dir() else module.with_suffix(".py")
    return None


def command_problems(c: Command, makefile: str) -> list[str]:
    tokens = program(c.text)
    if not tokens:
        return []
    problems = []
    if tokens[0] == "make":
        problems += [f"no make target {t}" for t in tokens[1:] if not re.search(rf"^{re.escape(t)}:", makefile, re.M)]
    script = script_of(tokens)
    if script is not None and not script.is_file():
        problems.append(f"no {script.relative_to(ROOT)}")
    elif script is not None:
        source = script.read_text(encoding="utf-8")
        if "from bench import runner" in source or "from bench.runner import" in source:  # --rounds, --out: there
            source += (ROOT / "bench" / "runner.py").read_text(encoding="utf-8")
        # Flags are the command's own tokens (`[--opt]` too), not text inside a quoted value passed through.
        flags = [m.group() for t in tokens if (m := FLAG.match(t.lstrip("[")))]
        problems += [f"{flag} not in {script.name}" for flag in flags if f'"{flag}"' not in source]
    problems += [f"no {t}" for t in tokens[1:] if t.startswith(REPO_DIRS) and not (ROOT / t).exists()]
    return [f"{c.where()}: {p}" for p in problems]


def test_script_flags_paths_and_make_targets_exist() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    problems = [p for c in commands() for p in command_problems(c, makefile)]
    assert not problems, "\n".join(problems)
    assert (ROOT / "handler" / "__main__.py").is_file()  # `python -m handler`


def test_pack_onnx_as_documented(tmp_path: Path) -> None:
    documented = next(c for c in commands() if c.text.startswith("warmstart pack --onnx"))
    argv = program(documented.text)[1:]
    write_tiny_onnx(tmp_path / argv[argv.index("--onnx") + 1])
    out = subprocess.run(
        [sys.executable, "-m", "infra.cli", *argv],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    manifest = json.loads((tmp_path / argv[argv.index("--out") + 1] / "manifest.json").read_text())
    assert (manifest["id"], manifest["version"], manifest["task"]) == ("my-model", "3", "tensor")


def test_pack_from_as_documented(tmp_path: Path) -> None:
    from tests.tiny_models import make_model_dir

    documented = next(c for c in commands() if c.text.startswith("warmstart pack --from"))
    argv = program(documented.text)[1:]
    make_model_dir(
        tmp_path,
        "bert",
        "sentence-transformers",
        name=argv[argv.index("--from") + 1],
        pooling="cls",
        normalize=True,
    )
    out = subprocess.run(
        [sys.executable, "-m", "infra.cli", *argv],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    # What a user reads: the phases as they end, then what was written, its size, the next command.
    lines = out.stdout.splitlines()
    summary = lines[next(i for i, line in enumerate(lines) if line.startswith("warmstart pack: wrote ")) :]
    assert re.match(rf"warmstart pack: wrote \S*{argv[argv.index('--out') + 1]} in \d+ s", summary[0]), summary
    assert summary[0].endswith(": bge-small@1, task embedding, backends onnx, torch"), summary
    assert re.fullmatch(r"  \d+ files, [\d.]+ [KM]B: model\.\S+ [\d.]+ [KM]B, .*", summary[1]), summary
    assert re.match(rf"next: warmstart local --model \S*{argv[argv.index('--out') + 1]} ", summary[-1]), summary
    manifest = json.loads((tmp_path / argv[argv.index("--out") + 1] / "manifest.json").read_text())
    assert (manifest["id"], manifest["version"], manifest["task"]) == ("bge-small", "1", "embedding")
    assert manifest["pooling"]["mode"] == "cls" and manifest["pooling"]["normalize"] is True


def slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = defaultdict(int)
    found = set()
    for line in strip_fences(doc.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            base = slug(m.group(1))
            found.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
            seen[base] += 1
    return found


def test_relative_links_resolve() -> None:
    broken = []
    for doc in DOCS:
        prose = re.sub(r"`[^`\n]*`", "", strip_fences(doc.read_text(encoding="utf-8")))
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_readme_links_every_docs_page_and_stays_short() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_MAX_LINES
    unlinked = [d.name for d in DOCS[1:] if f"(docs/{d.name})" not in readme]
    assert not unlinked, f"README's docs map misses {unlinked}"


def test_each_docs_page_starts_with_an_example() -> None:
    late = []
    for doc in DOCS[1:]:
        text = NOT_RUN.sub("", doc.read_text(encoding="utf-8"))
        lines = [line for line in text.splitlines() if line.strip()]
        assert lines[0].startswith("# "), f"{doc.name}: no title"
        if not any(FENCE.match(line.strip()) for line in lines[1:3]):
            late.append(doc.name)
    assert not late, f"pages that do not open with an example: {late}"


def test_no_name_heads_a_row_in_two_tables() -> None:
    rows: dict[str, list[str]] = defaultdict(list)
    for doc in DOCS:
        lines = strip_fences(doc.read_text(encoding="utf-8")).splitlines()
        for n, line in enumerate(lines):
            if not line.startswith("|") or re.fullmatch(r"[|\s:-]+", line):
                continue
            if n + 1 < len(lines) and re.fullmatch(r"\|[\s:|-]+", lines[n + 1]):
                continue  # a header row
            first = line.strip("|").split("|")[0]
            for name in re.findall(r"`([^`]+)`", first):
                rows[name].append(f"{doc.relative_to(ROOT)}:{n + 1}")
    twice = {name: where for name, where in rows.items() if len(where) > 1}
    assert not twice, f"described in more than one table (keep one, link to it): {twice}"
    assert "WARMSTART_MODEL" in rows and "ModelLoadError" in rows


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_no_stale_paths(doc: Path) -> None:
    """Paths that moved in the layout change (issue 12) are not shown under their old names."""
    text = doc.read_text(encoding="utf-8")
    stale = ["infra/Dockerfile", "infra.zygote", "handler/pack.py", "infra/cmd_", "infra/local_lambda"]
    assert not [s for s in stale if s in text]
