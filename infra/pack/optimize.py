"""Pre-optimize a packed ONNX model for the machine it will run on (pack time: `warmstart optimize DIR`).

ONNX Runtime spends most of session creation on graph optimization and on prepacking MatMul weights into
MLAS's blocked layout (a second copy in memory). Done once here and saved (`optimized_model_filepath` +
`session.save_external_prepacked_constant_initializers`), a cold start maps both instead: measured in
docs/coldstart.md. The prepacked layout depends on the ORT version and the CPU features MLAS dispatches on,
so both are recorded in the manifest and checked at load (handler.backends.ort.optimized_model): any mismatch
serves the portable model, with the reason in the init report. Run this where the function runs (the image
build, `layers.build` for its target), with the runtime's pinned onnxruntime.

The result is kept only if its outputs are bit-identical to the portable model's on probe inputs (the
embedding task: real tokenized sentences at several batch sizes and lengths).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from handler.backends.fingerprint import cpu_fingerprint
from handler.core.manifest import MANIFEST_NAME, load_manifest, parse_json, sha256_file
from infra.pack.opt_layout import LayoutError, embedding_tables, packed_buffers, relayout
from infra.pack.progress import phase

OPT_FILE, OPT_DATA = "model.opt.onnx", "model.opt.onnx.data"
PAGE = 4096
# Sentences of several lengths (with padding inside a batch), so every code path of the graph runs.
PROBE_TEXTS = [
    "A cold start is the time from nothing to the first answer.",
    "short",
    "Prepacked weights are laid out for the CPU's kernels; a different CPU reads them differently. " * 6,
    "naïve café, 東京, emoji 🚀 and a very-long-hyphenated-token-sequence-that-splits-into-many-pieces",
]


class OptimizeError(ValueError):
    """The optimized model could not be made or did not reproduce the portable model's outputs exactly."""


def _options(ort: Any, preoptimized: bool) -> Any:
    # The runtime's settings (handler.backends.ort), one thread: the saved model must be what init would build.
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    level = ort.GraphOptimizationLevel
    options.graph_optimization_level = level.ORT_DISABLE_ALL if preoptimized else level.ORT_ENABLE_EXTENDED
    return options


def probe_feeds(manifest: Any, session: Any) -> list[dict[str, npt.NDArray[Any]]]:
    """Inputs to compare the two models on: tokenized sentences for a text model, seeded random arrays else."""
    names = [i.name for i in session.get_inputs()]
    if manifest.task == "embedding" and manifest.tokenizer.get("file"):
        from handler.tasks.tokens import TextEncoder

        encoder = TextEncoder(manifest.path(manifest.tokenizer["file"]), int(manifest.tokenizer["truncation"]))
        feeds: list[dict[str, npt.NDArray[Any]]] = []
        for batch in ([PROBE_TEXTS[0]], PROBE_TEXTS, PROBE_TEXTS[1:3]):
            ids, mask = encoder.encode(batch)
            feeds.append({n: ids if n == "input_ids" else mask for n in names})
        return feeds
    rng = np.random.default_rng(0)
    feeds = []
    for size in (1, 3):
        feed: dict[str, npt.NDArray[Any]] = {}
        for i in session.get_inputs():
            # Symbolic dims: the batch first, 7 elsewhere.
            shape = [int(d) if isinstance(d, int) else (size if n == 0 else 7) for n, d in enumerate(i.shape)]
            if "float" in i.type:
                feed[i.name] = rng.standard_normal(shape).astype(np.float16 if "16" in i.type else np.float32)
            elif "bool" in i.type:
                feed[i.name] = rng.integers(0, 2, shape).astype(np.bool_)
            else:
                feed[i.name] = rng.integers(0, 100, shape).astype(np.int32 if "int32" in i.type else np.int64)
        feeds.append(feed)
    return feeds


