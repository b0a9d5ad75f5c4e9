"""`pack --quantize int8` and `--dtype float16|bfloat16`: tiny random models packed in reduced precision, the
quality gate (passing, refusing with the figure in the message and nothing written), the manifest's
`precision` entry, the init report, and served answers close to the float32 pack's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.core.manifest import load_manifest
from infra.pack.hf_pack import pack_from
from infra.pack.precision import Precision, PrecisionError
from infra.pack.quality import QualityError, shown
from tests.conftest import ROOT, start
from tests.test_parity import cosine
from tests.tiny_models import make_model_dir

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning")

MAX_SEQ = 16
TEXTS = ["hello world", "", "東京 🚀 emoji", "the quick brown fox " * 10, "a", "what is the capital of france"]
# A small calibration set keeps the packs fast; the built-in set is checked in tests/unit/test_quality.py.
CALIBRATION = (*TEXTS, "paris", "berlin is the capital of germany", "12345", "    ", "machine learning")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Path]]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cache: dict[str, Path] = {}

    def make(kind: str) -> Path:
        if kind not in cache:
            cache[kind] = make_model_dir(tmp_path_factory.mktemp(kind), "bert", kind, max_seq_length=MAX_SEQ)
        return cache[kind]

    yield make


@pytest.fixture(scope="module")
def packed(sources: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Path]]:
    cache: dict[str, Path] = {}

    def make(kind: str, **precision: Any) -> Path:
        key = f"{kind}|{sorted(precision.items())}"
        if key not in cache:
            out = tmp_path_factory.mktemp("packed") / "model"
            options = Precision(calibration=CALIBRATION, **precision) if precision else None
            cache[key] = pack_from(sources(kind), out, precision=options)
        return cache[key]

    yield make


def embeddings(model: Path, backend: str | None = None) -> np.ndarray:
    runtime = start(model, backend)
    return np.asarray(runtime.handle({"inputs": TEXTS}, None)["embeddings"], np.float32)


def test_int8_pack_serves_close_to_float32_and_records_the_gate(packed: Callable[..., Path]) -> None:
    model = packed("sentence-transformers", quantize="int8", min_quality=0.9)
    manifest = load_manifest(model)
    assert sorted(manifest.backends) == ["onnx"]
    assert "int8" in manifest.unsupported_backends["torch"]
    precision = manifest.raw["precision"]
    assert precision["dtype"] == "float32" and precision["quantization"] == "int8"
    quality = precision["quality"]
    assert quality["metric"] == "min cosine vs float32" and quality["items"] == len(CALIBRATION)
    assert quality["passed"] is True and quality["min_quality"] == 0.9
    assert quality["figure"] == quality["min_cosine"] <= quality["p1_cosine"] <= quality["median_cosine"] <= 1.0
    assert quality["worst_text"] in {shown(t) for t in CALIBRATION}  # the gate's worst text: a figure users see
    assert "retrieval_top1_agreement" not in quality  # a user's --calibration holds no retrieval set
    assert manifest.backends["onnx"]["quantization"]["operator"] == "MatMulIntegerToFloat"
    import onnx

    graph = onnx.load(str(model / "model.onnx"), load_external_data=False)
    weights = {t.name for t in graph.graph.initializer}
    assert any(n.op_type == "MatMulIntegerToFloat" for n in graph.graph.node)
    # every MatMul by a weight quantized (no Dense head here) but the groups the search kept float32 (named by
    # their activation input, in the record); query x key and probs x value stay MatMul
    search = manifest.backends["onnx"]["quantization"]["search"]
    assert search["full_min_cosine"]  # the all-int8 graph was run on every text first
    floats = {n.input[0] for n in graph.graph.node if n.op_type == "MatMul" and n.input[1] in weights}
    assert floats == set(search["kept_float"])
    # (the tiny vocabulary is below quantize.MIN_TABLE_ROWS: its table stays float; tests/unit/test_quality.py)
    ours = embeddings(model)
    want = embeddings(packed("sentence-transformers"), "onnx")
    sims = cosine(ours, want)
    assert sims.min() >= 0.99, sims  # the served answers, not only the pack-time figure
    assert not np.array_equal(ours, want)  # really the quantized graph


# A whole graph serialized is what fails past protobuf's 2 GB (Qwen3-Embedding-0.6B's float32 graph is 2.4 GB: the int8
# pack died in onnx.checker there). At tiny sizes, any serialization of a graph holding its weights stands for it.
WHOLE_GRAPH_BYTES = 200_000  # the tiny Qwen3's weights are ~0.9 MB; a graph with its weights moved out is ~40 KB


def test_int8_pack_of_a_decoder_never_serializes_the_whole_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnx

    from bench.pack.models import qwen3_embedder
    from tests.functional.test_own_model_families import QWEN3_TINY

    src = qwen3_embedder(
        tmp_path / "qwen3-embedding-tiny", max_seq_length=MAX_SEQ, **{**QWEN3_TINY, "vocab_size": 3000}
    )
    serialize = onnx.ModelProto.SerializeToString

    def bounded(self: Any, *args: Any, **kwargs: Any) -> bytes:
        if self.ByteSize() > WHOLE_GRAPH_BYTES:
            raise AssertionError(f"a graph of {self.ByteSize():,} bytes serialized whole (past 2 GB this fails)")
        return serialize(self, *args, **kwargs)

    monkeypatch.setattr(onnx.ModelProto, "SerializeToString", bounded)
    model = pack_from(src, tmp_path / "int8", precision=Precision(quantize="int8", calibration=CALIBRATION))
    monkeypatch.undo()
    precision = load_manifest(model).raw["precision"]
    assert precision["quantization"] == "int8" and precision["quality"]["passed"] is True
    graph = onnx.load(str(model / "model.onnx"), load_external_data=False)
    ops = {n.op_type for n in graph.graph.node}
    assert "MatMulIntegerToFloat" in ops
    assert any(t.name.endswith("_int8") and t.data_type == onnx.TensorProto.INT8 for t in graph.graph.initializer)
    ours = embeddings(model)
    want = embeddings(pack_from(src, tmp_path / "float32", backends=["onnx"]), "onnx")
    kept = np.linalg.norm(want, axis=1) > 0  # the empty text is a zero vector in float32 and int8 alike
    assert np.array_equal(ours[~kept], want[~kept])
    sims = cosine(ours[kept], want[kept])
    assert sims.min() >= 0.99, sims
    assert not np.array_equal(ours, want)


PRECISIONS = [{}, {"quantize": "int8"}, {"quantize": "int8-block"}, {"dtype": "bfloat16"}, {"dtype": "float16"}]


@pytest.mark.parametrize("precision", PRECISIONS, ids=lambda p: next(iter(p.values()), "float32"))
def test_a_texts_answer_does_not_depend_on_its_batch_mates(packed: Callable[..., Path], precision: Any) -> None:
    """With dynamic batching a request's batch-mates are other users' texts: each text alone and inside the
    batch (with a long text and repetition beside it) agree at cosine >= 0.9999 in every precision (int8-dynamic,
    one activation scale per tensor, measured 0.964 on MiniLM: it is refused)."""
    model = packed("sentence-transformers", **({**precision, "min_quality": 0.9} if precision else {}))
    runtime = start(model)
    batch = [*TEXTS, "zebra " * 40, "!!!!!!!! ???? 9999999"]
    together = np.asarray(runtime.handle({"inputs": batch}, None)["embeddings"], np.float32)
    alone = np.concatenate([np.asarray(runtime.handle({"inputs": [t]}, None)["embeddings"], np.float32) for t in batch])
    kept = np.linalg.norm(alone, axis=1) > 0  # the empty text: a zero vector alone and in a batch alike
    assert np.array_equal(np.linalg.norm(together, axis=1) > 0, kept)
    sims = cosine(alone[kept], together[kept])
    assert sims.min() >= 0.9999, sims


def test_the_init_report_and_status_show_precision(packed: Callable[..., Path]) -> None:
    model = packed("sentence-transformers", quantize="int8", min_quality=0.9)
    lines: list[dict[str, Any]] = []
    from handler.core.config import Config
    from handler.runtime.invocation import Runtime

    Runtime.start(Config(model_dir=model, backend=None, warmup=True), environ={}, emit=lines.append)
    shown = lines[0]["precision"]
    assert shown["quantization"] == "int8" and shown["dtype"] == "float32"
    assert shown["quality"]["figure"] == load_manifest(model).raw["precision"]["quality"]["figure"]
    float_pack = packed("sentence-transformers")
    Runtime.start(Config(model_dir=float_pack, backend=None, warmup=True), environ={}, emit=lines.append)
    assert lines[-1]["precision"] == {"dtype": "float32", "quantization": None}


def test_two_precisions_of_one_model_are_served_side_by_side_and_chosen_by_name(
    packed: Callable[..., Path],
) -> None:
    """The float32 and int8 packs of one directory are two id@versions (they were one, and init refused the
    pair as "configured twice"): one function serves both, each request choosing by name."""
    from handler.core.config import Config
    from handler.runtime.invocation import Runtime

    float_pack, int8_pack = (
        packed("sentence-transformers"),
        packed("sentence-transformers", quantize="int8", min_quality=0.9),
    )
    full, small = load_manifest(float_pack), load_manifest(int8_pack)
    assert full.id == small.id and small.version.endswith("-int8") and full.key != small.key
    env = {"WARMSTART_MODEL": str(float_pack), "WARMSTART_MODELS": str(int8_pack), "WARMSTART_WARMUP": "0"}
    runtime = Runtime.start(Config.from_environ(env), environ=env, emit=None)
    default = runtime.handle({"inputs": TEXTS})
    chosen = runtime.handle({"inputs": TEXTS, "model": small.key})
    named = runtime.handle({"inputs": TEXTS, "model": full.key})
    assert (default["model"], chosen["model"], named["model"]) == (full.key, small.key, full.key)
    sims = cosine(np.asarray(chosen["embeddings"], np.float32), np.asarray(default["embeddings"], np.float32))
    assert sims.min() >= 0.9


def test_the_gate_refuses_below_min_quality_with_the_figure_and_writes_nothing(
    sources: Callable[[str], Path], tmp_path: Path
) -> None:
    out = tmp_path / "refused"
    cal = tmp_path / "cal.txt"
    cal.write_text("\n".join(CALIBRATION) + "\n")
    cmd = [sys.executable, "-m", "infra.cli", "pack", "--from", str(sources("sentence-transformers"))]
    cmd += ["--out", str(out), "--quantize", "int8", "--min-quality", "0.99999999", "--calibration", str(cal)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    assert "quality 0." in done.stderr and "below --min-quality 0.99999999" in done.stderr, done.stderr
    assert "min cosine vs float32" in done.stderr and "nothing was written" in done.stderr
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal.txt"]  # no staging directory left beside it


def test_the_gate_compares_the_measured_figure_with_the_threshold(
    packed: Callable[..., Path], sources: Callable[[str], Path], tmp_path: Path
) -> None:
    passed = load_manifest(packed("sentence-transformers", quantize="int8", min_quality=0.9))
    figure = passed.raw["precision"]["quality"]["figure"]
    assert figure < 1.0  # the quantized graph really differs
    # The sensitivity search aims at the threshold asked for (more groups kept float32 for a higher one), so the
    # refusal is asked of a threshold no int8 graph reaches: its embedding tables stay int8
    with pytest.raises(QualityError, match=r"--quantize int8: quality 0\.\d{6} \(min cosine vs float32\) is below"):
        pack_from(
            sources("sentence-transformers"),
            tmp_path / "out",
            precision=Precision(quantize="int8", calibration=CALIBRATION, min_quality=1.0),
        )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_torch_dtype_pack_serves_close_to_float32(packed: Callable[..., Path], dtype: str) -> None:
    model = packed("sentence-transformers", dtype=dtype)
    manifest = load_manifest(model)
    assert sorted(manifest.backends) == ["torch"]
    assert "ONNX graphs are packed float32 or int8 only" in manifest.unsupported_backends["onnx"]
    assert manifest.backends["torch"]["dtype"] == dtype
    assert manifest.raw["precision"]["dtype"] == dtype and manifest.raw["precision"]["quality"]["passed"]
    header = json.loads(
        (model / "model.safetensors").read_bytes()[8:][
            : int.from_bytes((model / "model.safetensors").read_bytes()[:8], "little")
        ]
    )
    stored = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    assert {"BF16" if dtype == "bfloat16" else "F16"} <= stored and "F32" not in stored
    sims = cosine(embeddings(model), embeddings(packed("sentence-transformers"), "torch"))
    assert sims.min() >= 0.99, sims


def test_onnx_in_float16_is_refused_when_asked(sources: Callable[[str], Path], tmp_path: Path) -> None:
    with pytest.raises(PrecisionError, match=r"--dtype float16 with backend onnx: ONNX graphs are packed float32"):
        pack_from(sources("sentence-transformers"), tmp_path / "out", backends=["onnx"], precision=Precision("float16"))
    with pytest.raises(PrecisionError, match=r"--quantize int8 with backend torch"):
        pack_from(
            sources("sentence-transformers"), tmp_path / "out", backends=["torch"], precision=Precision(quantize="int8")
        )
    assert not (tmp_path / "out").exists()


def test_rerank_and_classify_gates_record_their_own_figures(packed: Callable[..., Path]) -> None:
    rerank = load_manifest(packed("cross-encoder", quantize="int8", min_quality=0.0)).raw["precision"]["quality"]
    assert rerank["metric"].startswith("min(top-1 agreement, Spearman)")
    assert rerank["figure"] == min(rerank["top1_agreement"], rerank["spearman"])
    assert rerank["items"] == 8 * 8  # `pairs`: 8 queries at least (of 9 non-empty texts), 8 documents each
    classify = load_manifest(packed("classifier", quantize="int8", min_quality=0.0)).raw["precision"]["quality"]
    assert classify["metric"] == "label agreement vs float32"
    assert 0.0 <= classify["label_agreement"] == classify["figure"] <= 1.0


def test_an_int8_pack_of_8_bit_weights_is_refused_on_an_x86_cpu_without_an_int32_dot_product(
    packed: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLAS without VNNI/AMX adds u8 x s8 pairs in int16 and saturates on 8-bit weights: the answers would not be
    the ones the gate measured (on this VNNI host they are), so init refuses, naming the CPU features."""
    from handler.backends import fingerprint
    from handler.core.errors import ModelLoadError

    model = packed("sentence-transformers", quantize="int8", min_quality=0.9)
    quantization = load_manifest(model).backends["onnx"]["quantization"]
    assert quantization["operator"] == "MatMulIntegerToFloat" and quantization["weight_bits"] == 8
    monkeypatch.setattr(os, "uname", lambda: os.uname_result(("Linux", "h", "6", "1", "x86_64")))
    monkeypatch.setattr(fingerprint, "cpu_flags", lambda cpuinfo=None: {"sse4_2", "avx", "avx2", "fma"})
    with pytest.raises(ModelLoadError, match=r"8-bit weights need an x86 CPU with avx512_vnni or avx_vnni or amx_int8"):
        start(model, "onnx")
    monkeypatch.setattr(fingerprint, "cpu_flags", lambda cpuinfo=None: {"avx2", "avx512_vnni"})
    assert len(start(model, "onnx").handle({"inputs": ["served"]}, None)["embeddings"]) == 1


