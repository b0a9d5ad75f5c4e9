"""A generate pack's decoder with its int4 MatMulNBits rewritten to our op `ai.warmstart::Q4MatMul` (and its 8-bit
LM head to `ai.warmstart::Q8MatMul`), proved (pack time: `warmstart pack --quantize int4` of a causal LM, and
`warmstart optimize DIR` on a pack made before).

ONNX Runtime's MatMulNBits re-packs every int4 weight into MLAS's layout at session creation (~0.6 s of a 0.6B
model's cold start); Q4MatMul (handler/backends/q4lib.py, handler/backends/native/) computes straight from the
bytes ONNX Runtime maps from model.onnx.data. model.q4.onnx is model.onnx with every MatMulNBits the op computes
the same way (bits 4, blocks of 32, accuracy level 4: A quantized to int8 per block, no zero points, B
[N, K/32, 16] and scales [N, K/32] as initializers) replaced by Q4MatMul, and every 8-bit one (the tied lm_head:
bits 8, blocks of 32-256, accuracy level 4, no zero points, B [N, K/block, block]) by Q8MatMul, on the same
initializer names: their external data references are copied as they are (the same file, the same offsets: no
tensor is loaded, copied or written, and the start's prefetch ranges are the portable graph's). Every other node is
kept, the tied embedding's GatherBlockQuantized (the head's bytes, looked up without a prepack) among them.

It is kept only if proved against model.onnx through ONNX Runtime's Python API (CPU, one intra-op thread, the
op's library registered), on probe prompts of 1, 9 and 40 token ids fed as genai feeds the decoder:
- per op (prove_ops): each Q4MatMul / Q8MatMul against the MatMulNBits it replaces, on the activations that node
  receives in model.onnx's run of each prompt, within OP_TOLERANCE of the largest output (the same int8 blocks and
  int32 sums: only the float sums of scale products round differently);
- the whole decoder (prove): the same argmax token after each prompt, then the same greedy tokens for PROBE_STEPS
  steps (a later step may part only on a near tie: the reference's margin below the logits' difference there),
  every step's logits within TOLERANCE of the largest logit. A value that rounds differently and then lands one
  int8 step over at the next layer's quantization moves a random model's logits by ~1-2% of the largest.
Else LmQ4Error and nothing is written: the graph is written aside, renamed after the proof, and the manifest
replaced atomically.

About one thing: the q4 graph from its rewrite through its proof to the manifest entry; the proof's feeds and
comparisons serve nothing else.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from handler.backends import q4lib
from handler.core.errors import ConfigError
from handler.core.manifest import MANIFEST_NAME, load_manifest, sha256_file
from infra.pack.optimize import touched_ranges
from infra.pack.progress import phase

MODEL_FILE, Q4_FILE, CONFIG_FILE = "model.onnx", "model.q4.onnx", "genai_config.json"
OP_NAME = f"{q4lib.DOMAIN}.{q4lib.OP}"
OP_Q8_NAME = f"{q4lib.DOMAIN}.{q4lib.OP_Q8}"
OURS = (q4lib.OP, q4lib.OP_Q8)  # the ops the rewrite makes, in the domain q4lib.DOMAIN
Q8_BLOCKS = (32, 64, 128, 256)  # the 8-bit blocks Q8MatMul computes (handler/backends/native/ws_q8.h)
# The graph passes the q4 graph is proved with and opened with (the manifest records it; the runtime reads it):
# none. The builder's graph needs none of ONNX Runtime's passes for its kernels, and skipping them skips the
# load's folding of the tied embedding table into a float copy (q4op's load_options.py `q4op-noopt`: less load
# time and memory, the same greedy tokens). The reference, model.onnx, runs with all of them, as genai opens it.
GRAPH_LEVEL = "ORT_DISABLE_ALL"
PROBE_LENGTHS = (1, 9, 40)  # a one-token prompt, a short and a longer one: prefill and decode of both graphs
PROBE_STEPS = 4  # greedy steps after each prompt, each one token through the grown KV cache
# Logits' max abs difference allowed, as a fraction of the reference's largest |logit| over all probes. Measured
# (int8 flips, every step): 0.84% on the tests' tiny random Qwen3 (0.046 of 5.47, the 40-token probe), 1.77% on the
# 0.6B Qwen3-shaped random pack (0.056 of 3.16); a wrong weight or scale moves them by far more, and the per-op
# proof holds each op to OP_TOLERANCE anyway.
TOLERANCE = 5e-2
# Each Q4MatMul against MatMulNBits on the same activations (prove_ops): the same int8 blocks and int32 sums, only
# the float sums of scale products round differently: measured 5.2e-7 (tiny, K 64/128) and 1.6e-6 (0.6B, K up
# to 3072) of the largest |value|.
OP_TOLERANCE = 1e-5


class LmQ4Error(ValueError):
    """The q4 graph cannot be made for this pack, or did not reproduce model.onnx's tokens and logits."""


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper  # pack time only

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def rewrite(model: Any) -> tuple[int, list[str]]:
    """Replace, in the ModelProto `model` (loaded without its external data), every MatMulNBits Q4MatMul (bits 4)
    or Q8MatMul (bits 8) computes the same way; returns (how many, ["<node>: <why kept>" for the other MatMulNBits
    and the GatherBlockQuantized lookups]). The domain's opset is added."""
    from onnx import TensorProto, helper

    inits = {t.name: t for t in model.graph.initializer}
    rewritten, kept = 0, []
    for i, node in enumerate(model.graph.node):
        if node.op_type == "GatherBlockQuantized" and node.domain == "com.microsoft":
            kept.append(f"{node.name}: GatherBlockQuantized (a lookup of the quantized bytes: no prepack)")
            continue
        if node.op_type != "MatMulNBits" or node.domain != "com.microsoft":
            continue
        a = _attrs(node)
        k, n, bits, block = (int(a.get(name, 0)) for name in ("K", "N", "bits", "block_size"))
        inputs = list(node.input)
        b, scales = (inits.get(inputs[j]) if len(inputs) > j else None for j in (1, 2))
        # B's bytes per block: two 4-bit values a byte, one 8-bit value a byte
        op, row = (q4lib.OP, 16) if bits == 4 else (q4lib.OP_Q8, block)
        why = None
        if (bits, block) != (4, 32) and not (bits == 8 and block in Q8_BLOCKS):
            why = (
                f"bits {bits}, block {block} (the ops: bits 4, block 32; bits 8, block {'/'.join(map(str, Q8_BLOCKS))})"
            )
        elif a.get("accuracy_level") != 4:
            why = f"accuracy_level {a.get('accuracy_level')} (the ops quantize A to int8 per block: level 4 only)"
        elif len(inputs) > 3 and any(inputs[3:]):
            why = "zero points or other optional inputs"
        elif k <= 0 or n <= 0 or k % block:
            why = f"K={k}, N={n}"
        elif b is None or b.data_type != TensorProto.UINT8 or list(b.dims) != [n, k // block, row]:
            why = f"B is not a uint8 initializer [N, K/{block}, {row}] = [{n}, {k // block}, {row}]"
        elif scales is None or scales.data_type != TensorProto.FLOAT or list(scales.dims) != [n, k // block]:
            why = f"scales is not a float32 initializer [N, K/{block}] = [{n}, {k // block}]"
        if why:
            kept.append(f"{node.name}: {why}")
            continue
        new = helper.make_node(
            op, inputs[:3], list(node.output), name=node.name, domain=q4lib.DOMAIN, K=k, N=n, block_size=block
        )
        model.graph.node[i].CopyFrom(new)
        rewritten += 1
    if rewritten and all(o.domain != q4lib.DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(q4lib.DOMAIN, 1))
    return rewritten, kept


def make(model_dir: Path, library: Path) -> dict[str, Any]:
    """Write model.q4.onnx into `model_dir` (model.onnx, its data and genai_config.json there) once proved against
    model.onnx; returns the manifest's `backends.genai.q4` entry. LmQ4Error (nothing written) when there is nothing
    to rewrite or the proof fails."""
    import onnx  # pack time only

    model_dir = Path(model_dir)
    model = onnx.load(str(model_dir / MODEL_FILE), load_external_data=False)
    rewritten, kept = rewrite(model)
    ops = {
        f"{q4lib.DOMAIN}.{op}": sum(1 for n in model.graph.node if (n.domain, n.op_type) == (q4lib.DOMAIN, op))
        for op in OURS
    }
    if not ops[OP_NAME]:  # the head alone is not worth a second graph: the body's prepack is what the op saves
        shown = "; ".join(kept[:3]) + (f" (and {len(kept) - 3} more)" if len(kept) > 3 else "")
        raise LmQ4Error(
            f"{model_dir}: no MatMulNBits the op computes (bits 4, block 32, accuracy level 4, no zero points)"
            + (f": {ops[OP_Q8_NAME]} of bits 8 alone, not worth a graph" if ops[OP_Q8_NAME] else "")
            + (f"; kept: {shown}" if kept else "")
        )
    aside = _aside(model_dir, Q4_FILE, model)  # the graph only: its tensors stay in model.onnx.data
    try:
        if touched_ranges(aside) != touched_ranges(model_dir / MODEL_FILE):
            raise LmQ4Error(f"{model_dir}: the rewritten graph reads other ranges of the data than model.onnx")
        phase(f"proving {Q4_FILE} ({rewritten} MatMulNBits -> {'/'.join(OURS)}) against {MODEL_FILE}")
        proof = prove(model_dir, aside, library)
        os.replace(aside, model_dir / Q4_FILE)
    finally:
        aside.unlink(missing_ok=True)
    return {
        "model": Q4_FILE,
        "files": [Q4_FILE],
        "op": OP_NAME,
        "rewritten": rewritten,
        "ops": ops,
        "kept": kept,
        "graph_optimization_level": GRAPH_LEVEL,
        "proof": proof,
    }


# -- the proof --


def _session(ort: Any, path: Path, library: Path | None, level: str) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    if library is not None:
        options.register_custom_ops_library(str(library))
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT's own error types (Fail, InvalidGraph, ...): the op's refusal reads in the message
        raise LmQ4Error(f"{path.name}: ONNX Runtime cannot open it: {str(e).strip()[:500]}") from None


class _Decoder:
    """The builder's decoder fed as genai feeds it: input_ids, attention_mask over the whole sequence,
    past_key_values.* growing from empty [1, kv heads, 0, head size], position_ids where the graph takes them."""

    def __init__(self, session: Any, decoder: dict[str, Any]) -> None:
        names, outputs = decoder["inputs"], decoder["outputs"]
        layers = int(decoder["num_hidden_layers"])
        self.session, self.ids, self.mask = session, names["input_ids"], names["attention_mask"]
        self.kv = (int(decoder["num_key_value_heads"]), int(decoder["head_size"]))
        self.past = [t % i for t in (names["past_key_names"], names["past_value_names"]) for i in range(layers)]
        presents = [
            t % i for t in (outputs["present_key_names"], outputs["present_value_names"]) for i in range(layers)
        ]
        self.fetch = [outputs["logits"], *presents]
        self.kinds = {i.name for i in session.get_inputs()}
        known = {self.ids, self.mask, "position_ids", *self.past}
        if self.kinds - known:
            raise LmQ4Error(
                f"decoder inputs {sorted(self.kinds - known)}: not fed by the proof (known: {sorted(known)})"
            )

    def feed(self, ids: list[int], total: int, past: dict[str, Any] | None) -> dict[str, Any]:
        import numpy as np

        length = total + len(ids)
        feed: dict[str, Any] = {self.ids: np.array([ids], dtype=np.int64)}
        if self.mask in self.kinds:
            feed[self.mask] = np.ones((1, length), dtype=np.int64)
        if "position_ids" in self.kinds:
            feed["position_ids"] = np.arange(total, length, dtype=np.int64)[None, :]
        empty = np.zeros((1, *self.kv[:1], 0, self.kv[1]), dtype=np.float32)
        feed.update(past if past is not None else {name: empty for name in self.past})
        return feed

    def greedy(self, prompt: list[int], steps: int) -> list[tuple[int, Any]]:
        """[(argmax token, the last position's logits)] after the prompt and after each of `steps` greedy tokens."""
        import numpy as np

        out: list[tuple[int, Any]] = []
        ids, total, past = list(prompt), 0, None
        for _ in range(steps + 1):
            logits, *presents = self.session.run(self.fetch, self.feed(ids, total, past))
            last = np.asarray(logits, dtype=np.float32)[0, -1].copy()
            out.append((int(np.argmax(last)), last))
            total += len(ids)
            ids, past = [out[-1][0]], dict(zip(self.past, presents, strict=True))
        return out


def _aside(model_dir: Path, name: str, model: Any) -> Path:
    """A graph of ours written beside model.onnx (its external data resolves from this folder) for one session."""
    path = model_dir / f".{name}.partial"
    path.write_bytes(model.SerializeToString())
    return path


def prove_ops(model_dir: Path, candidate: Any, library: Path, prompts: list[list[int]]) -> float:
    """Every Q4MatMul / Q8MatMul of the ModelProto `candidate` against model.onnx's MatMulNBits of the same name, on the
    activations that node receives in model.onnx's run of each prompt: both in one graph over the same
    initializers (each node's own inputs), outputs within OP_TOLERANCE of the MatMulNBits' largest |value|.
    Returns the largest such fraction seen."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import helper

    reference = onnx.load(str(model_dir / MODEL_FILE), load_external_data=False)
    ours = {n.name: n for n in candidate.graph.node if n.domain == q4lib.DOMAIN and n.op_type in OURS}
    theirs = {n.name: n for n in reference.graph.node if n.name in ours and n.op_type == "MatMulNBits"}
    if set(ours) != set(theirs):
        raise LmQ4Error(
            f"{'/'.join(OURS)} nodes without a MatMulNBits of the same name: {sorted(set(ours) - set(theirs))}"
        )
    order = sorted(ours)
    acts = {name: theirs[name].input[0] for name in order}
    capture = onnx.ModelProto()
    capture.CopyFrom(reference)
    have = {o.name for o in capture.graph.output}
    fetch = list(dict.fromkeys(acts.values()))
    capture.graph.output.extend(helper.make_empty_tensor_value_info(a) for a in fetch if a not in have)
    # One graph of both ops per node, A fed from the capture: the initializers by reference, never loaded.
    inits = {t.name: t for t in [*reference.graph.initializer, *candidate.graph.initializer]}
    nodes, used, inputs = [], {}, {}
    for i, name in enumerate(order):
        for tag, node in (("mlas", theirs[name]), ("q4", ours[name])):
            copy = helper.make_node(node.op_type, [f"a{i}", *node.input[1:3]], [f"{tag}{i}"], domain=node.domain)
            copy.attribute.extend(node.attribute)
            nodes.append(copy)
            used.update({x: inits[x] for x in node.input[1:3]})
        inputs[f"a{i}"] = helper.make_tensor_value_info(f"a{i}", onnx.TensorProto.FLOAT, None)
    pairs = helper.make_graph(
        nodes,
        "q4-proof",
        list(inputs.values()),
        [helper.make_empty_tensor_value_info(f"{tag}{i}") for i in range(len(order)) for tag in ("mlas", "q4")],
        list(used.values()),
    )
    both = helper.make_model(pairs, ir_version=candidate.ir_version, opset_imports=list(candidate.opset_import))
    paths = [_aside(model_dir, "q4-capture.onnx", capture), _aside(model_dir, "q4-pairs.onnx", both)]
    try:
        session = _session(ort, paths[0], None, "ORT_DISABLE_ALL")
        decoder = _Decoder(session, json.loads((model_dir / CONFIG_FILE).read_text())["model"]["decoder"])
        seen = [dict(zip(fetch, session.run(fetch, decoder.feed(p, 0, None)), strict=True)) for p in prompts]
        del session
        session = _session(ort, paths[1], library, "ORT_DISABLE_ALL")
        worst = 0.0
        for n, values in enumerate(seen):
            out = session.run(None, {f"a{i}": values[acts[name]] for i, name in enumerate(order)})
            for i, name in enumerate(order):
                want, got = out[2 * i].astype(np.float64), out[2 * i + 1]
                frac = float(np.abs(want - got).max() / max(float(np.abs(want).max()), 1e-30))
                worst = max(worst, frac)
                if not frac <= OP_TOLERANCE:  # `not <=`: a NaN fails too
                    raise LmQ4Error(
                        f"{name}: {ours[name].op_type} differs from MatMulNBits on probe {n}'s activations by "
                        f"{frac:.3g} of their largest |value| (> {OP_TOLERANCE:g})"
                    )
        del session
    finally:
        for path in paths:
            path.unlink(missing_ok=True)
    return worst


def prove(model_dir: Path, candidate: Path, library: Path) -> dict[str, Any]:
    """The graph file `candidate` (beside model.onnx) against model.onnx: each op (prove_ops), then the whole
    decoder on the probes; the `proof` entry, or LmQ4Error naming what parts. One session at a time."""
    import numpy as np
    import onnx
    import onnxruntime as ort  # pack time only

    config = json.loads((model_dir / CONFIG_FILE).read_text())["model"]
    rng = np.random.default_rng(0)
    prompts = [[int(i) for i in rng.integers(0, int(config["vocab_size"]), n)] for n in PROBE_LENGTHS]
    op_worst = prove_ops(model_dir, onnx.load(str(candidate), load_external_data=False), library, prompts)
    runs = []
    for graph, lib, level in (
        (model_dir / MODEL_FILE, None, "ORT_ENABLE_ALL"),  # as genai opens the portable graph
        (candidate, library, GRAPH_LEVEL),
    ):
        decoder = _Decoder(_session(ort, graph, lib, level), config["decoder"])
        runs.append([decoder.greedy(p, PROBE_STEPS) for p in prompts])
        del decoder
    reference, got = runs
    return {
        "probes": len(prompts),
        "steps": PROBE_STEPS,
        "kernel": kernel(library),
        **compare(reference, got, [len(p) for p in prompts]),
        "max_op_diff_of_largest": op_worst,
        "op_tolerance": OP_TOLERANCE,
    }


ISAS = ("scalar", "avx2", "avx512vnni")  # ws_q4_isa()'s codes (handler/backends/native/ws_q4.h)


def kernel(library: Path) -> str:
    """The kernel path the library runs on this CPU (WS_Q4_ISA may force a lower one): the one the proof ran."""
    import ctypes  # deferred: only the proof's record names it

    code = int(ctypes.CDLL(str(library)).ws_q4_op_isa())
    return ISAS[code] if 0 <= code < len(ISAS) else f"unknown ({code})"


Run = list[tuple[int, Any]]  # (argmax token, logits) after the prompt and after each greedy step


def compare(reference: list[Run], got: list[Run], lengths: list[int]) -> dict[str, Any]:
    """The whole decoder's half of the proof, probe by probe (`lengths`: the prompts'): the logits within TOLERANCE
    of the reference's largest, the tokens equal; a greedy step after the first may part only on a near tie (the
    reference's margin between the two tokens not above the logits' difference there), and the rest of that probe
    is then another text, not compared. Raises LmQ4Error at the first step that fails."""
    import numpy as np

    largest = max(float(np.abs(logits).max()) for probe in reference for _, logits in probe)
    tolerance = TOLERANCE * largest
    worst, parted = 0.0, []
    for n, (a, b) in enumerate(zip(reference, got, strict=True)):
        for step, ((token_a, logits_a), (token_b, logits_b)) in enumerate(zip(a, b, strict=True)):
            diff = float(np.abs(np.asarray(logits_a, dtype=np.float64) - logits_b).max())
            worst = max(worst, diff)
            where = f"probe {n} ({lengths[n]} tokens) step {step}"
            if not diff <= tolerance:  # `not <=`: a NaN fails too
                raise LmQ4Error(
                    f"{where}: logits differ from model.onnx's by {diff:.3g} > the tolerance {tolerance:.3g} "
                    f"({TOLERANCE:g} of the largest |logit| {largest:.3g})"
                )
            if token_a == token_b:
                continue
            margin = float(logits_a[token_a] - logits_a[token_b])
            if step == 0 or margin > diff:
                raise LmQ4Error(
                    f"{where}: token {token_b} != model.onnx's {token_a} (its margin {margin:.3g}, the logits' max "
                    f"diff {diff:.3g})"
                )
            parted.append([n, step])
            break
    return {
        "max_abs_logit_diff": worst,
        "tolerance": tolerance,
        "tolerance_of_largest_logit": TOLERANCE,
        "parted_on_near_ties": parted,
    }


# -- a pack --


def find_library(build: bool = True) -> tuple[Path | None, str]:
    """The op's library the proof registers: q4lib.library() (WARMSTART_Q4_LIBRARY, else the build beside
    q4lib), else, with `build` and gcc on the PATH, q4lib.build() into that default place; (None, why) else."""
    import subprocess

    try:
        path, why = q4lib.library()
    except ConfigError as e:
        return None, str(e)
    if path is not None or not build:
        return path, why
    cc = os.environ.get("CC") or "gcc"
    if shutil.which(cc) is None:
        return None, f"{why}; no C compiler ({cc}) to build it"
    phase(f"building the {q4lib.OP} library (gcc)")
    try:
        return q4lib.build(), ""
    except (OSError, subprocess.CalledProcessError) as e:
        return None, f"{why}; building it failed ({e})"


def attach(model_dir: Path, quantize: str | None) -> tuple[dict[str, Any] | None, str]:
    """For the packer (infra.pack.lm_pack): (the q4 entry, "") once model.q4.onnx is written into `model_dir`,
    or (None, why not); never raises for a pack it cannot rewrite: the pack goes on without it."""
    if quantize != "int4":
        return None, f"{quantize or 'float32'} pack: the op computes 4-bit blocks only (--quantize int4)"
    library, why = find_library()
    if library is None:
        return None, why
    try:
        return make(model_dir, library), ""
    except LmQ4Error as e:
        return None, str(e)


def add(pack_dir: Path, library: Path | None = None) -> dict[str, Any]:
    """Write model.q4.onnx into the published int4 generate pack `pack_dir` and record it in the manifest
    (`files` and `backends.genai.q4`; a `q4_skipped` reason removed), replacing an earlier one; returns the entry.
    LmQ4Error (the pack untouched) when it is not such a pack, no library, or the proof fails."""
    pack_dir = Path(pack_dir).resolve()
    manifest = load_manifest(pack_dir)
    if manifest.task != "generate" or "genai" not in manifest.backends:
        raise LmQ4Error(f"{pack_dir}: not a generate pack for the genai backend")
    quantize = (manifest.raw.get("precision") or {}).get("quantization")
    if quantize != "int4":
        raise LmQ4Error(f"{pack_dir}: a {quantize or 'float32'} pack; the op computes 4-bit blocks only (int4 packs)")
    if library is None:
        library, why = find_library()
        if library is None:
            raise LmQ4Error(f"{pack_dir}: no Q4MatMul library: {why}")
    entry = make(pack_dir, library)
    _record(pack_dir, entry)
    return entry


def ensure(pack_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """`warmstart optimize DIR` on a generate pack: the q4 graph added where the pack has none (a pack made before
    it, or one whose layout was redone), one it has kept as it is; (the entry, what was done) or (None, why not),
    the reason then recorded as `backends.genai.q4_skipped`."""
    pack_dir = Path(pack_dir).resolve()
    genai = load_manifest(pack_dir).backends.get("genai") or {}
    if genai.get("q4"):
        return genai["q4"], "kept (the pack has it)"
    try:
        return add(pack_dir), "added"
    except LmQ4Error as e:
        _record(pack_dir, None, str(e))
        return None, str(e)


def _record(pack_dir: Path, entry: dict[str, Any] | None, skipped: str = "") -> None:
    """The q4 file's size and SHA-256 and the entry in the manifest (or, with no entry, why it was skipped):
    written aside and renamed."""
    path = pack_dir / MANIFEST_NAME
    raw = json.loads(path.read_text())
    genai = raw["backends"]["genai"]
    if entry is None:
        genai["q4_skipped"] = skipped
    else:
        for name in entry["files"]:
            raw["files"][name] = {"size": (pack_dir / name).stat().st_size, "sha256": sha256_file(pack_dir / name)}
        genai.pop("q4_skipped", None)
        genai["q4"] = entry
    tmp = path.with_name(f".{MANIFEST_NAME}.tmp")
    tmp.write_text(json.dumps(raw, indent=2) + "\n")
    os.replace(tmp, path)
    load_manifest(pack_dir)  # what we wrote must read back


__all__ = [
    "GRAPH_LEVEL",
    "OP_NAME",
    "OP_Q8_NAME",
    "Q4_FILE",
    "TOLERANCE",
    "LmQ4Error",
    "add",
    "attach",
    "ensure",
    "make",
    "rewrite",
]
