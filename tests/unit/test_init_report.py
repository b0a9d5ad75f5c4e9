"""The init phase emits exactly one structured report record."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from handler.core.config import Config
from handler.observability import report
from handler.runtime.invocation import Runtime
from tests.conftest import MODEL_KEY

KEYS = {
    "warmstart",
    "model",
    "backend",
    "providers",
    "threads",
    "phases_ms",
    "total_ms",
    "rss_mb",
    "peak_rss_mb",
    "init_type",
}
PHASES = {"onnx": {"manifest", "imports", "session", "warmup"}, "torch": {"manifest", "imports", "load", "warmup"}}


def start_with_report(model_dir: Path, backend: str, environ: dict[str, str]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    Runtime.start(Config(model_dir=model_dir, backend=backend), environ=environ, emit=records.append)  # type: ignore[arg-type]
    return records


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_one_report_with_the_documented_keys(backend: str, model_dir: Path, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue(f"{backend}_runtime")  # the import is paid once per session, not here
    records = start_with_report(model_dir, backend, {"AWS_LAMBDA_INITIALIZATION_TYPE": "snap-start"})
    assert len(records) == 1
    record = records[0]
    assert set(record) >= KEYS
    assert (record["warmstart"], record["model"], record["backend"]) == ("init", MODEL_KEY, backend)
    assert record["init_type"] == "snap-start"
    assert set(record["phases_ms"]) >= PHASES[backend]
    assert all(ms >= 0 for ms in record["phases_ms"].values())
    assert record["total_ms"] >= sum(record["phases_ms"].values()) * 0.99
    assert 0 < record["rss_mb"] <= record["peak_rss_mb"]
    assert record["threads"]["intra_op"] >= 1
    assert isinstance(record["providers"], list)
    assert record["providers"]
    json.dumps(record)  # plain JSON, no default= needed


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"AWS_LAMBDA_INITIALIZATION_TYPE": "provisioned-concurrency"}, "provisioned-concurrency"),
        ({"AWS_LAMBDA_RUNTIME_API": "127.0.0.1:9001"}, "on-demand"),  # Lambda's emulator sets no init type
        ({}, "http-host"),  # no Lambda runtime: the HTTP host, whose init runs at startup, before any request
    ],
)
def test_init_type_says_who_started_the_init(model_dir: Path, env: dict[str, str], expected: str) -> None:
    assert start_with_report(model_dir, "onnx", env)[0]["init_type"] == expected


def test_threads_follow_lambda_memory(model_dir: Path) -> None:
    threads = start_with_report(model_dir, "onnx", {"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1769"})[0]["threads"]
    assert threads["intra_op"] == 1
    assert threads["lambda_vcpus"] == 1.0


def test_sha256_phase_only_when_asked(model_dir: Path) -> None:
    records: list[dict[str, Any]] = []
    Runtime.start(Config(model_dir=model_dir, backend="onnx", verify_sha256=True), environ={}, emit=records.append)
    assert "sha256" in records[0]["phases_ms"]
    assert "sha256" not in start_with_report(model_dir, "onnx", {})[0]["phases_ms"]


def test_emit_writes_one_json_line() -> None:
    stream = io.StringIO()
    report.emit({"warmstart": "init", "path": Path("/x"), "phases_ms": {"a": 1.5}}, stream)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert lines[0].startswith('{"warmstart":"init",')  # log tools key on the first member
    assert {k: record.pop(k) for k in ("level", "message")} == {"level": "INFO", "message": "init report"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record.pop("timestamp"))
    assert record == {"warmstart": "init", "path": "/x", "phases_ms": {"a": 1.5}}


def test_report_says_what_memory_the_limits_assume(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory read (and where from), the model's cost per token and the batch tokens they give."""
    from handler.core import memory

    # The RSS of a one-model instance, not of this pytest process: after the suite's packing tests the process
    # held ~1.8 GB, which left less than 4,096 tokens' room in 2,048 MB (a failure that depended on test order).
    monkeypatch.setattr(memory, "resident_bytes", lambda: 150 * 2**20)
    config = Config(model_dir=model_dir, backend="onnx", batch_tokens=4096, max_inputs=64, max_chars=5000)
    records: list[dict[str, Any]] = []
    env = {"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "2048"}
    Runtime.start(config, environ=env, emit=records.append)  # type: ignore[arg-type]
    limits = records[0]["limits"]
    assert 0 < limits.pop("resident_mb") < 2048
    assert limits == {
        "memory_mb": 2048,
        "memory_from": "lambda",
        "request_reserve_mb": 10,  # 64 x 5,000 characters x 32 B
        "margin_mb": 205,
        "runs_at_once": 1,
        "bytes_per_token": 26112,  # from the shape `warmstart pack` writes into the manifest
        "shape_from": "manifest",
        "batch_tokens": 4096,  # the memory allows more: the Config's 4,096 is the ceiling
        "batch_tokens_from": "ceiling",
        "max_inputs": 64,
        "max_chars": 5000,
    }
