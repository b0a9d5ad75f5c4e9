"""warmstart's `sparse` task beside fastembed's SPLADE (`SparseTextEmbedding`), on the same random weights.

    .venv/bin/python bench/peers/sparse.py [--out build/sparse-bench] [--rounds 5]

No SPLADE checkpoint is downloaded: a BERT masked-language model of all-MiniLM-L6-v2's shape (6 layers,
hidden 384) with random weights and BERT's uncased vocabulary (30,522 terms: the tokenizer of the packed
default model) is saved as a sentence-transformers SparseEncoder (Transformer fill-mask + SpladePooling max),
packed with `pack_from` (ONNX), and exported for fastembed as the MLM logits graph its `prithivida/Splade_PP_en_v1`
pipeline loads from a local directory (`specific_model_path`: it pools in numpy). fastembed must be importable
(installed with --no-deps beside onnxruntime-gpu: its wheel requires `onnxruntime`, which would overwrite it).

  cold   spawn -> first answer to one sentence, one process per variant and round (peak RSS from wait4)
  warm   in one process, one intra-op thread each, blocks of batch-1 and batch-32 calls interleaved per round;
         ours is `Runtime.serve` (the native request, no JSON), fastembed `list(embed(texts))`

Prints one JSON object: per measure, each variant's median and range over the rounds, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.peers.driver import SENTENCES  # noqa: E402

TOKENIZER = ROOT / "models" / "default" / "tokenizer.json"
FASTEMBED_NAME = "prithivida/Splade_PP_en_v1"  # its pipeline: relu, log1p, max over the masked tokens

COLD = {
    "ours": "import json, handler.app as a; a.lambda_handler({'inputs': [%r]}, None)",
    "fastembed": "from fastembed import SparseTextEmbedding as S; list(S(%r, specific_model_path=%r).embed([%r]))",
}
# The child's own peak (its address space's, from exec on: wait4's ru_maxrss keeps the forking parent's).
PEAK = "; print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])"


def build(out: Path) -> tuple[Path, Path]:
    """The SparseEncoder directory, its pack (ONNX) and fastembed's directory; (pack, fastembed dir)."""
    import tempfile

    import torch
    import transformers
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer

    from infra.pack.hf_pack import pack_from

    src, packed, fe = out / "src", out / "packed", out / "fastembed"
    if fe.exists() and packed.exists():
        return packed, fe
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tok = transformers.BertTokenizerFast(tokenizer_file=str(TOKENIZER), model_max_length=256)
    config = transformers.BertConfig(
        vocab_size=tok.vocab_size, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
        intermediate_size=1536, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(config).eval()
    with torch.no_grad():
        model.cls.predictions.bias.sub_(0.1)  # most logits below 0: sparse rows, as a trained SPLADE's
    with tempfile.TemporaryDirectory() as hf:
        model.save_pretrained(hf)
        tok.save_pretrained(hf)
        mlm = Transformer(hf, transformer_task="fill-mask", model_kwargs={"local_files_only": True})
        SparseEncoder(modules=[mlm, SpladePooling("max")]).save(str(src))
    pack_from(src, packed, model_id="splade-random", version="1", backends=("onnx",))
    fe.mkdir()
    tok.save_pretrained(str(fe))
    model.config.save_pretrained(str(fe))
    ids = torch.tensor([[101, 7592, 2088, 102]])
    with torch.no_grad():
        torch.onnx.export(
            model, (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(fe / "model.onnx"),
            input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["logits"],
            dynamic_axes={n: {0: "b", 1: "s"} for n in ("input_ids", "attention_mask", "token_type_ids", "logits")},
            opset_version=17, dynamo=False,
        )  # fmt: skip
    return packed, fe


def cold(kind: str, packed: Path, fe: Path) -> dict[str, float]:
    code = COLD[kind] % ((SENTENCES[0],) if kind == "ours" else (FASTEMBED_NAME, str(fe), SENTENCES[0]))
    # Each at its defaults (intra-op threads from the CPUs), as a function starts.
    env = {**os.environ, "WARMSTART_MODEL": str(packed), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code + PEAK], env=env, capture_output=True, text=True, check=True)
    ms = (time.perf_counter() - t0) * 1000  # the interpreter's exit included: under 1% of these figures
    return {"ms": ms, "rss_mb": int(done.stdout.split()[-1]) / 1024}


def warm(packed: Path, fe: Path, rounds: int) -> dict[str, dict[str, list[float]]]:
    from fastembed import SparseTextEmbedding

    from handler.core.config import Config
    from handler.runtime.invocation import Runtime

    config = Config(model_dir=packed, backend="onnx", warmup=True, threads=1)
    rt = Runtime.start(config, environ=os.environ, emit=None)
    fast = SparseTextEmbedding(FASTEMBED_NAME, specific_model_path=str(fe), threads=1)
    calls = {
        "ours": lambda texts: rt.serve({"inputs": texts}),
        "fastembed": lambda texts: list(fast.embed(texts, batch_size=len(texts))),
    }
    check(rt, fast)
    for call in calls.values():  # arenas, caches
        call(SENTENCES[:1])
        call(SENTENCES)
    out: dict[str, dict[str, list[float]]] = {k: {"b1": [], "b32": []} for k in calls}
    for r in range(rounds):
        order = list(calls) if r % 2 == 0 else list(calls)[::-1]
        for kind in order:
            for batch, n in (("b1", 20), ("b32", 3)):
                times = []
                for i in range(n):
                    texts = SENTENCES if batch == "b32" else [SENTENCES[i % len(SENTENCES)]]
                    t0 = time.perf_counter()
                    calls[kind](texts)
                    times.append((time.perf_counter() - t0) * 1000)
                out[kind][batch].append(statistics.median(times))
    return out


def check(rt: Any, fast: Any) -> None:
    """Both answer the same terms (else the figures compare nothing)."""
    import numpy as np

    ours = rt.serve({"inputs": SENTENCES[:4]})["embeddings"]
    theirs = list(fast.embed(SENTENCES[:4]))
    for a, b in zip(ours, theirs, strict=True):
        assert a["indices"] == b.indices.tolist(), "fastembed answers other terms"
        assert float(np.abs(np.asarray(a["values"]) - b.values).max()) < 1e-4


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "build" / "sparse-bench"))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    packed, fe = build(Path(args.out))
    colds: dict[str, list[dict[str, float]]] = {"ours": [], "fastembed": []}
    for r in range(args.rounds):
        for kind in ("ours", "fastembed") if r % 2 == 0 else ("fastembed", "ours"):
            colds[kind].append(cold(kind, packed, fe))
    result: dict[str, Any] = {"loadavg_before": Path("/proc/loadavg").read_text().split()[:3]}
    for kind, runs in colds.items():
        result[f"cold_ms_{kind}"] = summary([c["ms"] for c in runs])
        result[f"peak_rss_mb_{kind}"] = summary([c["rss_mb"] for c in runs])
    warmed = warm(packed, fe, args.rounds)
    for kind, blocks in warmed.items():
        for batch, values in blocks.items():
            result[f"warm_{batch}_ms_{kind}"] = summary(values)
    for measure in ("cold_ms", "warm_b1_ms", "warm_b32_ms"):
        if measure == "cold_ms":
            pairs = zip([c["ms"] for c in colds["fastembed"]], [c["ms"] for c in colds["ours"]], strict=True)
        else:
            b = measure.split("_")[1]
            pairs = zip(warmed["fastembed"][b], warmed["ours"][b], strict=True)
        result[f"{measure}_fastembed_over_ours"] = round(statistics.median(f / o for f, o in pairs), 2)
    result["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
