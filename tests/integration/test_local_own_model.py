"""A user's own models (packed with `pack --from`) through the local Lambda: real awslambdaric instances,
invoked with boto3, answering what the in-process handler answers; a bad request is a typed error and the
instance keeps serving."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # the fixtures live under tests/, which is not an installed package
    sys.path.insert(0, ROOT)

from infra.pack.hf_pack import pack_from  # noqa: E402
from tests.conftest import start  # noqa: E402
from tests.fixtures.local_support import invoke, running  # noqa: E402
from tests.tiny_models import make_model_dir  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
REAL = "handler.app.lambda_handler"
QUERY = "what is the capital of germany"
DOCUMENTS = ["berlin is the capital of germany", "paris", "the quick brown fox", "machine learning model"]


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_rerank_and_embedding_models_through_awslambdaric(tmp_path: Path, backend: str) -> None:
    reranker = pack_from(make_model_dir(tmp_path, "bert", "cross-encoder"), tmp_path / "reranker")
    embedder = pack_from(
        make_model_dir(tmp_path, "xlm-roberta", "sentence-transformers", prompts={"query": "query: "}),
        tmp_path / "embedder",
    )
    rerank = {"query": QUERY, "documents": DOCUMENTS, "top_n": 3}
    embed = {"inputs": ["hello world", "paris"], "prompt_name": "query", "dimensions": 16}
    for model, event in ((reranker, rerank), (embedder, embed)):
        expected = start(model, backend).handle(event, None)
        environment = {"WARMSTART_MODEL": str(model), "WARMSTART_BACKEND": backend}
        with running(handler=REAL, environment=environment) as (local, client):
            result, body, _ = invoke(client, event)
            assert "FunctionError" not in result, body
            assert body["model"] == expected["model"] and body["usage"] == expected["usage"]
            if "results" in expected:
                assert [r["index"] for r in body["results"]] == [r["index"] for r in expected["results"]]
                got = [r["relevance_score"] for r in body["results"]]
                np.testing.assert_allclose(got, [r["relevance_score"] for r in expected["results"]], atol=1e-6)
                bad = {"query": QUERY, "documents": []}
            else:
                np.testing.assert_allclose(body["embeddings"], expected["embeddings"], atol=1e-6)
                bad = {"inputs": ["x"], "prompt_name": "passage"}  # not one of this model's prompts
            result, error, _ = invoke(client, bad)
            assert result["FunctionError"] == "Unhandled" and error["errorType"] == "InvalidInputError", error
            _, again, _ = invoke(client, event)  # the same instance serves on, with the same answer
            assert again == body
            assert local.pool.spawned == 1
