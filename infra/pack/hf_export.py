"""Exporting a checked model directory (`HFSource`) to ONNX with `torch.onnx`, the task's head in the graph.

The Hugging Face model is loaded with transformers (pack time only) and wrapped in a module that ends the
graph where the task wants it: pooling + normalize (`sentence_embedding`), the cross-encoder's activation
(`scores`, what `CrossEncoder.predict` returns) or the raw `logits` (softmax/sigmoid are the task's job).

Exporter: torch's TorchScript-based exporter (`dynamo=False`). The torch.export-based one needs onnxscript, and
tracing transformers' encoders at a padded example gives a graph with dynamic batch and sequence axes that
matches the eager model (checked here on every export, at several shapes, before anything is kept).

ORT's transformer fusions (`onnxruntime.transformers.optimizer`: attention, skip-layernorm, gelu; not the
embedding layernorm, slower at run time: `_fuse`) are applied at opt level 0 (the portable python fusions only,
no device-specific rewrites) and kept only when the fused graph's outputs still match the unfused one's.

Pack memory: hf_pack loads the model once and computes its reference outputs once (`Reference`) for
both exports; the graph is written to disk a tensor at a time (`export_graph`), then checked and fused from the
file with the torch model freed (`check_graph`, `fuse_graph`); ONNX Runtime maps the file, without prepacking.
What remains is torch.onnx's own: under 2 GB the TorchScript exporter serializes the graph with its weights in
memory (a few copies of them at its peak); past 2 GB it writes each tensor to a file of its own.

About one thing (one model's export: load, head, graph, check, fusion, each step freeing what the next does not
need), hence its length.
"""

from __future__ import annotations

import gc
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from infra.pack import hybrid_source
from infra.pack.families import NEW_FAMILIES, layer_type_masks
from infra.pack.hf_checks import SourceError, check_loading_info, config_refusal
from infra.pack.hf_source import DenseLayer, HFSource, UnsupportedModelError
from infra.pack.onnx_io import OPSET
from infra.pack.sparse_source import splade

ATOL = 1e-4  # export and fusion checks: max abs difference against the eager model
SEQUENCE_TASKS = ("multivector", "hybrid")  # an output row per token: (batch, sequence, width)
OUTPUT_NAMES = {
    "embedding": "sentence_embedding",
    "rerank": "scores",
    "classify": "logits",
    "multivector": "token_embeddings",
    "sparse": "sparse_embedding",
    "hybrid": "token_outputs",
}
# ORT's optimizer model types: encoder-only families all match its "bert" patterns (MPNet's relative position
# bias keeps its attention unfused; the layer norms and gelu still fuse).
_FUSION_MODEL_TYPE = "bert"
_PROTO_LIMIT = (2 << 30) - (64 << 20)  # protobuf's 2 GB, less room for the graph itself


class ExportError(RuntimeError):
    """The exported graph does not reproduce the model (never packed)."""


@dataclass(frozen=True)
class Exported:
    where: Path  # model.onnx + page-aligned model.onnx.data (onnx_io.save_onnx_file), the fused graph if kept
    input_names: tuple[str, ...]
    output_name: str
    fused: bool
    max_abs_diff: float  # exported graph vs the eager model on the probe batches
    fused_max_abs_diff: float | None  # fused vs unfused graph, when fusion was tried

    @property
    def model(self) -> Any:
        """The graph as one onnx.ModelProto with its weights loaded, for a caller that rewrites it (the whole
        graph in memory: under 2 GB only)."""
        import onnx

        from infra.pack.onnx_io import ONNX_FILE

        return onnx.load(str(self.where / ONNX_FILE), load_external_data=True)


@dataclass(frozen=True)
class Reference:
    """The eager model's outputs on the probe batches, computed once per pack and shared by the ONNX graph's
    and the torch program's checks (a forward pass of a 0.6B model on each batch is seconds)."""

    probes: list[dict[str, npt.NDArray[np.int64]]]
    outputs: list[npt.NDArray[np.float32]]


