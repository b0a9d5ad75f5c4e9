"""The tuned floor's one build step (bench/handlers/floor_ort.py), as an engineer hand-writing the function
would script it once, beside the deploy: ONNX Runtime optimizes the portable graph (EXTENDED) and saves the
result with its MatMul weights already prepacked in MLAS's layout for this ORT version and CPU (one session
option, `session.save_external_prepacked_constant_initializers`), so a start maps them instead of redoing both;
the WordPiece vocabulary is copied beside it, so a start builds the tokenizer from vocab.txt instead of parsing
tokenizer.json.

    python bench/handlers/floor_ort_build.py PACKED_MODEL_DIR OUT_DIR

Reads the packed model's portable graph (manifest backends.onnx.model) and vocab.txt; writes OUT_DIR/model.onnx,
model.onnx.data, vocab.txt. bench/runner.py's prepare_floor calls `build` and keeps the result while the source
is unchanged. Like our own `warmstart optimize`, the output is for this machine's ORT and CPU only.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

MODEL, DATA, VOCAB = "model.onnx", "model.onnx.data", "vocab.txt"


def build(packed: Path, out: Path) -> Path:
    """OUT with the optimized, prepacked graph and the vocabulary of the packed model at `packed`."""
    import onnxruntime as ort  # deferred: a build-time tool, not the floor's start

    manifest = json.loads((packed / "manifest.json").read_text())
    portable = packed / manifest["backends"]["onnx"]["model"]
    vocab = packed / manifest["tokenizer"].get("shortcut", {}).get("vocab", VOCAB)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(out / MODEL)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", DATA)
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "4096")
    options.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
    ort.InferenceSession(str(portable), options, providers=["CPUExecutionProvider"])
    os.link(vocab, out / VOCAB)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(build(Path(sys.argv[1]), Path(sys.argv[2])))
