"""Every retrieval kind against fastembed serving the same weights, one run, interleaved, under a 1 vCPU quota.

    PYTHONPATH=$PWD .venv/bin/python bench/peers/retrieval.py [--kinds sparse,colbert,images,hybrid,rerank]
        [--rounds 3] [--b1-calls 10] [--b32-calls 2] [--evict] [--work build/bench/retrieval] [--out DIR]

Root (cgroup v1 `cpu` quota). Nothing is downloaded: each kind is a real model's shape with random weights,
packed by `pack_from` (ONNX) for ours and handed to fastembed 0.9.1 (installed --no-deps beside
onnxruntime-gpu) from a local directory (`specific_model_path`, or `add_custom_model` where fastembed has no
entry of that shape):

  sparse   SPLADE: a BERT MLM of all-MiniLM-L6-v2's shape (6 layers, hidden 384, vocabulary 30,522) as a
           SparseEncoder; fastembed SparseTextEmbedding (prithivida/Splade_PP_en_v1's pipeline) on its MLM graph
  colbert  answerai-colbert-small-v1's shape (12 layers, hidden 384, 96-wide vectors); fastembed
           LateInteractionTextEmbedding on our packed graph (documents)
  images   a CLIP of ViT-S/32 shape (vision: 12 layers, hidden 384, patch 32, 224 px; text: 4 layers, hidden 256);
           fastembed ImageEmbedding (Qdrant/clip-ViT-B-32-vision's pipeline) on our image graph, 640x480 JPEGs
  hybrid   bge-m3's layout (XLM-R with its 250,002-row vocabulary at MiniLM's width and depth: 6 layers, hidden
           384; sparse_linear and colbert_linear heads), task hybrid; fastembed has no sparse or multi-vector
           head for it: its TextEmbedding.add_custom_model (CLS pooling, normalized) serves the dense output of the
           same weights (an export of the XLM-R encoder alone). `ours-3heads` asks for all three outputs.
  rerank   a Qwen3-Reranker-shaped decoder (Qwen3-Reranker-0.6B's layer shape and 151,669-row vocabulary, 2 layers
           instead of 28; LogitScore head) packed as task rerank, against sentence-transformers' CrossEncoder on the
           same directory (the reference: the same weights); fastembed has no decoder reranker, so
           `fastembed-ce` is its TextCrossEncoder.add_custom_model serving an XLM-R cross-encoder of
           bge-reranker-v2-m3's layer shape and vocabulary, 2 layers (a different model of comparable size: its
           figures say what fastembed's reranker path costs, not the same answer; its scores are checked against
           transformers on its own weights)

Before any timing, each side is started once (the page cache warmed) and the pairs' answers compared (max abs
difference printed); a pair beyond its tolerance is refused, not timed. Then per round, kind by kind, the sides in
an order rotated each round: each side one child in its own cgroup with a 1 vCPU quota (`runner.Quota`),
spawn -> first answer to one input (cold; its CPU time and peak RSS read then), then untimed warm-up calls and,
the sides asked in turn, a block of batch-1 calls and a block of batch-32 calls (one intra-op thread each; block
medians of wall and CPU time per call), then the peak RSS after warm calls. `--evict`: each round, first one more
start of each side with its model's files (and the images) evicted from the page cache (`runner.evict`; Python
and the libraries stay cached). Writes runs.json and results.md.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import runner  # noqa: E402
from bench.peers.driver import SENTENCES  # noqa: E402

KINDS = ("sparse", "colbert", "images", "hybrid", "rerank")
SIDES: dict[str, tuple[str, ...]] = {
    "sparse": ("ours", "fastembed"),
    "colbert": ("ours", "fastembed"),
    "images": ("ours", "fastembed"),
    "hybrid": ("ours", "ours-3heads", "fastembed"),
    "rerank": ("ours", "cross-encoder", "fastembed-ce"),
}
# Pairs whose answers must agree before they are timed: (a, b, tolerance on the max abs difference).
PARITY: dict[str, tuple[tuple[str, str, float], ...]] = {
    "sparse": (("ours", "fastembed", 1e-4),),
    "colbert": (("ours", "fastembed", 1e-4),),
    "images": (("ours", "fastembed", 1e-4),),  # each decodes and resizes the JPEG itself: the same pixels
    "hybrid": (("ours", "fastembed", 1e-4), ("ours-3heads", "fastembed", 1e-4)),
    "rerank": (("ours", "cross-encoder", 1e-4), ("fastembed-ce", "reference", 1e-4)),
}
# The figures' ratios: (numerator, denominator).
RATIOS: dict[str, tuple[tuple[str, str], ...]] = {
    "sparse": (("ours", "fastembed"),),
    "colbert": (("ours", "fastembed"),),
    "images": (("ours", "fastembed"),),
    "hybrid": (("ours", "fastembed"), ("ours-3heads", "fastembed")),
    "rerank": (("ours", "cross-encoder"), ("ours", "fastembed-ce")),
}
MARK = "retrieval-bench:"
QUERY = "what is a cold start?"
# fastembed's sessions on the CPU alone: onnxruntime-gpu here would try CUDA first (a failed load at each start
# that a CPU-only install of fastembed never makes).
CPU = ["CPUExecutionProvider"]
CUSTOM = {"hybrid": "warmstart-bench/bge-m3-shaped-random", "rerank": "warmstart-bench/xlmr-cross-encoder-random"}


# --- pure (tests/unit/test_bench_retrieval.py) ---------------------------------------------------------------


def max_diff(kind: str, a: Sequence[Any], b: Sequence[Any]) -> float:
    """The largest absolute difference between two sides' answers to the parity inputs; inf where they differ in
    shape (another number of rows, tokens or vector widths; other sparse terms)."""
    import numpy as np

    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        if kind == "sparse":
            if list(x["indices"]) != list(y["indices"]):
                return math.inf
            x, y = x["values"], y["values"]
        xa, ya = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        if xa.shape != ya.shape:
            return math.inf
        if xa.size:
            worst = max(worst, float(np.abs(xa - ya).max()))
    return worst


def figures(rows: Sequence[dict[str, Any]], kind: str) -> str:
    """One kind's table: each side's medians (min-max) and the ratios of `RATIOS`, taken within each round."""
    sides, pairs = SIDES[kind], RATIOS[kind]
    pick = [r for r in rows if r["kind"] == kind]
    measures = (
        ("cold start, spawn -> first answer (ms)", "cold_ms", 0),
        ("CPU time of that start (ms)", "cold_cpu_ms", 0),
        ("cold start, the model's files evicted (ms)", "evicted_ms", 0),
        ("CPU time of the evicted start (ms)", "evicted_cpu_ms", 0),
        ("peak RSS at the first answer (MB)", "cold_rss_mb", 0),
        ("warm batch 1 (ms)", "b1_ms", 1),
        ("warm batch 1, CPU (ms)", "b1_cpu_ms", 1),
        ("warm batch 32 (ms)", "b32_ms", 0),
        ("warm batch 32, CPU (ms)", "b32_cpu_ms", 0),
        ("peak RSS after the warm calls (MB)", "warm_rss_mb", 0),
    )
    header = ["", *sides, *(f"{a} / {b}" for a, b in pairs)]
    body = []
    for label, key, digits in measures:
        if not any(key in r for r in pick):
            continue  # not measured in this run (--evict not given)
        cells = [runner.Stat.of(r[key] for r in pick if r["side"] == s and key in r).fmt(digits) for s in sides]
        have = [r for r in pick if key in r]
        cells += [runner.fmt_ratio(runner.ratios(have, key, a, b, by="side")) for a, b in pairs]
        body.append([label, *cells])
    return runner.table(header, body)


# --- builds (parent) -------------------------------------------------------------------------------------


def _export(model: Any, inputs: dict[str, Any], outputs: list[str], path: Path) -> None:
    import torch

    class ByName(torch.nn.Module):  # keyword arguments: the models' forward takes more than these positionally
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]

    names = list(inputs)
    with torch.no_grad():
        torch.onnx.export(
            ByName().eval(), tuple(inputs.values()), str(path), input_names=names, output_names=outputs,
            dynamic_axes={n: {0: "b", 1: "s"} for n in (*names, *outputs)}, opset_version=17, dynamo=False,
        )  # fmt: skip


def build_sparse(work: Path) -> dict[str, str]:
    from bench.peers.sparse import build

    packed, fe = build(work)
    return {"packed": str(packed), "fastembed": str(fe)}


def build_colbert(work: Path) -> dict[str, str]:
    import transformers
    from safetensors.torch import load_file, save_file

    from bench.peers.colbert_serve import SHAPE, fastembed_dir
    from infra.pack.hf_pack import pack_from
    from tests.colbert_models import make_colbert_dir

    src = make_colbert_dir(work / "src", shape=SHAPE, dimension=96, query_length=32, document_length=180)
    # fastembed's ColBERT puts ids 1 and 2 after CLS as the markers (a real ColBERT's [unused0], [unused1]: the
    # rows "[Q] " and "[D] " are saved to); the tests' tokenizer added them at its end instead, so rows 1 and 2
    # get the markers' weights: both sides then feed the same vectors.
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(src), local_files_only=True)
    weights = load_file(str(src / "model.safetensors"))
    table = next(k for k in weights if k.endswith("word_embeddings.weight"))
    for row, marker in ((1, "[Q] "), (2, "[D] ")):
        weights[table][row] = weights[table][tokenizer.convert_tokens_to_ids(marker)]
    save_file(weights, str(src / "model.safetensors"), metadata={"format": "pt"})
    packed = pack_from(src, work / "packed", backends=("onnx",), force=True)
    return {"packed": str(packed), "fastembed": str(fastembed_dir(src, packed, work / "fastembed"))}


def build_images(work: Path) -> dict[str, str]:
    import transformers

    from bench.peers.images import CLIP_PREPROCESSOR, fastembed_side
    from infra.pack.image_pack import pack_image_text
    from tests.image_models import SPECIALS
    from tests.tiny_models import _bert_tokenizer

    source = work / "clip"
    tok, vocab = _bert_tokenizer(SPECIALS, "[CLS]", "[SEP]", False)
    vision = {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6, "intermediate_size": 1536}
    text = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024}
    config = transformers.CLIPConfig(
        text_config={**text, "eos_token_id": vocab["[SEP]"]},
        vision_config={**vision, "patch_size": 32, "image_size": 224},
        projection_dim=256,
    )
    transformers.CLIPModel(config).save_pretrained(source)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]").save_pretrained(source)
    (source / "preprocessor_config.json").write_text(json.dumps(CLIP_PREPROCESSOR))
    pack = pack_image_text(source, work / "packed", force=True)
    fe, images = fastembed_side(source, pack, work)
    return {"packed": str(pack), "fastembed": str(fe), "images": str(images)}


def _xlmr(**sizes: Any) -> tuple[Any, Any]:
    """The tests' XLM-R unigram tokenizer (512 tokens) and a config of `sizes` over XLM-R's vocabulary."""
    import transformers

    from tests.tiny_models import build_tokenizer

    tokenizer, _ = build_tokenizer("xlm-roberta", 512)
    config = transformers.XLMRobertaConfig(
        vocab_size=250002, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1, **sizes
    )
    return tokenizer, config


def build_hybrid(work: Path) -> dict[str, str]:
    import torch
    import transformers

    from infra.pack.hf_pack import pack_from

    src, fe = work / "src", work / "fastembed"
    tokenizer, config = _xlmr(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    torch.manual_seed(0)
    model = transformers.XLMRobertaModel(config, add_pooling_layer=False).eval()
    model.save_pretrained(src)
    tokenizer.save_pretrained(src)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (src / "modules.json").write_text(json.dumps(modules))
    (src / "1_Pooling").mkdir()
    (src / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 384, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    )
    (src / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512, "do_lower_case": False}))
    sparse, colbert = torch.nn.Linear(384, 1), torch.nn.Linear(384, 384)  # bge-m3's: colbert keeps the width
    torch.save(sparse.state_dict(), src / "sparse_linear.pt")
    torch.save(colbert.state_dict(), src / "colbert_linear.pt")
    packed = pack_from(src, work / "packed", backends=("onnx",), force=True)
    fe.mkdir()
    tokenizer.save_pretrained(fe)
    config.save_pretrained(fe)
    ids = torch.tensor([[0, 5, 6, 2]])
    _export(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, ["last_hidden_state"], fe / "model.onnx")
    return {"packed": str(packed), "fastembed": str(fe)}


def build_rerank(work: Path) -> dict[str, str]:
    import torch
    import transformers

    from infra.pack.hf_pack import pack_from
    from tests.lm_rerankers import make_reranker_dir

    sizes = {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128}
    sizes |= {"intermediate_size": 3072, "num_hidden_layers": 2, "max_position_embeddings": 40960}
    source = make_reranker_dir(work, scale=1.0, vocab_rows=151669, **sizes)
    packed = pack_from(source, work / "packed", model_id="lm-reranker", version="1", backends=("onnx",), force=True)
    fe = work / "fastembed-ce"
    tokenizer, config = _xlmr(
        hidden_size=1024, num_hidden_layers=2, num_attention_heads=16, intermediate_size=4096, num_labels=1
    )
    torch.manual_seed(0)
    model = transformers.XLMRobertaForSequenceClassification(config).eval()
    fe.mkdir()
    tokenizer.save_pretrained(fe)
    config.save_pretrained(fe)
    ids = torch.tensor([[0, 5, 6, 2, 2, 7, 2]])
    _export(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, ["logits"], fe / "model.onnx")
    batch = tokenizer([QUERY] * 4, SENTENCES[:4], padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        want = model(**batch).logits[:, 0].tolist()
    (fe / "reference.json").write_text(json.dumps(want))  # transformers' scores: what fastembed must answer
    return {"packed": str(packed), "source": str(source), "fastembed": str(fe)}


BUILDS: dict[str, Callable[[Path], dict[str, str]]] = {
    "sparse": build_sparse,
    "colbert": build_colbert,
    "images": build_images,
    "hybrid": build_hybrid,
    "rerank": build_rerank,
}


def build(kind: str, work: Path) -> dict[str, str]:
    """The kind's directories, built once (kept while their index file is there)."""
    work = work.resolve()  # the children run from the repository root
    done = work / kind / "built.json"
    if done.is_file():
        paths: dict[str, str] = json.loads(done.read_text())
        return paths
    shutil.rmtree(work / kind, ignore_errors=True)
    (work / kind).mkdir(parents=True)
    started = time.perf_counter()
    paths = BUILDS[kind](work / kind)
    done.write_text(json.dumps(paths))
    print(f"{kind}: built in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return paths


# --- the child: one side of one kind in one process ---------------------------------------------------------


def _ours(kind: str, side: str, paths: dict[str, str]) -> tuple[Callable[[int], Any], Callable[[int], list[Any]]]:
    from handler.core.config import Config
    from handler.runtime.invocation import Runtime

    rt = Runtime.start(Config(model_dir=Path(paths["packed"]), backend="onnx", threads=1, warmup=False), {}, None)
    if kind == "images":
        data = [base64.b64encode(p.read_bytes()).decode() for p in sorted(Path(paths["images"]).glob("*.jpg"))]
        return (
            lambda n: rt.serve({"inputs": data[:n], "modality": "image"}),
            lambda n: rt.serve({"inputs": data[:n], "modality": "image"})["embeddings"],
        )
    if kind == "rerank":

        def scores(n: int) -> list[Any]:
            got = [0.0] * n
            for item in rt.serve({"query": QUERY, "documents": SENTENCES[:n]})["results"]:
                got[item["index"]] = item["relevance_score"]
            return got

        return lambda n: rt.serve({"query": QUERY, "documents": SENTENCES[:n]}), scores
    if side == "ours-3heads":
        three = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
        return (
            lambda n: rt.serve({"inputs": SENTENCES[:n], **three}),
            lambda n: rt.serve({"inputs": SENTENCES[:n], **three})["dense_vecs"],
        )
    return lambda n: rt.serve({"inputs": SENTENCES[:n]}), lambda n: rt.serve({"inputs": SENTENCES[:n]})["embeddings"]


def _fastembed(kind: str, paths: dict[str, str]) -> tuple[Callable[[int], Any], Callable[[int], list[Any]]]:
    fe = paths["fastembed"]
    if kind == "sparse":
        from fastembed import SparseTextEmbedding

        sp = SparseTextEmbedding("prithivida/Splade_PP_en_v1", specific_model_path=fe, threads=1, providers=CPU)
        return (
            lambda n: list(sp.embed(SENTENCES[:n], batch_size=n)),
            lambda n: [{"indices": e.indices.tolist(), "values": e.values.tolist()} for e in sp.embed(SENTENCES[:n])],
        )
    if kind == "colbert":
        from fastembed import LateInteractionTextEmbedding

        li = LateInteractionTextEmbedding(
            "answerdotai/answerai-colbert-small-v1", specific_model_path=fe, threads=1, providers=CPU
        )
        return lambda n: list(li.embed(SENTENCES[:n], batch_size=n)), lambda n: list(li.embed(SENTENCES[:n]))
    if kind == "images":
        from fastembed import ImageEmbedding

        im = ImageEmbedding("Qdrant/clip-ViT-B-32-vision", specific_model_path=fe, threads=1, providers=CPU)
        files = [str(p) for p in sorted(Path(paths["images"]).glob("*.jpg"))]
        return lambda n: list(im.embed(files[:n], batch_size=n)), lambda n: list(im.embed(files[:n]))
    if kind == "hybrid":
        from fastembed import TextEmbedding
        from fastembed.common.model_description import ModelSource, PoolingType

        TextEmbedding.add_custom_model(
            CUSTOM[kind], pooling=PoolingType.CLS, normalization=True, sources=ModelSource(hf=CUSTOM[kind]),
            dim=384, model_file="model.onnx",
        )  # fmt: skip
        te = TextEmbedding(CUSTOM[kind], specific_model_path=fe, threads=1, providers=CPU)
        return lambda n: list(te.embed(SENTENCES[:n], batch_size=n)), lambda n: list(te.embed(SENTENCES[:n]))
    from fastembed.common.model_description import ModelSource
    from fastembed.rerank.cross_encoder import TextCrossEncoder

    TextCrossEncoder.add_custom_model(
        CUSTOM["rerank"], sources=ModelSource(hf=CUSTOM["rerank"]), model_file="model.onnx"
    )
    ce = TextCrossEncoder(CUSTOM["rerank"], specific_model_path=fe, threads=1, providers=CPU)
    return (
        lambda n: list(ce.rerank(QUERY, SENTENCES[:n], batch_size=n)),
        lambda n: list(ce.rerank(QUERY, SENTENCES[:n])),
    )


def _cross_encoder(paths: dict[str, str]) -> tuple[Callable[[int], Any], Callable[[int], list[Any]]]:
    import torch
    from sentence_transformers import CrossEncoder

    torch.set_num_threads(1)  # one intra-op thread, as the other sides
    ce = CrossEncoder(paths["source"], local_files_only=True)

    def predict(n: int) -> Any:
        return ce.predict([(QUERY, d) for d in SENTENCES[:n]], batch_size=32)

    return predict, lambda n: [float(s) for s in predict(n)]


def _plain(x: Any) -> Any:
    """An answer as JSON: numpy arrays and scalars as lists and floats."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    return x.tolist() if hasattr(x, "tolist") else x


def child(kind: str, side: str, paths: dict[str, str]) -> int:
    """Load, answer one input (the cold start's answer), then serve the parent's JSON-line requests."""
    if side.startswith("ours"):
        call, answer = _ours(kind, side, paths)
    elif side == "cross-encoder":
        call, answer = _cross_encoder(paths)
    else:
        call, answer = _fastembed(kind, paths)
    call(1)

    def emit(payload: dict[str, Any]) -> None:
        sys.stdout.write(MARK + json.dumps(payload) + "\n")
        sys.stdout.flush()

    emit({"cpu_ms": time.process_time() * 1000})
    for line in sys.stdin:
        ask = json.loads(line)
        if "parity" in ask:
            emit({"answer": _plain(answer(int(ask["parity"])))})
        elif "warmup" in ask:  # arenas, caches: not what a warm call costs
            for n in (1, 1, 32):
                call(n)
            emit({})
        else:
            ms, cpu = [], []
            for _ in range(int(ask["calls"])):
                t0, c0 = time.perf_counter(), time.process_time()
                call(int(ask["batch"]))
                ms.append((time.perf_counter() - t0) * 1000)
                cpu.append((time.process_time() - c0) * 1000)
            emit({"ms": statistics.median(ms), "cpu_ms": statistics.median(cpu)})
    return 0


# --- the parent ----------------------------------------------------------------------------------------------


def spawn(kind: str, side: str, work: Path, quota: runner.Quota) -> runner.Child:
    argv = [sys.executable, str(Path(__file__).resolve()), "child", kind, side, "--work", str(work)]
    env = runner.base_env(OMP_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false")
    return runner.Child(quota.wrap(argv), env, MARK)


def check_parity(kind: str, work: Path, paths: dict[str, str], quotas: dict[str, runner.Quota]) -> dict[str, float]:
    """Each side started once (untimed: the page cache warmed), the pairs' answers compared; a pair beyond its
    tolerance is refused."""
    answers: dict[str, Any] = {}
    for side in SIDES[kind]:
        c = spawn(kind, side, work, quotas[side])
        try:
            answers[side] = c.ask({"parity": 4})["answer"]
        finally:
            c.close()
    if kind == "rerank":
        answers["reference"] = json.loads((Path(paths["fastembed"]) / "reference.json").read_text())
    diffs = {}
    for a, b, tol in PARITY[kind]:
        d = max_diff(kind, answers[a], answers[b])
        print(f"{kind}: parity {a} vs {b}: max abs diff {d:.2e} (tolerance {tol:g})", file=sys.stderr)
        if not d <= tol:
            raise SystemExit(f"{kind}: {a} and {b} answer differently (max abs diff {d:.3g} > {tol:g}): not timed")
        diffs[f"{a} vs {b}"] = d
    return diffs


def model_files(kind: str, side: str, paths: dict[str, str]) -> list[Path]:
    """The files a side's start reads its model (and the images) from: what `--evict` drops from the page cache."""
    key = "packed" if side.startswith("ours") else "source" if side == "cross-encoder" else "fastembed"
    dirs = [Path(paths[key])] + ([Path(paths["images"])] if "images" in paths else [])
    return sorted(f for d in dirs for f in d.rglob("*") if f.is_file())


def one_round(
    kind: str, rnd: int, work: Path, quotas: dict[str, runner.Quota], args: Any, res: runner.Results, paths: Any
) -> None:
    sides = runner.order(SIDES[kind], rnd)
    children: dict[str, runner.Child] = {}
    rows: dict[str, dict[str, Any]] = {side: {} for side in sides}
    if args.evict:  # first a start with the model's files out of the page cache (the libraries' stay in it)
        for side in sides:
            runner.evict(map(str, model_files(kind, side, paths)))
            c = spawn(kind, side, work, quotas[side])
            rows[side] |= {"evicted_ms": c.ready_ms, "evicted_cpu_ms": c.hello["cpu_ms"]}
            c.close()
    try:
        for side in sides:
            c = children[side] = spawn(kind, side, work, quotas[side])
            rows[side] |= {
                "cold_ms": c.ready_ms,
                "cold_cpu_ms": c.hello["cpu_ms"],
                "cold_rss_mb": runner.peak_rss_mb(c.pid),
            }
        for side in sides:
            children[side].ask({"warmup": True})
        for batch, calls in ((1, args.b1_calls), (32, args.b32_calls)):
            for side in sides:
                got = children[side].ask({"batch": batch, "calls": calls})
                rows[side] |= {f"b{batch}_ms": got["ms"], f"b{batch}_cpu_ms": got["cpu_ms"]}
        for side in sides:
            rows[side]["warm_rss_mb"] = runner.peak_rss_mb(children[side].pid)
    finally:
        for c in children.values():
            c.close()
    load = round(os.getloadavg()[0], 1)
    for side in SIDES[kind]:
        res.add(kind=kind, side=side, round=rnd, load=load, **rows[side])


def main(argv: list[str] | None = None) -> int:
    ap = runner.parser(__doc__, rounds=3, out="retrieval")
    ap.add_argument("mode", nargs="?", default="run", choices=["run", "child"], help=argparse.SUPPRESS)
    ap.add_argument("child_args", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, of: " + ", ".join(KINDS))
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "bench" / "retrieval", help="built models")
    ap.add_argument("--b1-calls", type=int, default=10, help="batch-1 calls a block (default %(default)s)")
    ap.add_argument("--b32-calls", type=int, default=2, help="batch-32 calls a block (default %(default)s)")
    ap.add_argument("--evict", action="store_true", help="also a start with the model's files evicted, each round")
    args = ap.parse_args(argv)
    if args.mode == "child":
        kind, side = args.child_args
        return child(kind, side, json.loads((args.work / kind / "built.json").read_text()))
    kinds = runner.csv(args.kinds, KINDS, "kinds")
    args.work = args.work.resolve()
    why = runner.need_root()
    if why:
        raise SystemExit(f"retrieval bench {why}")
    os.environ["HF_HUB_OFFLINE"] = "1"
    paths = {kind: build(kind, args.work) for kind in kinds}
    res = runner.Results("bench/peers/retrieval.py", meta={"loadavg_start": os.getloadavg()})
    groups = {(k, s): runner.Quota(f"{k}-{s}", vcpus=1.0) for k in kinds for s in SIDES[k]}
    try:
        per_kind = {k: {s: groups[k, s] for s in SIDES[k]} for k in kinds}
        res.meta["parity"] = {k: check_parity(k, args.work, paths[k], per_kind[k]) for k in kinds}
        for rnd in range(args.rounds):
            for kind in kinds:
                one_round(kind, rnd, args.work, per_kind[kind], args, res, paths[kind])
    finally:
        for q in groups.values():
            q.close()
    res.meta["loadavg_end"] = os.getloadavg()
    parts = []
    for kind in kinds:
        parity = ", ".join(f"{pair} {d:.1e}" for pair, d in res.meta["parity"][kind].items())
        loads = runner.Stat.of(r["load"] for r in res.pick(kind=kind))
        parts.append(f"### {kind}\n\nParity (max abs diff): {parity}; load average {loads.fmt(1)}\n\n")
        parts[-1] += figures(res.rows, kind)
    res.save(args.out, "\n\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
