"""Whole models from the blocks: a BERT-style encoder, a GPT-style decoder LM, and the original
encoder-decoder Transformer. Inputs are token ids (B, T); padding masks are HF-style 0/1 (B, T).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..attention.masks import causal, key_padding
from .blocks import DecoderBlock, EncoderBlock, sinusoidal_positions

__all__ = ["DecoderLM", "Encoder", "EncoderDecoder", "ModelConfig"]


@dataclass(frozen=True)
class ModelConfig:
    kind: str  # "encoder" | "decoder" | "encoder-decoder"
    layers: int
    heads: int
    dim: int
    hidden: int
    vocab: int
    max_len: int = 512
    positions: str = "learned"  # "learned" | "sinusoidal"
    norm_first: bool = False
    activation: str = "gelu"
    token_types: int = 0  # BERT's segment embeddings
    pooler: bool = False  # BERT's [CLS] pooler
    dropout: float = 0.1
    eps: float = 1e-12
    checkpoint: bool = False

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


class _Embeddings(nn.Module):
    def __init__(self, c: ModelConfig, norm: bool) -> None:
        super().__init__()
        self.tokens = nn.Embedding(c.vocab, c.dim)
        self.positions = nn.Embedding(c.max_len, c.dim) if c.positions == "learned" else None
        self.types = nn.Embedding(c.token_types, c.dim) if c.token_types else None
        self.norm = nn.LayerNorm(c.dim, eps=c.eps) if norm else None
        self.dropout = nn.Dropout(c.dropout)
        self.dim, self.max_len = c.dim, c.max_len

    def forward(self, ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        T = ids.shape[1]
        if T > self.max_len:
            raise ValueError(f"input has {T} tokens; this model takes at most {self.max_len}")
        x = self.tokens(ids)  # (B, T, D)
        if self.positions is not None:
            x = x + self.positions(torch.arange(T, device=ids.device))
        else:
            x = x * self.dim**0.5 + sinusoidal_positions(T, self.dim, device=ids.device, dtype=x.dtype)
        if self.types is not None:
            x = x + self.types(token_type_ids if token_type_ids is not None else torch.zeros_like(ids))
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)


def _padding(attention_mask: Tensor | None):
    return None if attention_mask is None else key_padding(attention_mask)


class Encoder(nn.Module):
    """BERT-style encoder: ``forward(input_ids (B, T), attention_mask (B, T) 0/1 | None) -> (B, T, D)``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = _Embeddings(config, norm=not config.norm_first)
        self.layers = nn.ModuleList([
            EncoderBlock(config.dim, config.heads, config.hidden, dropout=config.dropout, activation=config.activation,
                         norm_first=config.norm_first, eps=config.eps, checkpoint=config.checkpoint)
            for _ in range(config.layers)])
        self.final_norm = nn.LayerNorm(config.dim, eps=config.eps) if config.norm_first else None
        self.pooler = nn.Linear(config.dim, config.dim) if config.pooler else None

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None) -> Tensor:
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, D)
        mask = _padding(attention_mask)
        for layer in self.layers:
            x = layer(x, mask)
        return self.final_norm(x) if self.final_norm is not None else x


class DecoderLM(nn.Module):
    """GPT-style decoder: ``forward(input_ids (B, T), attention_mask | None) -> logits (B, T, V)``;
    the output projection is tied to the token embeddings."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = _Embeddings(config, norm=False)
        self.layers = nn.ModuleList([
            DecoderBlock(config.dim, config.heads, config.hidden, cross_attention=False, dropout=config.dropout,
                         activation=config.activation, norm_first=config.norm_first, eps=config.eps,
                         checkpoint=config.checkpoint)
            for _ in range(config.layers)])
        self.final_norm = nn.LayerNorm(config.dim, eps=config.eps)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        x = self.embeddings(input_ids)  # (B, T, D)
        pad = _padding(attention_mask)
        mask = causal() if pad is None else causal() & pad
        for layer in self.layers:
            x = layer(x, None, mask)
        return self.final_norm(x) @ self.embeddings.tokens.weight.T  # (B, T, V)


class EncoderDecoder(nn.Module):
    """The original Transformer: shared source/target embeddings tied to the output projection,
    sinusoidal positions. ``forward(src (B, S), tgt (B, T), src_mask, tgt_mask) -> logits (B, T, V)``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = _Embeddings(config, norm=False)
        common = {"dropout": config.dropout, "activation": config.activation, "norm_first": config.norm_first,
                  "eps": config.eps, "checkpoint": config.checkpoint}
        self.encoder = nn.ModuleList([EncoderBlock(config.dim, config.heads, config.hidden, **common)
                                      for _ in range(config.layers)])
        self.decoder = nn.ModuleList([DecoderBlock(config.dim, config.heads, config.hidden, **common)
                                      for _ in range(config.layers)])

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        memory = self.embeddings(src)  # (B, S, D)
        for layer in self.encoder:
            memory = layer(memory, _padding(src_mask))
        return memory

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        memory = self.encode(src, src_mask)
        x = self.embeddings(tgt)  # (B, T, D)
        pad = _padding(tgt_mask)
        self_mask = causal() if pad is None else causal() & pad
        for layer in self.decoder:
            x = layer(x, memory, self_mask, _padding(src_mask))
        return x @ self.embeddings.tokens.weight.T  # (B, T, V)
