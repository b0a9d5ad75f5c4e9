"""A sentence-transformers `SparseEncoder` directory (SPLADE): which modules it has, checked, for `hf_source`.

Served: an MLM transformer (the deprecated `MLMTransformer`, or a `Transformer` whose `transformer_task` is
`fill-mask`) followed by `SpladePooling` (ReLU then log1p, or log1p twice for `log1p_relu`; max or sum over
the tokens). Everything else a SparseEncoder can hold (a `Router` with an inference-free query encoder, a
`SparseAutoEncoder` (CSR) head, a `Dense`) is refused with one line naming what was found.

Plain JSON reads only, as in `hf_source`: nothing imported from torch or sentence-transformers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.pack.hf_checks import SourceError

# modules.json `type` -> kind, as sentence-transformers 5.x (`...sparse_encoder.models.X`) and 6.x
# (`...sparse_encoder.modules.<module>.X`, the base Transformer) write them.
SPARSE_TYPES = {
    "sentence_transformers.sparse_encoder.models.MLMTransformer": "MLMTransformer",
    "sentence_transformers.sparse_encoder.modules.mlm_transformer.MLMTransformer": "MLMTransformer",
    "sentence_transformers.sparse_encoder.models.SpladePooling": "SpladePooling",
    "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling": "SpladePooling",
}
_MARKERS = (".sparse_encoder.", "SparseEncoder")
POOLING_STRATEGIES = ("max", "sum")
ACTIVATIONS = ("relu", "log1p_relu")
SUPPORTED = "MLMTransformer (or Transformer with transformer_task fill-mask) -> SpladePooling"


@dataclass(frozen=True)
class Splade:
    """SpladePooling's settings: pooled = reduce over tokens of log1p(activation(masked MLM logits))."""

    pooling: str  # POOLING_STRATEGIES
    activation: str  # ACTIVATIONS

    def to_json(self) -> dict[str, str]:
        return {"pooling": self.pooling, "activation": self.activation}


def is_sparse(modules: list[Any], st_meta: dict[str, Any]) -> bool:
    """Whether the directory is a SparseEncoder's (its config says so, or a module is a sparse one)."""
    if st_meta.get("model_type") == "SparseEncoder":
        return True
    return any(isinstance(m, dict) and any(k in str(m.get("type", "")) for k in _MARKERS) for m in modules)


def sparse_modules(
    root: Path, found: list[tuple[str, str]], read_json: Callable[[Path], Any], refuse: type[SourceError]
) -> tuple[list[tuple[str, str]], Splade]:
    """`found`: modules.json's (kind or type, folder) pairs, as `hf_source` reads them. The modules as (kind,
    folder), the MLM transformer's as `Transformer`, then `SpladePooling`'s; and the pooling's settings.
    `refuse` (hf_source's UnsupportedModelError) for any other module list: one line, found and supported."""
    where = root / "modules.json"
    kinds = [(SPARSE_TYPES.get(kind) or kind.rsplit(".", 1)[-1] or "?", path) for kind, path in found]
    order = [k for k, _ in kinds]
    if len(order) != 2 or order[0] not in ("MLMTransformer", "Transformer") or order[1] != "SpladePooling":
        hint = ""
        if "Router" in order:
            hint = " (a Router: an inference-free query encoder, not served yet; pack the document encoder alone)"
        raise refuse(f"{where}: SparseEncoder modules {' -> '.join(order)}{hint}; supported: {SUPPORTED}"[:600])
    mlm_path, pool_path = kinds[0][1], kinds[1][1]
    if order[0] == "Transformer":
        st_config = read_json(root / mlm_path / "sentence_bert_config.json")
        task = st_config.get("transformer_task") if isinstance(st_config, dict) else None
        if task != "fill-mask":
            raise refuse(f"{where}: a SparseEncoder Transformer with transformer_task {task!r}; supported: {SUPPORTED}")
    config = read_json(root / pool_path / "config.json")
    if not isinstance(config, dict):
        raise SourceError(f"{root / pool_path / 'config.json'}: expected a JSON object")
    pooling = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if pooling not in POOLING_STRATEGIES:
        raise refuse(
            f"{root / pool_path / 'config.json'}: pooling_strategy {pooling!r}; supported: "
            f"{', '.join(POOLING_STRATEGIES)}"
        )
    if activation not in ACTIVATIONS:
        raise refuse(
            f"{root / pool_path / 'config.json'}: activation_function {activation!r}; supported: "
            f"{', '.join(ACTIVATIONS)}"
        )
    return [("Transformer", mlm_path), ("SpladePooling", pool_path)], Splade(str(pooling), str(activation))


def splade(logits: Any, attention_mask: Any, settings: Splade) -> Any:
    """SpladePooling's arithmetic in torch (inference): padding masked to 0 before the activation, so it
    adds nothing to either reduction (log1p(relu(0)) = 0). Used by the exported graph's head."""
    import torch

    masked = logits * attention_mask.unsqueeze(-1).to(logits.dtype)
    values = torch.log1p(torch.relu(masked))
    if settings.activation == "log1p_relu":
        values = torch.log1p(values)
    return values.amax(dim=1) if settings.pooling == "max" else values.sum(dim=1)
