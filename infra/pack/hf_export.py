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
"""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from infra.pack.families import NEW_FAMILIES, layer_type_masks
from infra.pack.hf_checks import SourceError, check_loading_info
from infra.pack.hf_source import DenseLayer, HFSource
from infra.pack.onnx_io import OPSET

ATOL = 1e-4  # export and fusion checks: max abs difference against the eager model
OUTPUT_NAMES = {"embedding": "sentence_embedding", "rerank": "scores", "classify": "logits"}
# ORT's optimizer model types: encoder-only families all match its "bert" patterns (MPNet's relative position
# bias keeps its attention unfused; the layer norms and gelu still fuse).
_FUSION_MODEL_TYPE = "bert"


class ExportError(RuntimeError):
    """The exported graph does not reproduce the model (never packed)."""


@dataclass(frozen=True)
class Exported:
    model: Any  # onnx.ModelProto with its initializers inline (save_onnx moves them out, page-aligned)
    input_names: tuple[str, ...]
    output_name: str
    fused: bool
    max_abs_diff: float  # exported graph vs the eager model on the probe batches
    fused_max_abs_diff: float | None  # fused vs unfused graph, when fusion was tried


def input_names(source: HFSource) -> tuple[str, ...]:
    names = ("input_ids", "attention_mask")
    return (*names, "token_type_ids") if source.token_types else names


def load_torch_model(source: HFSource, safetensors_dir: Path) -> Any:
    """The transformers model from `safetensors_dir` (config.json + model.safetensors), in eval mode, float32."""
    import transformers  # pack time only: seconds to import, never on the function's import chain

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    transformers.logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # "Loading weights" bars
    cls = transformers.AutoModelForSequenceClassification if source.sequence_classification else transformers.AutoModel
    transformers.AttentionInterface.register(EXPORT_ATTENTION, _export_attention)
    new = NEW_FAMILIES.get(source.family)
    # MPNet has its own attention (relative position bias), outside transformers' attention interface; the newer
    # families build their own masks (causal, local windows, disentangled attention): transformers' eager attention.
    bert_mask = new is None or new.mask == "bert"
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
    check_loading_info(source.weights, type(model).__name__, info, model.base_model_prefix, source.task == "embedding")
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

    pooling, normalize, task, activation = source.pooling, source.normalize, source.task, source.activation
    with_types = source.token_types
    new = NEW_FAMILIES.get(source.family)
    mask_kind = new.mask if new is not None else "bert"
    config = model.config
    dense = [dense_module(layer) for layer in source.dense]

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
            if task == "embedding":
                tokens = out.last_hidden_state.float() if wide else out.last_hidden_state
                emb = pool(tokens, attention_mask, str(pooling))
                for layer in self.dense:
                    emb = layer(emb)
                return torch.nn.functional.normalize(emb, p=2.0, dim=1) if normalize else emb
            logits = out.logits.float() if wide else out.logits
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


def export(source: HFSource, safetensors_dir: Path, fuse: bool = True, fuse_attention: bool = True) -> Exported:
    """Export, check against the eager model, then try ORT's fusions (kept when outputs still match).
    `fuse_attention=False`: every fusion but Attention's (q, k and v stay MatMuls, for `--quantize int8`)."""
    import onnx
    import torch

    model = load_torch_model(source, safetensors_dir)
    head = build_head(source, model)
    names = input_names(source)
    output = OUTPUT_NAMES[source.task]
    vocab_size = int(source.config["vocab_size"])
    probes = probe_batches(source, vocab_size)
    example = tuple(torch.from_numpy(probes[1][n]) for n in names)  # padded rows: the masked code path is traced
    dynamic = {n: {0: "batch", 1: "sequence"} for n in names}
    dynamic[output] = {0: "batch"}
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad(), warnings.catch_warnings():
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
        graph = onnx.load(str(path), load_external_data=True)
        expected = [head(*(torch.from_numpy(p[n]) for n in names)).numpy() for p in probes]
    diff = _max_diff(run_onnx(graph, probes), expected)
    if not diff <= ATOL:
        raise ExportError(f"{source.root}: the exported graph differs from the model by {diff:.3g} (> {ATOL})")
    new = NEW_FAMILIES.get(source.family)
    if not fuse or (new is not None and not new.fuse):  # ORT's BERT patterns: nothing of these graphs matches
        return Exported(graph, names, output, False, diff, None)
    fused, fused_diff = _fuse(source, graph, probes, fuse_attention)
    if fused is None:
        return Exported(graph, names, output, False, diff, fused_diff)
    return Exported(fused, names, output, True, diff, fused_diff)


def _fuse(
    source: HFSource, graph: Any, probes: list[dict[str, npt.NDArray[np.int64]]], attention: bool = True
) -> tuple[Any | None, float | None]:
    """ORT's transformer fusions; the fused graph, or None when nothing fused or outputs moved."""
    import contextlib
    import io
    import logging

    import onnx
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    # The optimizer logs each fusion (and its shape-inference fallbacks) through loggers named after its
    # modules: quiet for the call, at pack time.
    options = FusionOptions(_FUSION_MODEL_TYPE)
    # Not EmbedLayerNormalization: on all-MiniLM-L6-v2 its CPU kernel made warm inference 2-7% slower than the
    # unfused Gather + Add + LayerNormalization (1 thread, CPU time per call, 300 interleaved calls: 1 text 4.46 vs
    # 4.23 ms, 32 texts 132.0 vs 121.5, one 256-token text 68.7 vs 62.9), more than it saves at session build.
    options.enable_embed_layer_norm = False
    options.enable_attention = attention
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):  # and it print()s some
            warnings.simplefilter("ignore")
            optimized = optimize_model(
                onnx.ModelProto.FromString(graph.SerializeToString()),  # it rewrites the proto it is given
                model_type=_FUSION_MODEL_TYPE,
                num_heads=source.num_heads,
                hidden_size=source.hidden_size,
                opt_level=0,
                optimization_options=options,
            )
    finally:
        logging.disable(logging.NOTSET)
    fused = optimized.model
    domains = {o.domain for o in fused.opset_import}
    for node_domain in sorted({n.domain for n in fused.graph.node} - domains - {"", "ai.onnx"}):
        fused.opset_import.add(domain=node_domain, version=1)  # the fused contrib ops' domain (com.microsoft)
    before = {n.op_type for n in graph.graph.node}
    after = {n.op_type for n in fused.graph.node}
    if not (after - before):
        return None, None  # no fused operator appeared: keep the plain graph
    unfused_out = run_onnx(graph, probes)
    try:
        fused_out = run_onnx(fused, probes)
    except Exception:  # a fusion ORT cannot run on this graph: the plain graph is the safe answer
        return None, None
    diff = _max_diff(fused_out, unfused_out)
    return (fused, diff) if diff <= ATOL else (None, diff)


def run_onnx(graph: Any, probes: list[dict[str, npt.NDArray[np.int64]]]) -> list[npt.NDArray[np.float32]]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(graph.SerializeToString(), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    return [np.asarray(session.run(None, {k: v for k, v in p.items() if k in wanted})[0]) for p in probes]


def _max_diff(got: list[npt.NDArray[np.float32]], want: list[npt.NDArray[np.float32]]) -> float:
    return max(
        float(np.max(np.abs(np.asarray(g) - np.asarray(w)))) if np.size(w) else 0.0
        for g, w in zip(got, want, strict=True)
    )
