"""bge-reranker-v2-gemma's layout (tests.lm_rerankers.make_gemma_family_reranker_dir) on tiny random
GemmaForCausalLM (family gemma: the released model's class) and Gemma2ForCausalLM (gemma2: attention and final
logit soft-capping, a sliding window shorter than every pair), each packed once for both backends with
`pack --from` and served against `CrossEncoder.predict` on the routes clients use; int8 behind the rerank gate;
the refusals, one line each."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.core.config import Config
from handler.core.errors import InvalidInputError
from handler.runtime.invocation import Runtime
from infra.pack.hf_pack import pack_from
from infra.pack.hf_source import UnsupportedModelError, read_source
from infra.pack.lm_rerank import LMRerankError
from infra.pack.precision import Precision
from tests.lm_rerankers import BGE_GEMMA_PROMPT, GEMMA2_CAPS, make_gemma_family_reranker_dir

QUERY = "what is a cold start?"
DOCUMENTS = [
    "the first request of a new instance",
    "a warm call",
    "",
    "ünïcödé 日本語 テキスト emoji 🙂",
    "the quick brown fox jumps over the lazy dog . " * 60,  # past 512 tokens: truncated, the prompt restored
    "paris is the capital of france .",
]
BACKENDS = ("onnx", "torch")


Packed = tuple[str, Path, Path, Any]  # family, source directory, packed model, CrossEncoder.predict's scores


def _pack(family: str, tmp_path_factory: pytest.TempPathFactory) -> Packed:
    from sentence_transformers import CrossEncoder

    root = tmp_path_factory.mktemp(f"{family}rerank")
    src = make_gemma_family_reranker_dir(root, family)
    out = pack_from(src, root / "packed", model_id=f"tiny-{family}-reranker", version="1", fuse=False)
    want = CrossEncoder(str(src), local_files_only=True).predict([(QUERY, d) for d in DOCUMENTS])
    return family, src, out, want


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    return _pack("gemma", tmp_path_factory)


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    return _pack("gemma2", tmp_path_factory)


@pytest.fixture(scope="module", params=["gemma", "gemma2"])
def packed(request: pytest.FixtureRequest) -> Packed:
    value: Packed = request.getfixturevalue(request.param)
    return value


def _runtime(model: Path, backend: str) -> Runtime:
    return Runtime.start(Config(model_dir=model, backend=backend, warmup=False), environ={}, emit=None)


def _scores(reply: dict[str, Any]) -> tuple[np.ndarray, list[int]]:
    got = np.zeros(len(DOCUMENTS), np.float32)
    for item in reply["results"]:
        got[item["index"]] = item["relevance_score"]
    return got, [int(item["index"]) for item in reply["results"]]


def test_manifest_holds_flagembedding_prompt_and_both_backends(packed: Packed) -> None:
    family, src, out, _ = packed
    if family == "gemma":  # the released config.json's legacy value, read as tanh GELU by both sides
        assert json.loads((src / "config.json").read_text())["hidden_act"] == "gelu"
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["family"], manifest["task"], manifest["activation"]) == (family, "rerank", "sigmoid")
    assert set(manifest["backends"]) == set(BACKENDS) and manifest.get("unsupported_backends") is None
    pair = manifest["pair_template"]
    # <bos> rendered by the template and added by the tokenizer: left out of the prefix, one a row
    assert (pair["prefix"], pair["middle"], pair["suffix"]) == ("A: ", "\nB: ", "\n" + BGE_GEMMA_PROMPT)
    assert "instruction" not in pair  # the prompt is the template's own text: no system-message slot


@pytest.mark.parametrize("backend", BACKENDS)
def test_scores_equal_cross_encoder_predict(packed: Packed, backend: str, record_property: Any) -> None:
    family, _, out, want = packed
    runtime = _runtime(out, backend)
    reply = runtime.serve({"query": QUERY, "documents": DOCUMENTS})
    got, order = _scores(reply)
    diff = float(np.abs(got - want).max())
    record_property("parity", {"family": family, "backend": backend, "max_abs_diff": diff})
    assert diff < 1e-4, (family, backend, got, want)
    assert order == np.argsort(-want, kind="stable").tolist()
    assert reply["usage"]["tokens"] > 512  # the long document was truncated at 512
    assert float(np.ptp(want)) > 1e-3  # the documents' scores differ: the order means something
    with pytest.raises(InvalidInputError, match="without an instruction slot"):
        runtime.serve({"query": QUERY, "documents": DOCUMENTS, "instruction": "Find the code"})


def test_gemma2_caps_and_window_move_the_scores(gemma2: Packed) -> None:
    """The parity above covers Gemma 2's attention soft-capping, its final soft-capping and its sliding window
    (the graph's own per-layer masks): without each, CrossEncoder.predict's scores are not the same."""
    _, src, _, want = gemma2
    from sentence_transformers import CrossEncoder

    pairs = [(QUERY, d) for d in DOCUMENTS]
    changes = {}
    for what in ("attn_logit_softcapping", "final_logit_softcapping", "sliding_window"):
        model = CrossEncoder(str(src), local_files_only=True)
        lm = model.model
        assert lm is not None
        if what == "attn_logit_softcapping":  # read at construction, by each attention module
            assert lm.config.attn_logit_softcapping == GEMMA2_CAPS[what]
            for layer in lm.model.layers:
                layer.self_attn.attn_logit_softcapping = None
        elif what == "final_logit_softcapping":
            lm.config.final_logit_softcapping = None
        else:  # the masks are built from the config at each call
            lm.config.sliding_window = 4096
        changes[what] = float(np.abs(model.predict(pairs) - want).max())
    assert min(changes.values()) > 1e-2, changes


@pytest.fixture(scope="module")
def served(packed: Packed) -> Iterator[tuple[Runtime, Any]]:
    yield _runtime(packed[2], "onnx"), packed[3]


def test_rerank_routes_answer_in_predict_order(served: tuple[Runtime, Any]) -> None:
    """/invocations, Cohere's /v1/rerank and /v2/rerank, TEI's /rerank: CrossEncoder.predict's order."""
    from starlette.testclient import TestClient

    from handler.http_host.host import Host
    from handler.http_host.routes import create_app
    from handler.runtime.workers import Sizing, WorkerPool

    runtime, want = served
    order = np.argsort(-want, kind="stable").tolist()
    workers = WorkerPool(Sizing(min_workers=1, max_workers=2, max_queue=4), cpus=2)
    with TestClient(create_app(Host(lambda: runtime, workers, None))) as client:
        native = client.post("/invocations", json={"query": QUERY, "documents": DOCUMENTS})
        cohere = [client.post(p, json={"query": QUERY, "documents": DOCUMENTS}) for p in ("/v1/rerank", "/v2/rerank")]
        tei = client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS})
    for reply in (native, *cohere, tei):
        assert reply.status_code == 200, reply.text
    for reply in (native, *cohere):
        got, indices = _scores(reply.json())
        assert indices == order and np.abs(got - want).max() < 1e-4
    assert [r["index"] for r in tei.json()] == order
    assert max(abs(r["score"] - float(want[r["index"]])) for r in tei.json()) < 1e-4


