"""Whole models from the blocks: a BERT-style encoder, a GPT-style decoder LM, and the original
encoder-decoder Transformer. Inputs are token ids (B, T); padding masks are HF-style 0/1 (B, T).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..attn.layer import KVCache
from ..attn.precision import linear
from ..masks import causal, key_padding
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
    positions: str = "learned"  # "learned" | "sinusoidal" | "rotary" (in the attention of every block)
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
        if c.positions not in ("learned", "sinusoidal", "rotary"):
            raise ValueError(f"positions must be 'learned', 'sinusoidal' or 'rotary'; got {c.positions!r}")
        self.kind = c.positions
        self.positions = nn.Embedding(c.max_len, c.dim) if c.positions == "learned" else None
        self.types = nn.Embedding(c.token_types, c.dim) if c.token_types else None
        self.norm = nn.LayerNorm(c.dim, eps=c.eps) if norm else None
        self.dropout = nn.Dropout(c.dropout)
        self.dim, self.max_len = c.dim, c.max_len

    def forward(self, ids: Tensor, token_type_ids: Tensor | None = None, offset: int = 0) -> Tensor:
        T = ids.shape[1]
        if offset + T > self.max_len:
            raise ValueError(f"input has {offset + T} tokens; this model takes at most {self.max_len}")
        x = self.tokens(ids)  # (B, T, D)
        if self.positions is not None:
            x = x + self.positions(torch.arange(offset, offset + T, device=ids.device))
        elif self.kind == "rotary":
            pass  # positions enter each block's attention
        else:
            table = sinusoidal_positions(offset + T, self.dim, device=ids.device, dtype=x.dtype)
            x = x * self.dim**0.5 + table[offset:]
        if self.types is not None:
            x = x + self.types(token_type_ids if token_type_ids is not None else torch.zeros_like(ids))
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)


def _padding(attention_mask: Tensor | None):
    return None if attention_mask is None else key_padding(attention_mask)


def _use_rotary(model: nn.Module, config: ModelConfig) -> None:
    if config.positions == "rotary":
        from ..attn.layer import MultiHeadAttention

        for m in model.modules():
            if isinstance(m, MultiHeadAttention):
                m.rotary = True


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
        _use_rotary(self, config)

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
        # GPT-2's initialisation of the (tied) embeddings: with PyTorch's N(0, 1) the first logits
        # have a standard deviation of sqrt(d_model) and training starts far from uniform.
        nn.init.normal_(self.embeddings.tokens.weight, std=0.02)
        if self.embeddings.positions is not None:
            nn.init.normal_(self.embeddings.positions.weight, std=0.02)
        _use_rotary(self, config)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                cache: list[KVCache] | None = None) -> Tensor:
        """``cache``: one :class:`KVCache` per layer for incremental decoding (the tokens already
        in it come before ``input_ids``; ``attention_mask`` then covers all of them)."""
        offset = len(cache[0]) if cache else 0
        x = self.embeddings(input_ids, offset=offset)  # (B, T, D)
        pad = _padding(attention_mask)
        mask = causal() if pad is None else causal() & pad
        for i, layer in enumerate(self.layers):
            x = layer(x, None, mask, None, cache[i] if cache else None)
        return linear(self.final_norm(x), self.embeddings.tokens.weight)  # (B, T, V)

    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int, *, use_cache: bool = True) -> Tensor:
        """Greedy decoding: (B, T) → (B, T + max_new_tokens). With the KV cache each step feeds
        one token; without it, the whole sequence again (same tokens, tested)."""
        cache = [KVCache() for _ in self.layers] if use_cache else None
        ids, step_input = input_ids, input_ids
        for _ in range(max_new_tokens):
            logits = self(step_input, cache=cache) if use_cache else self(ids)
            nxt = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
            ids = torch.cat([ids, nxt], 1)
            step_input = nxt
        return ids


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
        _use_rotary(self, config)

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
        return linear(x, self.embeddings.tokens.weight)  # (B, T, V)
