"""Issue 25, Figures: what `pack --from` costs on a BERT-base-sized model, before and after the torch backend's
program export.

  before   git ref f7a1e16 (checked out with `git worktree add /tmp/pack-before f7a1e16`): the ONNX export, and
           for torch the staged safetensors copied as they are (the hand-written encoder's artifact)
  after    this checkout: the refusal check (transformers loads the checkpoint), the ONNX export, and
           torch.export's program of the same module, each checked against the eager model

The model: random weights from `transformers.BertConfig` at BERT-base's size (hidden 768, 12 layers, 12 heads,
intermediate 3072, vocab 30522, 512 positions; 109M parameters, 438 MB of float32), in a sentence-transformers
directory (Transformer → mean Pooling → Normalize, max_seq_length 256) with a WordPiece tokenizer of 30522
tokens, built in a temporary directory (never downloaded). Each round runs both checkouts' CLI, interleaved
(the order alternating), each as

  /usr/bin/time -v python -m infra.cli pack --from DIR --out OUT --force

in its own directory (PYTHONPATH set to it), and reads `Maximum resident set size` and `Elapsed (wall clock)`.
Medians over --rounds (min..max in brackets).

Usage: .venv/bin/python bench/bench_pack_memory.py [--rounds 3] [--before /tmp/pack-before] [--after .]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BASE = {
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "vocab_size": 30522,
    "max_position_embeddings": 512,
}
MAX_SEQ = 256
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_model_dir(out: Path) -> Path:
    """A sentence-transformers directory around a random BERT-base (config.json, model.safetensors,
    tokenizer.json, modules.json, 1_Pooling, sentence_bert_config.json)."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    out.mkdir(parents=True)
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(**BASE)).eval()
    model.save_pretrained(str(out), safe_serialization=True)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = [*letters, *(f"##{c}" for c in letters)]
    vocab = [*SPECIALS, *words]
    vocab += [f"w{i}" for i in range(BASE["vocab_size"] - len(vocab))]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "vocab.txt").write_text("\n".join(vocab) + "\n")
        tokenizer = transformers.BertTokenizerFast(vocab_file=str(Path(tmp) / "vocab.txt"), do_lower_case=True)
        tokenizer.model_max_length = BASE["max_position_embeddings"]
        tokenizer.save_pretrained(str(out))
    for name in ("vocab.txt", "special_tokens_map.json"):
        (out / name).unlink(missing_ok=True)  # tokenizer.json is what is read
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": BASE["hidden_size"], "pooling_mode_mean_tokens": True}
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_SEQ, "do_lower_case": False}))
    return out


_RSS = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")
_ELAPSED = re.compile(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)")


def pack(checkout: Path, source: Path, out: Path) -> tuple[float, float]:
    """One `pack --from` in a fresh process from `checkout`: (elapsed s, peak RSS MB)."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "HF_HUB_OFFLINE": "1"}
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "infra.cli", "pack"]
    cmd += ["--from", str(source), "--out", str(out), "--force"]
    done = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: pack failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rss, elapsed = _RSS.search(done.stderr), _ELAPSED.search(done.stderr)
    if rss is None or elapsed is None:
        raise SystemExit(f"no /usr/bin/time -v figures in:\n{done.stderr[-2000:]}")
    hours, minutes, seconds = elapsed.groups()
    return int(hours or 0) * 3600 + int(minutes) * 60 + float(seconds), int(rss.group(1)) / 1024


def _cell(values: list[float], digits: int) -> str:
    return f"{statistics.median(values):,.{digits}f} ({min(values):,.{digits}f}..{max(values):,.{digits}f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, default=Path("/tmp/pack-before"), help="checkout of f7a1e16")
    parser.add_argument("--after", type=Path, default=ROOT, help="checkout to measure (default: this one)")
    args = parser.parse_args(argv)
    variants = {"f7a1e16, no program export": args.before.resolve(), "with the program export": args.after.resolve()}
    for name, checkout in variants.items():
        if not (checkout / "infra" / "cli").is_dir():
            raise SystemExit(f"{name}: {checkout} is not a warmstart checkout (git worktree add {checkout} REF)")
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="bench-pack-") as tmp:
        started = time.perf_counter()
        source = build_model_dir(Path(tmp) / "bert-base-random")
        print(f"model directory built in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in order:
                elapsed, rss = pack(variants[name], source, Path(tmp) / f"out-{r}-{list(variants).index(name)}")
                results[name].append((elapsed, rss))
                print(f"round {r + 1} {name}: {elapsed:.1f} s, {rss:,.0f} MB", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    print("| pack --from (BERT-base, random) | elapsed s, median (min..max) | peak RSS MB, median (min..max) |")
    print("|---|---|---|")
    for name, runs in results.items():
        times, peaks = [t for t, _ in runs], [m for _, m in runs]
        rows.append({"variant": name, "elapsed_s": times, "peak_rss_mb": peaks})
        print(f"| {name} | {_cell(times, 1)} | {_cell(peaks, 0)} |")
    print(json.dumps(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