def optimize(model_dir: Path) -> dict[str, Any]:
    """Write model.opt.onnx (+ .data) into the packed `model_dir` and record it in its manifest; returns the
    manifest entry. Replaces an earlier optimized model. Raises OptimizeError when outputs differ, LayoutError
    when the external data ONNX Runtime saved does not add up (infra.pack.opt_layout)."""
    import onnxruntime as ort

    model_dir = model_dir.resolve()
    manifest = load_manifest(model_dir)
    if "onnx" not in manifest.backends:
        raise OptimizeError(f"{model_dir}: not packed for the onnx backend")
    portable = manifest.path(manifest.backends["onnx"]["model"])
    prepacked = saves_prepacked(portable)
    with tempfile.TemporaryDirectory(prefix=".optimize-", dir=model_dir) as tmp:
        work = Path(tmp)
        options = _options(ort, preoptimized=False)
        options.optimized_model_filepath = str(work / OPT_FILE)
        # The data file name is relative to the model file: both move into model_dir together below.
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", OPT_DATA)
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "4096")
        options.add_session_config_entry("session.save_external_prepacked_constant_initializers", str(int(prepacked)))
        phase("optimizing the graph for this CPU (prepacked weights)")
        reference = ort.InferenceSession(str(portable), options, providers=["CPUExecutionProvider"])
        layout = None
        if (work / OPT_DATA).exists():
            phase("laying out the weights in the order a start reads them")
            # Before the proof below: the candidate session loads the relaid file, so the proof covers it.
            layout = relayout(work / OPT_FILE, OPT_DATA)
        candidate = ort.InferenceSession(
            str(work / OPT_FILE), _options(ort, preoptimized=True), providers=["CPUExecutionProvider"]
        )
        phase("proving the optimized model bit-identical")
        feeds = probe_feeds(manifest, reference)
        outputs = [o.name for o in reference.get_outputs()]
        for n, feed in enumerate(feeds):
            for name, a, b in zip(outputs, reference.run(None, feed), candidate.run(None, feed), strict=True):
                if not np.array_equal(a, b):
                    diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                    raise OptimizeError(f"output {name!r} of probe {n} differs from the portable model's (max {diff})")
        del reference, candidate
        unaligned = _unaligned(work / OPT_FILE)
        phase("recording the byte ranges a start reads")
        touched = touched_ranges(work / OPT_FILE)
        # A model whose initializers are all small has no data file: everything is inline.
        files = [name for name in (OPT_FILE, OPT_DATA) if (work / name).exists()]
        entry = {
            "model": OPT_FILE,
            "files": files,
            "onnxruntime": ort.__version__,
            **cpu_fingerprint(),
            "graph_optimization_level": "extended",
            "prepacked": prepacked,
            "bit_identical_probes": len(feeds),
            # ORT maps an external tensor in place only at a page-aligned offset; the rest it reads.
            "unaligned_tensors": unaligned,
            # The data file's order (infra.pack.opt_layout): what a start reads first, as one span.
            **({"layout": layout} if layout else {}),
            # The byte ranges of the data file a session and its first run touch: init's prefetch reads these
            # and not the whole file (the originals of prepacked weights and the embedding table are never
            # read in full: 41 of the file's 133 MB for all-MiniLM, measured with pagemap). Laid out, one span.
            "touched_ranges": {OPT_DATA: touched} if OPT_DATA in files else {},
        }
        for name in files:
            os.replace(work / name, model_dir / name)
    _record(model_dir, entry)
    return entry


def saves_prepacked(model: Path) -> bool:
    """Whether the optimized model is saved with its prepacked weights: not for an int8 graph of
    MatMulIntegerToFloat (`--quantize int8`). ONNX Runtime 1.31.1 crashed (SIGSEGV) running all-MiniLM-L6-v2's
    int8 pack saved so, with its float paths (outlier channels or the special tokens' rows) in the graph; saved
    without them it is bit-identical, and still folds the float16 weights' casts once (session creation
    0.15 -> 0.12 s CPU, 1 thread). The weights are then prepacked at load, as with the portable model."""
    import onnx

    return not any(
        n.op_type == "MatMulIntegerToFloat" for n in onnx.load(str(model), load_external_data=False).graph.node
    )


