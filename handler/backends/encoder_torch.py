"""Hugging Face encoders in plain PyTorch: BERT, RoBERTa, XLM-RoBERTa, DistilBERT and MPNet, with
sentence-transformers' pooling (mean | cls | max | lasttoken, then normalize) or each family's
sequence-classification head (rerank scores with their activation, or classify logits).

Parameter names match Hugging Face's, so `model.safetensors` maps in as saved, with the base model's prefix
(`bert.`, `roberta.`, `distilbert.`, `mpnet.`) or without it (`weight_names`). Written here so the torch backend never
imports `transformers` (seconds of imports); built on the meta device by the backend, nothing initialized.
Only imported by the torch backend, which has already paid for `import torch`.

Kept as the fallback, no longer what `pack --from` packs: new packs carry torch.export's program of the stock
transformers model (`handler.backends.program`), which serves every family that exports. This encoder still
serves (a) the default model's packs made before it went through `pack --from`'s path (architecture
"bert-mean-pooled"; `pack --default` now writes the exported program too), (b) packs made
before the exported program ("hf-encoder"), (c) a model whose program torch.export cannot capture or that does
not match the eager model at pack time (the manifest's `program_refused` says why). Measured against the
program on all-MiniLM-L6-v2 (docs/own-model.md#the-torch-backend): cold start 0.93x, warm 32-text batches
0.99x, load 6 vs 12 ms (one loaded-host run); it cannot be retired while (a)-(c) exist.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

FAMILIES = ("bert", "roberta", "xlm-roberta", "distilbert", "mpnet")
_FAIRSEQ_POSITIONS = ("roberta", "xlm-roberta", "mpnet")  # positions count from padding_idx + 1
HEADS = ("none", "sequence-classification")
PREFIXES = {
    "bert": "bert.",
    "roberta": "roberta.",
    "xlm-roberta": "roberta.",
    "distilbert": "distilbert.",
    "mpnet": "mpnet.",
}
_TANH_GELU: Callable[[torch.Tensor], torch.Tensor] = lambda x: F.gelu(x, approximate="tanh")  # noqa: E731
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": _TANH_GELU,
    "gelu_pytorch_tanh": _TANH_GELU,
    "gelu_fast": _TANH_GELU,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


@dataclass(frozen=True)
class EncoderConfig:
    family: str
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    intermediate: int
    max_positions: int
    type_vocab: int  # 0: no token type embeddings (DistilBERT)
    eps: float
    act: str
    pad_id: int
    num_labels: int
    buckets: int = 0  # MPNet: rows of the relative attention bias table

    @classmethod
    def from_hf(cls, family: str, raw: Mapping[str, Any]) -> EncoderConfig:
        """From a model's config.json; ValueError names what is not supported."""
        if family not in FAMILIES:
            raise ValueError(f"family {family!r}; the torch encoder runs: {', '.join(FAMILIES)}")
        labels = raw.get("id2label")
        num_labels = len(labels) if isinstance(labels, dict) and labels else int(raw.get("num_labels", 2))
        if family == "distilbert":
            act = raw.get("activation", "gelu")
            fields = (raw["vocab_size"], raw["dim"], raw["n_layers"], raw["n_heads"], raw["hidden_dim"])
            eps, type_vocab = 1e-12, 0  # DistilBERT's LayerNorm eps is fixed in its code, not in the config
        else:
            kind = "absolute" if family == "mpnet" else raw.get("position_embedding_type", "absolute")
            if kind != "absolute":
                raise ValueError(f"position_embedding_type {kind!r}; the torch encoder runs: absolute")
            act = raw.get("hidden_act", "gelu")
            fields = (
                raw["vocab_size"],
                raw["hidden_size"],
                raw["num_hidden_layers"],
                raw["num_attention_heads"],
                raw["intermediate_size"],
            )
            eps = float(raw.get("layer_norm_eps", 1e-12))
            type_vocab = 0 if family == "mpnet" else int(raw.get("type_vocab_size", 2))
        if act not in ACTIVATIONS:
            raise ValueError(f"activation {act!r}; the torch encoder runs: {', '.join(ACTIVATIONS)}")
        vocab, hidden, layers, heads, intermediate = (int(f) for f in fields)
        pad = raw.get("pad_token_id")
        if family == "mpnet":
            pad = 1  # MPNet's embeddings hard-code padding_idx 1, whatever the config says
        return cls(
            family, vocab, hidden, layers, heads, intermediate, int(raw["max_position_embeddings"]),
            type_vocab, eps, act, int(pad if pad is not None else (1 if family in _FAIRSEQ_POSITIONS else 0)),
            num_labels, int(raw.get("relative_attention_num_buckets", 32)) if family == "mpnet" else 0,
        )  # fmt: skip