def reference_outputs(source: HFSource, model: Any) -> Reference:
    """`model` with the task's head on `probe_batches` and on a one-token batch (the smallest shape)."""
    import torch

    head = build_head(source, model)
    names = input_names(source)
    probes = probe_batches(source, int(source.config["vocab_size"]))
    probes.append({k: v[:1, :1] for k, v in probes[0].items()})
    try:
        with torch.inference_mode():
            outputs = [head(*(torch.from_numpy(p[n]) for n in names)).numpy() for p in probes]
    except Exception as e:  # a config built into a model whose forward pass fails (a hostile field's value)
        raise config_refusal(source.model_root / "config.json", source.config, e, "run the model") from None
    bad = sum(int(np.size(o) - np.count_nonzero(np.isfinite(o))) for o in outputs)
    if bad:  # weights that hold NaN or inf: no export can be proved equal to answers a JSON reply cannot carry
        total = sum(int(np.size(o)) for o in outputs)
        raise UnsupportedModelError(
            f"{source.root}: the model's outputs on the probe inputs are not finite ({bad} of {total} values NaN "
            "or infinite): its weights or config give them"
        )
    return Reference(probes, outputs)


def free_memory() -> None:
    """Collect reference cycles (transformers' and torch.export's modules hold the model in them), then hand
    freed heap pages back to the system (glibc keeps them for reuse otherwise: pack peaks add up across steps)."""
    import ctypes
    import ctypes.util

    gc.collect()
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    trim = getattr(libc, "malloc_trim", None)  # glibc only (musl, macOS: nothing to do)
    if trim is not None:
        trim(0)


def input_names(source: HFSource) -> tuple[str, ...]:
    names = ("input_ids", "attention_mask")
    return (*names, "token_type_ids") if source.token_types else names


def load_torch_model(source: HFSource, safetensors_dir: Path) -> Any:
    """The transformers model from `safetensors_dir` (config.json + model.safetensors), in eval mode, float32."""
    import transformers  # pack time only: seconds to import, never on the function's import chain

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    transformers.logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # "Loading weights" bars
    cls: Any = transformers.AutoModel
    if source.logit_score is not None:  # a decoder reranker: the LM head's two rows (infra.pack.lm_rerank)
        cls = transformers.AutoModelForCausalLM
    elif source.sequence_classification:
        cls = transformers.AutoModelForSequenceClassification
    elif source.task == "sparse":  # SPLADE pools the MLM head's logits
        cls = transformers.AutoModelForMaskedLM
    transformers.AttentionInterface.register(EXPORT_ATTENTION, _export_attention)
    new = NEW_FAMILIES.get(source.family)
    # MPNet has its own attention (relative position bias), outside transformers' attention interface; the newer
    # families build their own masks (causal, local windows, disentangled attention): transformers' eager attention.
    bert_mask = new is None or new.mask == "bert"
    try:
        model, info = cls.from_pretrained(
            str(safetensors_dir),
            local_files_only=True,
            use_safetensors=True,
            # MPNet has its own attention (relative position bias), outside transformers' attention interface.
            attn_implementation=EXPORT_ATTENTION if bert_mask and source.family != "mpnet" else "eager",
            dtype="float32",
            output_loading_info=True,  # missing / unexpected / mismatched tensors: refused, never filled at random
            ignore_mismatched_sizes=True,  # reported in `info` (and refused there) rather than raised mid-load
        )
    except Exception as e:  # a config its class accepts but cannot build (an unknown activation: KeyError)
        raise config_refusal(source.model_root / "config.json", source.config, e, "build the model") from None
    embedding = source.task in ("embedding", "hybrid")
    check_loading_info(source.weights, type(model).__name__, info, model.base_model_prefix, embedding)
    # One forward pass per batch, nothing generated: no key/value cache (a decoder's default). Its sliding-window
    # layers (Gemma 3) slice the cache by the sequence length, which torch.export cannot keep dynamic.
    if getattr(model.config, "use_cache", False):
        model.config.use_cache = False
    return model.eval()


EXPORT_ATTENTION = "warmstart_export"


