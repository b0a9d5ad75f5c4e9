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
from pathlib import Path, PurePosixPath
from typing import Any

from infra.pack.hf_checks import SourceError

# modules.json `type` -> kind, as sentence-transformers 5.x (`...sparse_encoder.models.X`) and 6.x
# (`...sparse_encoder.modules.<module>.X`, the base Transformer) write them.
SPARSE_TYPES = {
    "sentence_transformers.sparse_encoder.models.MLMTransformer": "MLMTransformer",
    "sentence_transformers.sparse_encoder.modules.mlm_transformer.MLMTransformer": "MLMTransformer",
    "sentence_transformers.sparse_encoder.models.SpladePooling": "SpladePooling",
    "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling": "SpladePooling",
    "sentence_transformers.sparse_encoder.models.SparseStaticEmbedding": "SparseStaticEmbedding",
    "sentence_transformers.sparse_encoder.modules.sparse_static_embedding."
    "SparseStaticEmbedding": "SparseStaticEmbedding",
    "sentence_transformers.models.Router": "Router",
    "sentence_transformers.base.modules.router.Router": "Router",
    "sentence_transformers.base.modules.transformer.Transformer": "Transformer",
    "sentence_transformers.models.Transformer": "Transformer",
}
QUERY_WEIGHTS_FILE = "query_weights.npy"  # the static query encoder's weights in a pack: float32, one per token id
_MARKERS = (".sparse_encoder.", "SparseEncoder")
POOLING_STRATEGIES = ("max", "sum")
ACTIVATIONS = ("relu", "log1p_relu")
SUPPORTED = (
    "MLMTransformer (or Transformer with transformer_task fill-mask) -> SpladePooling, alone or as a Router's "
    "document route beside a query route of one SparseStaticEmbedding"
)


@dataclass(frozen=True)
class Splade:
    """SpladePooling's settings: pooled = reduce over tokens of log1p(activation(masked MLM logits))."""

    pooling: str  # POOLING_STRATEGIES
    activation: str  # ACTIVATIONS
    # A Router's inference-free query encoder: its SparseStaticEmbedding's folder (relative to the directory),
    # one weight per token id; None: queries run the model too.
    static_query: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pooling": self.pooling, "activation": self.activation}
        if self.static_query is not None:
            out["query"] = {"kind": "static", "file": QUERY_WEIGHTS_FILE}
        return out


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
    static_query = None
    if [k for k, _ in kinds] == ["Router"]:
        where = root / kinds[0][1] / "router_config.json"
        kinds, static_query = _routes(root, kinds[0][1], read_json, refuse)
    order = [k for k, _ in kinds]
    if len(order) != 2 or order[0] not in ("MLMTransformer", "Transformer") or order[1] != "SpladePooling":
        raise refuse(f"{where}: SparseEncoder modules {' -> '.join(order)}; supported: {SUPPORTED}"[:600])
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
    kinds = [("Transformer", mlm_path), ("SpladePooling", pool_path)]
    return kinds, Splade(str(pooling), str(activation), static_query)


def _routes(
    root: Path, router: str, read_json: Callable[[Path], Any], refuse: type[SourceError]
) -> tuple[list[tuple[str, str]], str]:
    """A Router's routes (router_config.json): the document route's modules as (kind, folder) and the query
    route's one SparseStaticEmbedding folder; anything else refused."""
    where = root / router / "router_config.json"
    config = read_json(where)
    if not isinstance(config, dict) or not isinstance(config.get("structure"), dict):
        raise SourceError(f"{where}: expected an object with a `structure` of routes")
    types, structure = config.get("types") or {}, config["structure"]
    default = (config.get("parameters") or {}).get("default_route")

    def kinds(route: str) -> list[tuple[str, str]]:
        folders = structure.get(route) or []
        out = []
        for f in folders:
            kind = str(types.get(f))
            out.append((SPARSE_TYPES.get(kind, kind.rsplit(".", 1)[-1]), str(PurePosixPath(router) / str(f))))
        return out

    shown = "; ".join(f"{r}: {' -> '.join(k for k, _ in kinds(r)) or 'none'}" for r in structure)
    query, document = kinds("query"), kinds("document")
    if sorted(structure) != ["document", "query"] or [k for k, _ in query] != ["SparseStaticEmbedding"]:
        raise refuse(f"{where}: Router routes {shown}; supported: {SUPPORTED}"[:600])
    if default not in (None, "document"):
        raise refuse(f"{where}: Router default_route {default!r}; supported: document")
    return document, query[0][1]


def check_static_query(
    root: Path, splade: Splade, tokenizer: Path | None, vocab_size: int, refuse: type[SourceError]
) -> list[Path]:
    """The query encoder's files (its weights: one float per token id; its tokenizer: the document encoder's
    own, byte for byte, as the pack keeps one), checked; what the content hash covers."""
    from infra.pack.hf_checks import read_source_file, safetensors_shapes

    assert splade.static_query is not None
    folder = root / splade.static_query
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise SourceError(f"{folder}: no weights; expected model.safetensors (a SparseStaticEmbedding's `weight`)")
    shapes = safetensors_shapes(weights)
    if shapes != {"weight": [vocab_size]}:
        raise SourceError(f"{weights}: tensors {shapes}; a SparseStaticEmbedding holds weight [{vocab_size}]"[:400])
    own = folder / "tokenizer.json"
    if own.is_file() and (tokenizer is None or read_source_file(own) != read_source_file(tokenizer)):
        raise refuse(
            f"{own}: the query encoder's tokenizer differs from the document encoder's; supported: one tokenizer"
        )
    return [p for p in (weights, folder / "config.json", own, folder.parent / "router_config.json") if p.is_file()]


def splade(logits: Any, attention_mask: Any, settings: Splade) -> Any:
    """SpladePooling's arithmetic in torch (inference): padding masked to 0 before the activation, so it
    adds nothing to either reduction (log1p(relu(0)) = 0). Used by the exported graph's head.

    Max pooling takes the max of the masked logits first: ReLU and log1p never decrease, so applied to the
    max alone they give the same float as the max of them applied to every token, with one pass over the
    (batch, tokens, vocabulary) logits instead of three (about 120 MB a pass for 32 texts of 32 tokens)."""
    import torch

    masked = logits * attention_mask.unsqueeze(-1).to(logits.dtype)
    if settings.pooling == "max":
        values = torch.log1p(torch.relu(masked.amax(dim=1)))
        return torch.log1p(values) if settings.activation == "log1p_relu" else values
    values = torch.log1p(torch.relu(masked))
    if settings.activation == "log1p_relu":
        values = torch.log1p(values)
    return values.sum(dim=1)


def write_static_query(root: Path, splade: Splade | None, out: Path) -> None:
    """The query encoder's weights into the pack, as a float32 .npy (the run time maps it: no torch); nothing
    for a pack without one."""
    if splade is None or splade.static_query is None:
        return
    import numpy as np  # deferred: the pack's source checks read JSON only
    from safetensors.numpy import load_file

    weight = load_file(str(root / splade.static_query / "model.safetensors"))["weight"]
    np.save(out / QUERY_WEIGHTS_FILE, np.ascontiguousarray(weight, dtype="<f4"), allow_pickle=False)


def add_to_manifest(manifest: dict[str, Any], source: Any) -> None:
    """The manifest's sparse fields: SpladePooling's settings, the width (the vocabulary) and the prompts."""
    assert source.splade is not None
    manifest["splade"] = source.splade.to_json()
    manifest["dimension"] = source.dimension
    manifest["prompts"] = dict(source.prompts)
    manifest["default_prompt_name"] = source.default_prompt_name