def _embedding(rows: int, dim: int) -> nn.Embedding:
    # Passing the (empty) weight skips reset_parameters: normal_() on the meta device goes through torch's
    # Python decompositions (1.7 s on first use, measured here), for values replaced anyway.
    return nn.Embedding(rows, dim, _weight=torch.empty((rows, dim)))


class Embeddings(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.fairseq = c.family in _FAIRSEQ_POSITIONS
        self.pad_id = c.pad_id
        self.word_embeddings = _embedding(c.vocab_size, c.hidden)
        self.position_embeddings = _embedding(c.max_positions, c.hidden)
        if c.type_vocab:
            self.token_type_embeddings = _embedding(c.type_vocab, c.hidden)
        self.LayerNorm = nn.LayerNorm(c.hidden, eps=c.eps)

    def forward(self, ids: torch.Tensor, types: torch.Tensor | None) -> torch.Tensor:
        x = self.word_embeddings(ids)
        if self.fairseq:
            # fairseq's positions: count non-pad tokens from padding_idx + 1; pads keep padding_idx.
            real = ids.ne(self.pad_id).to(torch.int64)
            x = x + self.position_embeddings(torch.cumsum(real, dim=1) * real + self.pad_id)
        else:
            x = x + self.position_embeddings.weight[: ids.shape[1]]
        if hasattr(self, "token_type_embeddings"):
            table = self.token_type_embeddings
            x = x + (table(types) if types is not None else table.weight[0])
        return self.LayerNorm(x)  # type: ignore[no-any-return]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, bias: torch.Tensor) -> torch.Tensor:
    b, s, h = q.shape

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.view(b, s, heads, h // heads).transpose(1, 2)

    ctx = F.scaled_dot_product_attention(split(q), split(k), split(v), bias)
    return ctx.transpose(1, 2).reshape(b, s, h)


class SelfAttention(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.query = nn.Linear(c.hidden, c.hidden)
        self.key = nn.Linear(c.hidden, c.hidden)
        self.value = nn.Linear(c.hidden, c.hidden)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return _attend(self.query(x), self.key(x), self.value(x), self.heads, bias)


class DenseNorm(nn.Module):
    """dense → residual add → LayerNorm (BERT's `*Output` blocks)."""

    def __init__(self, c: EncoderConfig, fan_in: int) -> None:
        super().__init__()
        self.dense = nn.Linear(fan_in, c.hidden)
        self.LayerNorm = nn.LayerNorm(c.hidden, eps=c.eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)  # type: ignore[no-any-return]


class Attention(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.self = SelfAttention(c)
        self.output = DenseNorm(c, c.hidden)


class Dense(nn.Module):
    def __init__(self, fan_in: int, fan_out: int) -> None:
        super().__init__()
        self.dense = nn.Linear(fan_in, fan_out)


class BertLayer(nn.Module):
    """BERT's and RoBERTa's layer (the same names and maths)."""

    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.act = ACTIVATIONS[c.act]
        self.attention = Attention(c)
        self.intermediate = Dense(c.hidden, c.intermediate)
        self.output = DenseNorm(c, c.intermediate)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        a = self.attention.output(self.attention.self(x, bias), x)
        return self.output(self.act(self.intermediate.dense(a)), a)  # type: ignore[no-any-return]


class Layers(nn.Module):
    def __init__(self, c: EncoderConfig, layer: Callable[[EncoderConfig], nn.Module]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(layer(c) for _ in range(c.layers))


class DistilAttention(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.q_lin, self.k_lin = nn.Linear(c.hidden, c.hidden), nn.Linear(c.hidden, c.hidden)
        self.v_lin, self.out_lin = nn.Linear(c.hidden, c.hidden), nn.Linear(c.hidden, c.hidden)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return self.out_lin(_attend(self.q_lin(x), self.k_lin(x), self.v_lin(x), self.heads, bias))  # type: ignore[no-any-return]


class FFN(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.act = ACTIVATIONS[c.act]
        self.lin1, self.lin2 = nn.Linear(c.hidden, c.intermediate), nn.Linear(c.intermediate, c.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin2(self.act(self.lin1(x)))  # type: ignore[no-any-return]


class DistilLayer(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.attention = DistilAttention(c)
        self.sa_layer_norm = nn.LayerNorm(c.hidden, eps=c.eps)
        self.ffn = FFN(c)
        self.output_layer_norm = nn.LayerNorm(c.hidden, eps=c.eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        a = self.sa_layer_norm(self.attention(x, bias) + x)
        return self.output_layer_norm(self.ffn(a) + a)  # type: ignore[no-any-return]


class MPNetSelfAttention(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.q, self.k = nn.Linear(c.hidden, c.hidden), nn.Linear(c.hidden, c.hidden)
        self.v, self.o = nn.Linear(c.hidden, c.hidden), nn.Linear(c.hidden, c.hidden)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return self.o(_attend(self.q(x), self.k(x), self.v(x), self.heads, bias))  # type: ignore[no-any-return]


class MPNetAttention(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.attn = MPNetSelfAttention(c)
        self.LayerNorm = nn.LayerNorm(c.hidden, eps=c.eps)


class MPNetLayer(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.act = ACTIVATIONS[c.act]
        self.attention = MPNetAttention(c)
        self.intermediate = Dense(c.hidden, c.intermediate)
        self.output = DenseNorm(c, c.intermediate)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        a = self.attention.LayerNorm(self.attention.attn(x, bias) + x)
        return self.output(self.act(self.intermediate.dense(a)), a)  # type: ignore[no-any-return]


class MPNetLayers(Layers):
    """MPNet's encoder: the layers and one relative attention bias table (T5-style buckets) they share."""

    def __init__(self, c: EncoderConfig) -> None:
        super().__init__(c, MPNetLayer)
        self.relative_attention_bias = _embedding(c.buckets, c.heads)

    def position_bias(self, seq: int, device: torch.device) -> torch.Tensor:
        """(1, heads, seq, seq), as MPNetEncoder.compute_position_bias: 32 buckets (that method's default,
        whatever the table's size), exact below 8 tokens apart, logarithmic up to 128, by sign."""
        positions = torch.arange(seq, dtype=torch.long, device=device)
        n = -(positions[None, :] - positions[:, None])
        half = 32 // 2
        bucket = (n < 0).to(torch.long) * half
        n = n.abs()
        exact = half // 2
        large = exact + (torch.log(n.float() / exact) / math.log(128 / exact) * (half - exact)).to(torch.long)
        bucket = bucket + torch.where(n < exact, n, torch.clamp(large, max=half - 1))
        return self.relative_attention_bias(bucket).permute(2, 0, 1).unsqueeze(0)  # type: ignore[no-any-return]


class Base(nn.Module):
    """The base model (what `BertModel` & co. hold): embeddings, layers and, for BERT's classifier, the pooler."""

    def __init__(self, c: EncoderConfig, pooler: bool) -> None:
        super().__init__()
        self.embeddings = Embeddings(c)
        if c.family == "distilbert":
            self.transformer = Layers(c, DistilLayer)
        elif c.family == "mpnet":
            self.encoder: Layers = MPNetLayers(c)
        else:
            self.encoder = Layers(c, BertLayer)
        if pooler:
            self.pooler = Dense(c.hidden, c.hidden)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor | None) -> torch.Tensor:
        # Additive bias (b, 1, 1, s): padded keys get the most negative float, as Hugging Face does.
        bias = (1.0 - mask.to(torch.float32))[:, None, None, :] * torch.finfo(torch.float32).min
        x: torch.Tensor = self.embeddings(ids, types)
        stack = self.transformer if hasattr(self, "transformer") else self.encoder
        if isinstance(stack, MPNetLayers):
            bias = bias + stack.position_bias(ids.shape[1], ids.device)
        for layer in stack.layer:
            x = layer(x, bias)
        return x


def pool(x: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """sentence-transformers' `Pooling` over token states `x` (b, s, h) with `mask` (b, s)."""
    m = mask.to(x.dtype)[:, :, None]
    if mode == "mean":
        return (x * m).sum(1) / m.sum(1).clamp(min=1e-9)
    if mode == "cls":
        return x[:, 0]
    if mode == "max":
        return torch.where(m > 0, x, torch.full_like(x, -1e9)).max(1).values
    if mode == "lasttoken":
        # The last position whose mask is 1 (right padding, as the packed tokenizer pads).
        last = (torch.arange(mask.shape[1], device=mask.device) * mask.ne(0)).argmax(1)
        return x[torch.arange(x.shape[0], device=x.device), last]
    raise ValueError(f"pooling mode {mode!r}; valid: mean, cls, max, lasttoken")


class HFEncoder(nn.Module):
    """input_ids, attention_mask[, token_type_ids] → one output: a pooled (and normalized) embedding
    (`head="none"`), rerank scores (b,) with `activation` applied, or classify logits (b, num_labels)."""

    def __init__(
        self,
        c: EncoderConfig,
        head: str = "none",
        pooling: str = "mean",
        normalize: bool = True,
        activation: str | None = None,
    ) -> None:
        super().__init__()
        if head not in HEADS:
            raise ValueError(f"head {head!r}; valid: {', '.join(HEADS)}")
        if head == "none" and pooling not in ("mean", "cls", "max", "lasttoken"):
            raise ValueError(f"pooling mode {pooling!r}; valid: mean, cls, max, lasttoken")
        if activation not in (None, "sigmoid", "identity"):
            raise ValueError(f"activation {activation!r}; valid: sigmoid, identity")
        self.family, self.head, self.pooling, self.normalize, self.activation = (
            c.family, head, pooling, normalize, activation
        )  # fmt: skip
        classify = head == "sequence-classification"
        self.base = Base(c, pooler=classify and c.family == "bert")
        if classify and c.family in _FAIRSEQ_POSITIONS:  # RoBERTa's head, MPNet's is the same
            self.classifier: nn.Module = RobertaHead(c)
        elif classify:
            if c.family == "distilbert":
                self.pre_classifier = nn.Linear(c.hidden, c.hidden)
            self.classifier = nn.Linear(c.hidden, c.num_labels)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = self.base(input_ids, attention_mask, token_type_ids)
        if self.head == "none":
            pooled = pool(x, attention_mask, self.pooling)
            return F.normalize(pooled, p=2.0, dim=1) if self.normalize else pooled
        first = x[:, 0]
        if self.family == "bert":
            logits = self.classifier(torch.tanh(self.base.pooler.dense(first)))
        elif self.family == "distilbert":
            logits = self.classifier(F.relu(self.pre_classifier(first)))
        else:
            logits = self.classifier(first)
        if self.activation is None:
            return logits  # type: ignore[no-any-return]
        scores = logits[:, 0]  # a cross-encoder has one label
        return torch.sigmoid(scores) if self.activation == "sigmoid" else scores


class RobertaHead(nn.Module):
    """RoBERTa's classification head: dense + tanh on the <s> token, then out_proj."""

    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(c.hidden, c.hidden)
        self.out_proj = nn.Linear(c.hidden, c.num_labels)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.tanh(self.dense(first)))  # type: ignore[no-any-return]


_OLD_NORM = {"weight": "gamma", "bias": "beta"}


def weight_names(model: nn.Module, family: str, available: set[str]) -> tuple[dict[str, str], list[str]]:
    """Each parameter of `model` → the tensor name to take it from in the checkpoint, and the parameters
    found under no spelling. The base model's tensors are taken with or without its prefix (a
    `*ForSequenceClassification` checkpoint has `bert.`, a bare `BertModel` none); old `gamma`/`beta`
    LayerNorm names are accepted for `weight`/`bias`."""
    prefix = PREFIXES[family]
    found: dict[str, str] = {}
    missing: list[str] = []
    for name in model.state_dict():
        bare = name.removeprefix("base.")
        spellings = [prefix + bare, bare] if name.startswith("base.") else [name]
        leaf = name.rpartition(".")[2]
        if leaf in _OLD_NORM and ("LayerNorm." in name or "layer_norm." in name):
            spellings += [s.rpartition(".")[0] + "." + _OLD_NORM[leaf] for s in spellings]
        match = next((s for s in spellings if s in available), None)
        if match is None:
            missing.append(spellings[0])
        else:
            found[name] = match
    return found, missing