def _export_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """transformers' eager attention, written as BERT's classic graph (scores / sqrt(d) + additive mask) so that
    ORT's attention fusion recognizes it: transformers 5's eager attention multiplies by the scale, and its
    `Add(Mul(scores), Mul(mask))` is ambiguous to the fusion's pattern matcher."""
    import math

    import torch

    head_dim = query.size(-1)
    scores = torch.matmul(query, key.transpose(2, 3))
    if scaling is None or math.isclose(scaling, head_dim**-0.5, rel_tol=1e-6):
        scores = scores / math.sqrt(head_dim)
    else:
        scores = scores * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = torch.nn.functional.softmax(scores, dim=-1)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def build_head(source: HFSource, model: Any) -> Any:
    """A torch module: the model plus the task's head, taking `input_names(source)` positionally."""
    import torch

    if source.logit_score is not None:
        from infra.pack.lm_rerank import score_head

        return score_head(model, source.logit_score, source.activation, source.family)

    pooling, normalize, task, activation = source.pooling, source.normalize, source.task, source.activation
    splade_settings = source.splade
    with_types = source.token_types
    new = NEW_FAMILIES.get(source.family)
    mask_kind = new.mask if new is not None else "bert"
    config = model.config
    dense = [dense_module(layer) for layer in source.dense]
    if task == "hybrid":  # bge-m3's heads: per token, its lexical weight and its multi-vector
        dense = [hybrid_source.linear(source.hybrid.sparse), hybrid_source.linear(source.hybrid.colbert)]

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.dense = torch.nn.ModuleList(dense)

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> Any:
            # The additive 4D mask (0 keep, float32 min drop) is the classic BERT pattern ORT's attention fusion
            # recognizes; transformers passes a 4D mask through as is (the same scores as its 2D path).
            mask: Any = attention_mask  # "2d": the model builds its own masks (causal, local windows)
            dtype = self.model.dtype  # float32, or the torch program's float16 / bfloat16 (--dtype)
            if mask_kind == "bert":
                keep = attention_mask.unsqueeze(1).unsqueeze(2).to(dtype)
                mask = (1.0 - keep) * torch.finfo(dtype).min
            elif mask_kind == "gemma3":
                mask = layer_type_masks(config, attention_mask)
            kwargs = {"input_ids": input_ids, "attention_mask": mask}
            if with_types:
                kwargs["token_type_ids"] = token_type_ids
            out = self.model(**kwargs)
            wide = dtype != torch.float32  # reduced precision: the head (pooling, normalize) runs in float32
            if task == "multivector":  # every token projected and unit length (PyLate's encode); masking: the task's
                tokens = out.last_hidden_state.float() if wide else out.last_hidden_state
                for layer in self.dense:
                    tokens = layer(tokens)
                return torch.nn.functional.normalize(tokens, p=2.0, dim=-1)
            if task == "hybrid":  # per token: [hidden, unit length | lexical weight | multi-vector, unit length]
                tokens = out.last_hidden_state.float() if wide else out.last_hidden_state
                unit = torch.nn.functional.normalize
                weights = torch.relu(self.dense[0](tokens))
                return torch.cat([unit(tokens, dim=-1), weights, unit(self.dense[1](tokens), dim=-1)], dim=-1)
            if task == "embedding":
                tokens = out.last_hidden_state.float() if wide else out.last_hidden_state
                emb = pool(tokens, attention_mask, str(pooling))
                for layer in self.dense:
                    emb = layer(emb)
                return torch.nn.functional.normalize(emb, p=2.0, dim=1) if normalize else emb
            logits = out.logits.float() if wide else out.logits
            if task == "sparse":  # one (vocabulary-wide) row per text; the task keeps its non-zero entries
                assert splade_settings is not None
                return splade(logits, attention_mask, splade_settings)
            if task == "rerank":
                scores = logits[:, 0]
                return torch.sigmoid(scores) if activation == "sigmoid" else scores
            return logits

    return Head().eval()


_DENSE_ACTIVATIONS = {"identity": "Identity", "tanh": "Tanh", "relu": "ReLU", "gelu": "GELU", "sigmoid": "Sigmoid"}


