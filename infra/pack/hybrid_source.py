"""bge-m3's layout (FlagEmbedding's `BGEM3`), for `hf_source` and the export: a sentence-transformers directory
(Transformer -> Pooling cls -> Normalize: the dense vector) with two heads beside it, `sparse_linear.pt`
(Linear hidden -> 1: each token's lexical weight) and `colbert_linear.pt` (Linear hidden -> d: each token's
multi-vector), packed as task `hybrid`: one forward pass, all three outputs.

The graph's one output, per token: [the hidden state, unit length | relu(sparse_linear) | colbert_linear, unit
length]; the task reads the CLS row's first part (dense), the middle column (sparse, max per token id) and
the rest of the rows after CLS (multi-vector), as `BGEM3FlagModel.encode` post-processes them.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from infra.pack.hf_checks import SourceError, open_source

HEADS = ("sparse_linear.pt", "colbert_linear.pt")
# FlagEmbedding drops these tokens' lexical weights (`_process_token_weights`).
UNUSED = ("cls_token", "eos_token", "pad_token", "unk_token")


@dataclass(frozen=True)
class Heads:
    sparse: Path
    colbert: Path
    colbert_dim: int = 0  # known once the weights are read (`load_heads`)
    unused_ids: tuple[int, ...] = ()  # resolved by the tokenizer (`resolved`)


def is_hybrid(root: Path) -> bool:
    return all((root / name).is_file() for name in HEADS)


def heads(root: Path, hidden: int) -> Heads:
    """The two heads' files, their tensors checked (shapes, plain tensors only) before any export."""
    sparse, colbert = (_state(root / name) for name in HEADS)
    _check(root / HEADS[0], sparse, hidden, 1)
    width = int(colbert["weight"].shape[0]) if "weight" in colbert else 0
    _check(root / HEADS[1], colbert, hidden, width)
    return Heads(root / HEADS[0], root / HEADS[1], colbert_dim=width)


def _state(path: Path) -> dict[str, Any]:
    import torch  # pack time only

    with open_source(path) as f:  # a regular file only (a FIFO would hang the pack), as every source file
        data = f.read()
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated file, a pickle that is not plain tensors
        raise SourceError(f"{path}: not loadable as plain tensors ({type(e).__name__}: {e})"[:400]) from None
    if not isinstance(state, dict):
        raise SourceError(f"{path}: expected a Linear's state dict (weight, bias), found {type(state).__name__}")
    return state


def _check(path: Path, state: dict[str, Any], hidden: int, width: int) -> None:
    want = {"weight": [width, hidden], "bias": [width]}
    got = {k: list(getattr(v, "shape", ())) for k, v in state.items()}
    if width < 1 or got != want:
        raise SourceError(f"{path}: tensors {got}; expected a Linear {hidden} -> {width or 'd'}: {want}"[:400])


def linear(path: Path) -> Any:
    """A head as a float32 torch Linear."""
    import torch

    state = _state(path)
    out_features, in_features = state["weight"].shape
    layer = torch.nn.Linear(int(in_features), int(out_features))
    layer.load_state_dict({k: v.to(torch.float32) for k, v in state.items()})
    return layer.eval()


def resolved(source: Any, tokenizer: Any, precision: Any) -> Any:
    """`source` with the ids of the tokens whose lexical weights FlagEmbedding drops; `--dtype` refused (int8's
    gate, infra.pack.hybrid_quality, measures the three outputs; no float16 gate does yet)."""
    if precision.dtype != "float32":
        raise SourceError(
            f"--dtype {precision.dtype} is not served for hybrid (bge-m3): no gate for its three outputs in "
            "that dtype; use float32 or --quantize int8"
        )
    ids = {getattr(tokenizer, f"{key}_id", None) for key in UNUSED}  # its special_tokens_map's, as FlagEmbedding
    unused = tuple(sorted(int(i) for i in ids if i is not None))
    return replace(source, hybrid=replace(source.hybrid, unused_ids=unused))


def add_to_manifest(manifest: dict[str, Any], source: Any) -> None:
    """The manifest's hybrid fields: the dense width, the multi-vector width and the dropped token ids."""
    manifest["dimension"] = source.hidden_size
    manifest["hybrid"] = {"colbert_dim": source.hybrid.colbert_dim, "unused_ids": list(source.hybrid.unused_ids)}
    manifest["prompts"] = {}
    manifest["default_prompt_name"] = None
