"""A BERT encoder with mean pooling in plain PyTorch, parameter names matching Hugging Face's `BertModel`.

Written here so the torch backend never imports `transformers` (3-4 s of imports). Only imported by the
torch backend, which has already paid for `import torch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> BertConfig:
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__})


def _embedding(rows: int, dim: int) -> nn.Embedding:
    # Passing the (empty) weight skips reset_parameters: normal_() on the meta device goes through
    # torch's Python decompositions and cost 1.7 s here on first use, for values that are replaced anyway.
    return nn.Embedding(rows, dim, _weight=torch.empty((rows, dim)))


class Embeddings(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = _embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = _embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = _embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        # Single-segment inputs: token type 0 everywhere, as sentence-transformers sends.
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings.weight[:seq]
            + self.token_type_embeddings.weight[0]
        )
        return self.LayerNorm(x)  # type: ignore[no-any-return]


class SelfAttention(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.heads = c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, h // self.heads).transpose(1, 2)

        ctx = F.scaled_dot_product_attention(split(self.query(x)), split(self.key(x)), split(self.value(x)), bias)
        return ctx.transpose(1, 2).reshape(b, s, h)


class DenseNorm(nn.Module):
    """dense → residual add → LayerNorm (BERT's `*Output` blocks)."""

    def __init__(self, c: BertConfig, fan_in: int) -> None:
        super().__init__()
        self.dense = nn.Linear(fan_in, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)  # type: ignore[no-any-return]


class Attention(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.self = SelfAttention(c)
        self.output = DenseNorm(c, c.hidden_size)


class Intermediate(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)


class Layer(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.attention = Attention(c)
        self.intermediate = Intermediate(c)
        self.output = DenseNorm(c, c.intermediate_size)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        a = self.attention.output(self.attention.self(x, bias), x)
        return self.output(F.gelu(self.intermediate.dense(a)), a)  # type: ignore[no-any-return]


class Encoder(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))


class BertMeanPooled(nn.Module):
    """input_ids, attention_mask → L2-normalized mean of the last hidden states over unmasked tokens."""

    def __init__(self, c: BertConfig, normalize: bool = True) -> None:
        super().__init__()
        self.embeddings = Embeddings(c)
        self.encoder = Encoder(c)
        self.normalize = normalize

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.to(torch.float32)
        # Additive bias (b, 1, 1, s): padded keys get the most negative float, as Hugging Face does.
        bias = (1.0 - mask)[:, None, None, :] * torch.finfo(torch.float32).min
        x = self.embeddings(input_ids)
        for layer in self.encoder.layer:
            x = layer(x, bias)
        summed = (x * mask[:, :, None]).sum(1)
        pooled = summed / mask.sum(1, keepdim=True).clamp(min=1e-9)
        return F.normalize(pooled, p=2.0, dim=1) if self.normalize else pooled
