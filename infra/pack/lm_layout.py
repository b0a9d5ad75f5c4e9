"""A generate pack's weights in the layout the engine maps directly (pack time, after infra/pack/lm_pack.py).

`align(dir)`: onnxruntime-genai's builder writes model.onnx.data with tensors end to end (offsets 256, 33,024...);
ONNX Runtime maps an external tensor in place only at a page-aligned offset and reads any other into a buffer of
its own (a second copy, and the reads one tensor at a time). Here every tensor is copied to a 4096-byte offset
(in the file's order, with copy_file_range: nothing held in memory, a 7 GB file is fine) and the byte ranges a
session reads are recorded (`backends.genai.layout`): the start's prefetch (handler.backends.genai_spec) asks
the kernel for them while the imports run, in large sequential requests, and the session then maps pages that
are already cached. An embedding table (a Gather's input) is left out of the ranges: it is read a few rows at a
time. Alone it changes neither time nor memory (measured: ORT prepacks every MatMul weight of the builder's graph
into a copy anyway); it is what lets the prepacked copies below, and the tensors no kernel prepacks, map in place.

`prepack(dir)` (`warmstart optimize DIR` on a generate pack): an ONNX Runtime session over the aligned model
saves model.opt.onnx + model.opt.onnx.data, its graph optimized (ORT_ENABLE_ALL, what onnxruntime-genai's
sessions run by default) and its MatMul weights prepacked in MLAS's layout (the session option
`session.save_external_prepacked_constant_initializers`): at load they are mapped, not computed into a second copy
(docs/benchmarks.md, "Loading big generative packs"). The layout belongs to this ORT version and this CPU's
kernels, so the manifest records both (handler.backends.genai_load opens it only where they match), and it is
kept only if onnxruntime-genai's greedy tokens and logits through it are identical to the portable model's on
probe prompts; else it is dropped and the pack is left as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from handler.backends.fingerprint import cpu_fingerprint
from handler.backends.genai_load import ort_version
from handler.core.manifest import MANIFEST_NAME, load_manifest, sha256_file
from infra.pack.lm_q4 import Q4_FILE
from infra.pack.opt_layout import LayoutError, copy_range
from infra.pack.optimize import touched_ranges
from infra.pack.progress import phase

PAGE = 4096
MODEL_FILE, MODEL_DATA = "model.onnx", "model.onnx.data"
OPT_FILE, OPT_DATA = "model.opt.onnx", "model.opt.onnx.data"
CONFIG_FILE = "genai_config.json"
# Probe prompts (token-id lengths) and the greedy tokens compared after each: a one-token prompt, a short and a
# longer one, so prefill and decode steps of both graphs run.
PROBE_LENGTHS = (1, 9, 40)
PROBE_TOKENS = 6


def _external(tensor: Any) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def align(model_dir: Path, model: str = MODEL_FILE, data: str = MODEL_DATA) -> dict[str, Any]:
    """Rewrite `model` and `data` in `model_dir` with every external tensor at a PAGE-aligned offset; returns the
    manifest's `layout` entry (the ranges a session reads of `data`)."""
    import onnx  # pack time only

    model_path, data_path = model_dir / model, model_dir / data
    graph = onnx.load(str(model_path), load_external_data=False)
    tensors = []
    for tensor in graph.graph.initializer:
        info = _external(tensor)
        if not info:
            continue
        if info.get("location") != data or "offset" not in info or "length" not in info:
            raise LayoutError(
                f"{model_path}: initializer {tensor.name!r} has external data {info}: expected "
                f"{data!r} with an offset and a length"
            )
        tensors.append((int(info["offset"]), int(info["length"]), tensor))
    _no_other_external(graph, model_path)
    tensors.sort(key=lambda t: t[0])
    size = data_path.stat().st_size
    new_data, new_model = model_dir / f".{data}.aligned", model_dir / f".{model}.aligned"
    try:
        with open(data_path, "rb") as src, open(new_data, "wb") as dst:
            at = 0
            for offset, length, tensor in tensors:
                if offset + length > size:
                    raise LayoutError(f"{data_path}: {tensor.name!r} ends at {offset + length}, past the file's {size}")
                at = -(-at // PAGE) * PAGE
                copy_range(src.fileno(), dst.fileno(), offset, at, length)
                for entry in tensor.external_data:
                    if entry.key == "offset":
                        entry.value = str(at)
                at += length
            dst.truncate(-(-at // PAGE) * PAGE)  # whole pages: the last tensor's page is mapped whole
        new_model.write_bytes(graph.SerializeToString())  # the graph only: its tensors stay in `data`
        os.replace(new_data, data_path)
        os.replace(new_model, model_path)
    finally:
        new_data.unlink(missing_ok=True)
        new_model.unlink(missing_ok=True)
    return {"page": PAGE, "tensors": len(tensors), "ranges": {data: touched_ranges(model_path)}}


def _no_other_external(graph: Any, path: Path) -> None:
    """Tensors in node attributes with external data would be left pointing at the old offsets: refused."""
    for node in graph.graph.node:
        for attr in node.attribute:
            for tensor in [attr.t, *attr.tensors]:
                if _external(tensor):
                    raise LayoutError(f"{path}: node {node.name!r} has an attribute tensor with external data")


def aligned(model_path: Path) -> list[str]:
    """The external tensors of `model_path` that are not at a PAGE-aligned offset (what the tests check)."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False)
    return [t.name for t in graph.graph.initializer if int(_external(t).get("offset", 0)) % PAGE]


# -- the prepacked copy --


def prepack(model_dir: Path, threads: int = 2) -> tuple[dict[str, Any] | None, str]:
    """Write model.opt.onnx (+ .data) into `model_dir` if it reproduces the portable model exactly: (the manifest's
    `optimized` entry, what was proved) or (None, why it was dropped)."""
    import onnxruntime as ort  # pack time only

    work = Path(tempfile.mkdtemp(prefix=".prepack-", dir=model_dir))
    try:
        for name in (CONFIG_FILE, MODEL_FILE, MODEL_DATA):  # the portable model beside it: the probes load both
            os.link(model_dir / name, work / name)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.log_severity_level = 3
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL  # genai's sessions' default
        options.optimized_model_filepath = str(work / OPT_FILE)
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", OPT_DATA)
        # Small tensors inline: genai's shape inference cannot read an external 8-byte constant (measured).
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", str(PAGE))
        options.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
        phase("saving the decoder optimized, with prepacked weights, for this CPU")
        session = ort.InferenceSession(str(work / MODEL_FILE), options, providers=["CPUExecutionProvider"])
        del session
        phase("proving it token- and logit-identical to the portable decoder")
        same, why = identical(work, threads)
        if not same:
            return None, why
        unaligned = aligned(work / OPT_FILE)
        files = [n for n in (OPT_FILE, OPT_DATA) if (work / n).exists()]
        entry = {
            "model": OPT_FILE,
            "files": files,
            "onnxruntime": ort_version() or ort.__version__,
            **cpu_fingerprint(),
            "graph_optimization_level": "all",
            "prepacked": _prepacked(work / OPT_FILE),
            "identical_probes": len(PROBE_LENGTHS),
            "unaligned_tensors": len(unaligned),
            "ranges": {OPT_DATA: touched_ranges(work / OPT_FILE)} if OPT_DATA in files else {},
        }
        for name in files:
            os.replace(work / name, model_dir / name)
        return entry, why
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _prepacked(model_path: Path) -> int:
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False)
    return sum(1 for t in graph.graph.initializer if any(e.key.startswith("prepacked") for e in t.external_data))


def identical(model_dir: Path, threads: int) -> tuple[bool, str]:
    """Whether onnxruntime-genai's greedy tokens and every step's logits through OPT_FILE equal MODEL_FILE's on
    the probe prompts (each model loaded in turn: one in memory at a time)."""
    import numpy as np

    vocab = int(json.loads((model_dir / CONFIG_FILE).read_text())["model"]["vocab_size"])
    rng = np.random.default_rng(0)
    prompts = [[int(i) for i in rng.integers(0, vocab, n)] for n in PROBE_LENGTHS]
    portable = greedy(model_dir, None, prompts, threads)
    optimized = greedy(model_dir, OPT_FILE, prompts, threads)
    for n, ((tokens_a, logits_a), (tokens_b, logits_b)) in enumerate(zip(portable, optimized, strict=True)):
        if tokens_a != tokens_b:
            return False, f"probe {n}: greedy tokens {tokens_b} != the portable model's {tokens_a}"
        for step, (a, b) in enumerate(zip(logits_a, logits_b, strict=True)):
            if not np.array_equal(a, b):
                diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                return False, f"probe {n} step {step}: logits differ from the portable model's (max {diff:.3g})"
    return True, f"greedy tokens and logits identical on {len(prompts)} probes x {PROBE_TOKENS} tokens"


def greedy(model_dir: Path, decoder: str | None, prompts: list[list[int]], threads: int) -> list[Any]:
    """[(tokens, [logits per step])] per prompt, as the genai backend loads the pack (handler.backends.genai)."""
    import numpy as np
    import onnxruntime_genai as og  # type: ignore[import-untyped]  # no stubs

    from handler.backends.genai import genai_config  # the config exactly as the engine opens it

    model = og.Model(genai_config(model_dir, threads, False, decoder))
    out = []
    for prompt in prompts:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + PROBE_TOKENS, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(prompt)
        tokens, logits = [], []
        for _ in range(PROBE_TOKENS):
            generator.generate_next_token()
            tokens.append(int(generator.get_next_tokens()[0]))
            logits.append(np.array(generator.get_logits()))
        del generator
        out.append((tokens, logits))
    del model
    return out


# -- a published pack --


def relayout(model_dir: Path, optimize: bool = False, threads: int = 2) -> dict[str, Any]:
    """Lay out the published generate pack in `model_dir` (align; with `optimize`, the prepacked copy too) and
    record it in its manifest; returns {"layout", "optimized", "optimized_reason"}. A pack laid out before is
    aligned already (the copy is skipped) and an earlier optimized copy is replaced or, if dropped, removed."""
    model_dir = Path(model_dir).resolve()
    manifest = load_manifest(model_dir)
    if manifest.task != "generate" or "genai" not in manifest.backends:
        raise LayoutError(f"{model_dir}: not a generate pack for the genai backend")
    entry = dict(manifest.backends["genai"])
    phase("aligning the weights to pages")
    stale = []
    if aligned(model_dir / MODEL_FILE) or not entry.get("layout"):
        entry["layout"] = align(model_dir)
        # The Q4MatMul graph (infra.pack.lm_q4) points at the old offsets: dropped (`warmstart optimize` adds it
        # again); only our own file is ever deleted, whatever the entry names.
        if entry.pop("q4", None):
            stale.append(Q4_FILE)
    entry.pop("optimized", None)
    why = "not asked (warmstart optimize)"
    if optimize:
        optimized, why = prepack(model_dir, threads)
        if optimized is not None:
            entry["optimized"] = optimized
    stale += [] if entry.get("optimized") else [OPT_FILE, OPT_DATA]
    _record(model_dir, entry, stale)
    return {"layout": entry["layout"], "optimized": entry.get("optimized"), "optimized_reason": why}


def _record(model_dir: Path, entry: dict[str, Any], stale: list[str]) -> None:
    """The files' sizes and SHA-256 and the backend's entry in the manifest: written aside and renamed."""
    path = model_dir / MANIFEST_NAME
    raw = json.loads(path.read_text())
    names = [*entry.get("files", []), *(entry.get("optimized") or {}).get("files", [])]
    for name in stale:
        raw["files"].pop(name, None)
        (model_dir / name).unlink(missing_ok=True)
    for name in names:
        file = model_dir / name
        raw["files"][name] = {"size": file.stat().st_size, "sha256": sha256_file(file)}
    raw["backends"]["genai"] = entry
    tmp = path.with_name(f".{MANIFEST_NAME}.tmp")
    tmp.write_text(json.dumps(raw, indent=2) + "\n")
    os.replace(tmp, path)
    load_manifest(model_dir)  # what we wrote must read back