def dense_module(layer: DenseLayer) -> Any:
    """A sentence-transformers Dense module as torch: Linear (+ bias) then its activation, weights from its folder
    (safetensors, or a pytorch_model.bin through torch.load(weights_only=True)); any other tensor is refused."""
    import torch

    try:
        if layer.weights.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(layer.weights))
        else:
            state = torch.load(str(layer.weights), map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated file, a pickle that is not plain tensors
        raise SourceError(f"{layer.weights}: not loadable as plain tensors ({type(e).__name__}: {e})"[:400]) from None
    want = {"linear.weight": [layer.out_features, layer.in_features]}
    if layer.bias:
        want["linear.bias"] = [layer.out_features]
    got = {k: list(v.shape) for k, v in state.items()} if isinstance(state, dict) else {}
    if got != want:
        raise SourceError(f"{layer.weights}: tensors {got}; the Dense config says {want}"[:400])
    linear = torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias)
    linear.load_state_dict({k.removeprefix("linear."): v.to(torch.float32) for k, v in state.items()})
    return torch.nn.Sequential(linear, getattr(torch.nn, _DENSE_ACTIVATIONS[layer.activation])()).eval()


def pool(tokens: Any, attention_mask: Any, mode: str) -> Any:
    """sentence-transformers' Pooling (right padding): the same arithmetic, so the graph matches `encode`."""
    import torch

    mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
    if mode == "mean":
        return (tokens * mask).sum(dim=1) / torch.clamp(mask.sum(dim=1), min=1e-9)
    if mode == "max":
        return tokens.masked_fill(mask == 0, float("-inf")).max(dim=1).values
    if mode == "cls":
        return tokens[:, 0]
    if mode == "lasttoken":
        last = attention_mask.to(torch.int64).sum(dim=1) - 1  # right padding: the last real token
        index = torch.clamp(last, min=0).view(-1, 1, 1).expand(-1, 1, tokens.shape[-1])
        return torch.gather(tokens * mask, 1, index).squeeze(1)
    raise ValueError(f"pooling mode {mode!r}")