def touched_ranges(model_path: Path, merge_gap: int = 1 << 16) -> list[list[int]]:
    """[offset, length] ranges of the external data that a pre-optimized session reads: every initializer except
    an embedding table (a Gather's, or a fused EmbedLayerNormalization's: looked up a few rows at a time), and
    each prepacked initializer's packed copies (every buffer of its entry: an Attention's three) as well as its
    original (ONNX Runtime reads the original whole once at load and unmaps it: measured, every 64 KB of
    each original faulted in, then munmap). Ranges closer than `merge_gap` are merged."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    tables = embedding_tables(model)
    spans: list[tuple[int, int]] = []
    for tensor in model.graph.initializer:
        info = {e.key: e.value for e in tensor.external_data}
        if "offset" not in info or tensor.name in tables:
            continue
        spans.append((int(info["offset"]), int(info["length"])))
        # A prepacked entry's value: "<kernel>+<hash>|<offset>;<length>;<flag>[|...]", one buffer per part.
        spans += [(o, n) for k, v in info.items() if k.startswith("prepacked") for o, n, _ in packed_buffers(v, k)]
    merged: list[list[int]] = []
    for offset, length in sorted(spans):
        if merged and offset <= merged[-1][0] + merged[-1][1] + merge_gap:
            merged[-1][1] = max(merged[-1][1], offset + length - merged[-1][0])
        else:
            merged.append([offset, length])
    return merged


def _unaligned(model_path: Path) -> int:
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    count = 0
    for tensor in model.graph.initializer:
        info = {e.key: e.value for e in tensor.external_data}
        if "offset" in info and int(info["offset"]) % PAGE and int(info.get("length", 0)) >= PAGE:
            count += 1
    return count


def _record(model_dir: Path, entry: dict[str, Any]) -> None:
    """Add the files and the entry to the manifest: written aside and renamed, so readers never see half."""
    path = model_dir / MANIFEST_NAME
    raw = json.loads(path.read_text())
    for name in entry["files"]:
        file = model_dir / name
        raw["files"][name] = {"size": file.stat().st_size, "sha256": sha256_file(file)}
    raw["backends"]["onnx"]["optimized"] = entry
    tmp = path.with_name(f".{MANIFEST_NAME}.tmp")
    tmp.write_text(json.dumps(raw, indent=2) + "\n")
    os.replace(tmp, path)
    load_manifest(model_dir)  # what we wrote must read back


def remove(model_dir: Path) -> bool:
    """Drop the optimized model from a packed directory (before copying it to another target). Only the files
    `optimize` writes are ever deleted, whatever names the manifest holds."""
    path = model_dir / MANIFEST_NAME
    try:
        raw = parse_json(path.read_bytes())
        entry = raw["backends"].get("onnx", {}).pop("optimized", None)
        files = raw["files"]
        if not isinstance(files, dict):
            raise TypeError("'files' is not an object")
    except (ValueError, UnicodeDecodeError, RecursionError, KeyError, TypeError, AttributeError) as e:
        raise OptimizeError(f"{path}: not a packed model's manifest ({type(e).__name__}: {e})"[:500]) from None
    if entry is None:
        return False
    names = entry.get("files", []) if isinstance(entry, dict) else None
    if not isinstance(names, list) or not all(n in (OPT_FILE, OPT_DATA) for n in names):
        raise OptimizeError(f"{path}: optimized files {names!r}; only {OPT_FILE} and {OPT_DATA} are ours to remove")
    for name in names:
        files.pop(name, None)
    tmp = path.with_name(f".{MANIFEST_NAME}.tmp")
    tmp.write_text(json.dumps(raw, indent=2) + "\n")
    os.replace(tmp, path)
    for name in names:
        (model_dir / name).unlink(missing_ok=True)
    return True


__all__ = ["OPT_DATA", "OPT_FILE", "LayoutError", "OptimizeError", "optimize", "remove", "saves_prepacked"]