def test_an_int8_pack_is_pre_optimized_without_saved_prepacked_weights(
    packed: Callable[..., Path], tmp_path: Path
) -> None:
    """`warmstart optimize` on an int8 pack: ORT 1.31.1 crashed (SIGSEGV) running a saved model whose
    MatMulIntegerToFloat weights were saved prepacked, so those are not saved (the float paths' casts are still
    folded once, at pack time); the optimized model is proved bit-identical and served. In a child process: a
    crash fails this test instead of the run."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(packed("sentence-transformers", quantize="int8", min_quality=0.9), model)
    portable = embeddings(model, "onnx")
    code = "import sys, pathlib; from infra.pack.optimize import optimize; optimize(pathlib.Path(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", code, str(model)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    entry = load_manifest(model).backends["onnx"]["optimized"]
    assert entry["prepacked"] is False and entry["bit_identical_probes"] >= 1
    runtime = start(model, "onnx")
    assert runtime.init_report["coldstart"]["onnx_optimized"]["used"] is True
    np.testing.assert_array_equal(
        np.asarray(runtime.handle({"inputs": TEXTS}, None)["embeddings"], np.float32), portable
    )


def test_the_c_api_and_the_binding_answer_an_int8_pack_bit_identically(packed: Callable[..., Path]) -> None:
    """The onnx backend runs the CPU session through ONNX Runtime's C API (handler.backends.ort_capi); the
    int8 graph answers as through the Python binding, bit for bit."""
    from handler.core.config import Config
    from handler.runtime.invocation import Runtime

    model = packed("sentence-transformers", quantize="int8", min_quality=0.9)
    runtimes = {
        api: Runtime.start(Config(model_dir=model, backend="onnx", warmup=False), environ=env, emit=None)
        for api, env in (("c", {}), ("python", {"WARMSTART_ORT_CAPI": "0"}))
    }
    for api, runtime in runtimes.items():
        assert runtime.init_report["coldstart"]["onnx_api"]["used"] == api
    for texts in (TEXTS[3:4], [f"{t} {i}" for i, t in enumerate(TEXTS * 6)][:32]):  # batch 1 and 32, padded
        c, py = (np.asarray(r.handle({"inputs": texts}, None)["embeddings"], np.float32) for r in runtimes.values())
        assert c.shape[0] == len(texts) and np.array_equal(c, py)