def test_int8_passes_the_rerank_gate(packed: Packed, tmp_path: Path, record_property: Any) -> None:
    """`--quantize int8`: the ONNX graph's weights int8, packed only past the rerank gate (top-1 agreement and
    Spearman against float32 on the calibration pairs), its figures in the manifest; served in the same order."""
    from infra.pack.calibration import builtin_texts

    family, src, _, want = packed
    precision = Precision(quantize="int8", calibration=tuple(builtin_texts()[:64]))  # 64 pairs: a fast gate
    out = pack_from(
        src, tmp_path / "int8", model_id=f"tiny-{family}-int8", version="1", fuse=False, precision=precision
    )
    manifest = json.loads((out / "manifest.json").read_text())
    quality = manifest["precision"]["quality"]
    assert manifest["precision"]["quantization"] == "int8" and quality["passed"] is True, quality
    assert quality["figure"] == min(quality["top1_agreement"], quality["spearman"]) >= 0.9
    assert quality["items"] == 64
    got, _ = _scores(_runtime(out, "onnx").serve({"query": QUERY, "documents": DOCUMENTS}))
    record_property("int8", {"family": family, "gate": quality, "max_abs_diff": float(np.abs(got - want).max())})
    assert np.abs(got - want).max() < 0.05 and not np.array_equal(got, want), (got, want)


def _copy(src: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(src, tmp_path / "copy"))


def _edit_config(src: Path, **fields: Any) -> None:
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, **fields}))


def test_refusals_are_one_line(packed: Packed, tmp_path: Path) -> None:
    family, src, _, _ = packed
    copy = _copy(src, tmp_path)
    _edit_config(copy, use_bidirectional_attention=True)
    with pytest.raises(LMRerankError, match=f"use_bidirectional_attention is not supported for a {family} decoder"):
        read_source(copy)
    _edit_config(copy, use_bidirectional_attention=None)
    read_source(copy)  # back as it was: packs
    if family == "gemma":  # GemmaForCausalLM has no soft-capping: the field would be ignored
        _edit_config(copy, final_logit_softcapping=30.0)
        with pytest.raises(LMRerankError, match="final_logit_softcapping is not supported for a gemma decoder"):
            read_source(copy)
        _edit_config(copy, final_logit_softcapping=None)
    # Not a CrossEncoder with a LogitScore: the family's other tasks are not proved, so not packed
    (copy / "modules.json").unlink()
    prefix = "Gemma" if family == "gemma" else "Gemma2"
    for architecture, task, pooling in (("ForSequenceClassification", "rerank", None), ("Model", "embedding", "mean")):
        _edit_config(copy, architectures=[prefix + architecture])
        with pytest.raises(UnsupportedModelError, match=f"a {family} model packs only as a decoder reranker") as e:
            read_source(copy, task, pooling)
        assert "\n" not in str(e.value)


def test_the_hub_layout_is_refused_with_the_way_to_pack_it(packed: Packed, tmp_path: Path) -> None:
    """The causal LM as the hub has it (no modules.json: `--task auto` takes it for task generate) is refused in
    one line naming the CrossEncoder layout it packs from."""
    family, src, _, _ = packed
    base = src.parent / f"{family}-base"  # the plain causal LM the CrossEncoder directory was saved from
    architecture = json.loads((base / "config.json").read_text())["architectures"][0]
    with pytest.raises(UnsupportedModelError, match=f"{architecture} packs as a decoder reranker only") as e:
        pack_from(base, tmp_path / "out")
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()