def probe_batches(source: HFSource, vocab_size: int, seed: int = 0) -> list[dict[str, npt.NDArray[np.int64]]]:
    """Token batches of several shapes with right padding (the runtime pads right), for export checks."""
    rng = np.random.default_rng(seed)
    batches = []
    shapes = [(1, 5), (3, 11), (2, min(source.max_seq_length, 40))]
    if source.max_seq_length > 40:  # past local attention windows and relative position buckets (128 at most)
        shapes.append((2, min(source.max_seq_length, 128)))
    for batch, length in shapes:
        ids = rng.integers(5, vocab_size, size=(batch, length), dtype=np.int64)
        mask = np.ones_like(ids)
        for row in range(1, batch):  # every row after the first shorter: padding inside the batch
            mask[row, max(2, length - 3 * row) :] = 0
        pad = int(source.config.get("pad_token_id") or 0)
        ids = np.where(mask == 1, ids, pad)
        feed = {"input_ids": ids, "attention_mask": mask}
        if source.token_types:
            types = np.zeros_like(ids)
            types[:, length // 2 :] = 1
            feed["token_type_ids"] = types * mask
        batches.append(feed)
    return batches


def export(
    source: HFSource,
    safetensors_dir: Path,
    fuse: bool = True,
    *,
    fuse_attention: bool = True,
    where: Path | None = None,
    model: Any = None,
    reference: Reference | None = None,
) -> Exported:
    """Export to `where` (default `safetensors_dir`/onnx: model.onnx + model.onnx.data), check against the eager
    model, then try ORT's fusions (kept when outputs still match). `model` (else loaded from `safetensors_dir`)
    is not needed by the fusion step: a caller that passes it and drops its own reference lets it be freed
    before (export_graph + fuse_graph, as hf_pack does). `fuse_attention=False`: every fusion but Attention's
    (q, k and v stay MatMuls, for `--quantize int8`)."""
    where = where or safetensors_dir / "onnx"
    if model is None:
        model = load_torch_model(source, safetensors_dir)
    reference = reference or reference_outputs(source, model)
    export_graph(source, model, reference, where)
    del model
    free_memory()
    diff, unfused = check_graph(source, where, reference)
    return fuse_graph(source, where, reference, diff, unfused, fuse, fuse_attention)


def export_graph(source: HFSource, model: Any, reference: Reference, where: Path) -> None:
    """torch.onnx's graph of `model` with the task's head, written to `where` with its weights page-aligned in
    model.onnx.data, one tensor at a time (never the whole graph with its weights in one proto). Unchecked:
    `check_graph` compares it with the eager model's outputs, which needs no model (free it before)."""
    import torch

    from infra.pack.onnx_io import save_onnx_file

    head = build_head(source, model)
    names = input_names(source)
    output = OUTPUT_NAMES[source.task]
    example = tuple(torch.from_numpy(reference.probes[1][n]) for n in names)  # padded rows: the masked path
    dynamic = {n: {0: "batch", 1: "sequence"} for n in names}
    dynamic[output] = {0: "batch", 1: "sequence"} if source.task in SEQUENCE_TASKS else {0: "batch"}
    where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=where.parent) as tmp, torch.no_grad(), warnings.catch_warnings():
        # The TorchScript exporter warns that it is deprecated and that tracing turns python values into
        # constants (shape arithmetic in transformers' masking, exact for any shape): checked below instead.
        warnings.simplefilter("ignore")
        path = Path(tmp) / "model.onnx"
        torch.onnx.export(
            head,
            example,
            str(path),
            input_names=list(names),
            output_names=[output],
            dynamic_axes=dynamic,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
        del head
        free_memory()  # the exporter's graph and folded constants, before the weights are rewritten
        # Past 2 GB the exporter writes each tensor to its own file beside the graph; below, inline: either way
        # they are copied into one page-aligned data file a tensor at a time.
        save_onnx_file(path, where)


def check_graph(source: HFSource, where: Path, reference: Reference) -> tuple[float, list[npt.NDArray[np.float32]]]:
    """The graph in `where` against the eager model's `reference` outputs: the largest difference and the
    graph's outputs; ExportError past ATOL."""
    from infra.pack.onnx_io import ONNX_FILE

    got = run_onnx(where / ONNX_FILE, reference.probes)
    diff = _max_diff(got, reference.outputs)
    if not diff <= ATOL:
        raise ExportError(f"{source.root}: the exported graph differs from the model by {diff:.3g} (> {ATOL})")
    return diff, got


def fuse_graph(
    source: HFSource,
    where: Path,
    reference: Reference,
    diff: float,
    unfused: list[npt.NDArray[np.float32]],
    fuse: bool = True,
    fuse_attention: bool = True,
) -> Exported:
    """ORT's fusions of the graph in `where`, kept (replacing it) when its outputs match the unfused graph's."""
    names, output = input_names(source), OUTPUT_NAMES[source.task]
    new = NEW_FAMILIES.get(source.family)
    if not fuse or (new is not None and not new.fuse):  # ORT's BERT patterns: nothing of these graphs matches
        return Exported(where, names, output, False, diff, None)
    fused, fused_diff = _fuse(source, where, reference.probes, unfused, fuse_attention)
    return Exported(where, names, output, fused, diff, fused_diff)


def _fuse(
    source: HFSource,
    where: Path,
    probes: list[dict[str, npt.NDArray[np.int64]]],
    unfused: list[Any],
    attention: bool = True,
) -> tuple[bool, float | None]:
    """ORT's transformer fusions of the graph in `where`: (True, diff) when the fused graph replaced it, else
    (False, diff or None): nothing fused, ORT cannot run it, or its outputs moved from `unfused`'s."""
    import contextlib
    import io
    import logging
    import shutil

    import onnx
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    from infra.pack.onnx_io import ONNX_DATA, ONNX_FILE, save_onnx_file

    # The optimizer logs each fusion (and its shape-inference fallbacks) through loggers named after its
    # modules: quiet for the call, at pack time.
    options = FusionOptions(_FUSION_MODEL_TYPE)
    # Not EmbedLayerNormalization: on all-MiniLM-L6-v2 its CPU kernel made warm inference 2-7% slower than the
    # unfused Gather + Add + LayerNormalization (1 thread, CPU time per call, 300 interleaved calls: 1 text 4.46 vs
    # 4.23 ms, 32 texts 132.0 vs 121.5, one 256-token text 68.7 vs 62.9), more than it saves at session build.
    options.enable_embed_layer_norm = False
    options.enable_attention = attention
    # SkipLayerNormalization is left as it is, though it does not fuse on a normalized embedding graph: the
    # fusion needs ORT's symbolic shape inference, which has no rule for the head's ReduceL2 and gives up. Forced
    # (skip_layer_norm in b1_split_driver.py) it made all-MiniLM-L6-v2 slower at 1 thread: 1 text 4.42 vs 4.25
    # ms CPU, 32 texts 113.3 vs 104.6 (bench_b1_split.py --graphs; both in git at 5ebe02f). Not measured on the
    # graphs where it does fuse.
    if (where / ONNX_DATA).stat().st_size >= _PROTO_LIMIT:
        # ORT's python fusions work on one in-memory proto (shape inference serializes it): past protobuf's 2 GB
        # they fail, so a graph that big (bge-m3's 2.27 GB) keeps its plain graph, as before it could not pack.
        return False, None
    graph = onnx.load(str(where / ONNX_FILE), load_external_data=True)  # the optimizer rewrites it in place
    before = {n.op_type for n in graph.graph.node}
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):  # and it print()s some
            warnings.simplefilter("ignore")
            optimized = optimize_model(
                graph,
                model_type=_FUSION_MODEL_TYPE,
                num_heads=source.num_heads,
                hidden_size=source.hidden_size,
                opt_level=0,
                optimization_options=options,
            )
    finally:
        logging.disable(logging.NOTSET)
    fused = optimized.model
    del optimized, graph
    domains = {o.domain for o in fused.opset_import}
    for node_domain in sorted({n.domain for n in fused.graph.node} - domains - {"", "ai.onnx"}):
        fused.opset_import.add(domain=node_domain, version=1)  # the fused contrib ops' domain (com.microsoft)
    after = {n.op_type for n in fused.graph.node}
    if not (after - before):
        return False, None  # no fused operator appeared: keep the plain graph
    with tempfile.TemporaryDirectory(dir=where.parent) as tmp:
        candidate = Path(tmp) / "fused"
        save_onnx_file(fused, candidate)
        del fused
        free_memory()
        try:
            fused_out = run_onnx(candidate / ONNX_FILE, probes)
        except Exception:  # a fusion ORT cannot run on this graph: the plain graph is the safe answer
            return False, None
        diff = _max_diff(fused_out, unfused)
        if not diff <= ATOL:
            return False, diff
        shutil.rmtree(where)
        shutil.move(candidate, where)
    return True, diff


def run_onnx(graph: Any, probes: list[dict[str, npt.NDArray[np.int64]]]) -> list[npt.NDArray[np.float32]]:
    """The graph's outputs on `probes`. `graph`: a model.onnx path (its page-aligned external data is mapped,
    not read: pack memory) or an onnx.ModelProto under 2 GB."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    # Pack memory: no second copy of the MatMul weights in MLAS's blocked layout, no arena kept after the run.
    options.add_session_config_entry("session.disable_prepacking", "1")
    options.enable_cpu_mem_arena = False
    model = str(graph) if isinstance(graph, Path) else graph.SerializeToString()
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    return [np.asarray(session.run(None, {k: v for k, v in p.items() if k in wanted})[0]) for p in probes]


def _max_diff(got: list[npt.NDArray[np.float32]], want: list[npt.NDArray[np.float32]]) -> float:
    return max(
        float(np.max(np.abs(np.asarray(g) - np.asarray(w)))) if np.size(w) else 0.0
        for g, w in zip(got, want, strict=True)
    )
