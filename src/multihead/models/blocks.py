"""Transformer blocks built from :class:`~multihead.MultiHeadAttention`.

``EncoderBlock``: x → x + Attn(x) → x + FFN(x), with LayerNorm after each residual (post-norm,
the original Transformer and BERT) or before each sublayer (pre-norm, GPT-2/3).
``DecoderBlock``: masked self-attention, optional cross-attention to an encoder's memory, FFN.
Either can recompute its activations in backward (``checkpoint=True``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor, nn

from ..attn.layer import KVCache, MultiHeadAttention
from ..attn.precision import Linear
from ..masks import Mask, causal

__all__ = ["DecoderBlock", "EncoderBlock", "FeedForward", "sinusoidal_positions"]


def sinusoidal_positions(length: int, dim: int, *, device=None, dtype=None) -> Tensor:
    """(length, dim) sinusoidal position encodings of Vaswani et al. (2017), §3.5."""
    pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]  # (T, 1)
    freq = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim, device=device)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return table.to(dtype or torch.float32)


class FeedForward(nn.Module):
    """Linear(D, F) → activation → dropout → Linear(F, D)."""

    def __init__(self, dim: int, hidden: int, *, activation: str = "gelu", dropout: float = 0.0,
                 device=None, dtype=None) -> None:
        super().__init__()
        if activation not in ("gelu", "relu"):
            raise ValueError(f"activation must be 'gelu' or 'relu'; got {activation!r}")
        # precision.Linear: nn.Linear's product, raised where a half one would be slow (attn.precision)
        self.up = Linear(dim, hidden, device=device, dtype=dtype)
        self.down = Linear(hidden, dim, device=device, dtype=dtype)
        self.activation = activation
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        up = self.up(x)  # (B, T, F)
        h = F.gelu(up) if self.activation == "gelu" else F.relu(up)
        return self.down(self.dropout(h))  # (B, T, D)


class _Block(nn.Module):
    def __init__(self, norm_first: bool, checkpoint: bool) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.checkpoint = checkpoint

    def _sublayer(self, x: Tensor, norm: nn.LayerNorm, fn, dropout: nn.Dropout) -> Tensor:
        if self.norm_first:
            return x + dropout(fn(norm(x)))
        return norm(x + dropout(fn(x)))

    def forward(self, *args, **kwargs):  # type: ignore[override]
        if self.checkpoint and self.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(self._forward, *args, use_reentrant=False, **kwargs)
        return self._forward(*args, **kwargs)


class EncoderBlock(_Block):
    """Self-attention + FFN. ``forward(x (B, T, D), mask=None) -> (B, T, D)``; mask: True = may attend."""

    def __init__(self, dim: int, heads: int, hidden: int, *, dropout: float = 0.1, attention_dropout: float = 0.0,
                 activation: str = "gelu", norm_first: bool = False, eps: float = 1e-5, checkpoint: bool = False,
                 num_kv_heads: int | None = None, device=None, dtype=None) -> None:
        super().__init__(norm_first, checkpoint)
        factory = {"device": device, "dtype": dtype}
        self.attn = MultiHeadAttention(dim, heads, num_kv_heads=num_kv_heads, dropout=attention_dropout, **factory)
        self.ffn = FeedForward(dim, hidden, activation=activation, dropout=0.0, **factory)
        self.norm1 = nn.LayerNorm(dim, eps=eps, **factory)
        self.norm2 = nn.LayerNorm(dim, eps=eps, **factory)
        self.dropout = nn.Dropout(dropout)

    def _forward(self, x: Tensor, mask: Mask | Tensor | None = None) -> Tensor:
        x = self._sublayer(x, self.norm1, lambda h: self.attn(h, mask=mask), self.dropout)
        return self._sublayer(x, self.norm2, self.ffn, self.dropout)


class DecoderBlock(_Block):
    """Causal self-attention, optional cross-attention, FFN.

    ``forward(x (B, T, D), memory (B, S, D) | None, self_mask=None, memory_mask=None) -> (B, T, D)``;
    the self-attention is causal unless ``self_mask`` is given.
    """

    def __init__(self, dim: int, heads: int, hidden: int, *, cross_attention: bool = True, dropout: float = 0.1,
                 attention_dropout: float = 0.0, activation: str = "gelu", norm_first: bool = False,
                 eps: float = 1e-5, checkpoint: bool = False, num_kv_heads: int | None = None,
                 device=None, dtype=None) -> None:
        super().__init__(norm_first, checkpoint)
        factory = {"device": device, "dtype": dtype}
        self.attn = MultiHeadAttention(dim, heads, num_kv_heads=num_kv_heads, dropout=attention_dropout, **factory)
        self.cross = MultiHeadAttention(dim, heads, dropout=attention_dropout, **factory) if cross_attention else None
        self.ffn = FeedForward(dim, hidden, activation=activation, dropout=0.0, **factory)
        self.norm1 = nn.LayerNorm(dim, eps=eps, **factory)
        self.norm_cross = nn.LayerNorm(dim, eps=eps, **factory) if cross_attention else None
        self.norm2 = nn.LayerNorm(dim, eps=eps, **factory)
        self.dropout = nn.Dropout(dropout)

    def _forward(self, x: Tensor, memory: Tensor | None = None, self_mask: Mask | Tensor | None = None,
                 memory_mask: Mask | Tensor | None = None, cache: KVCache | None = None) -> Tensor:
        mask = self_mask if self_mask is not None else causal()
        x = self._sublayer(x, self.norm1, lambda h: self.attn(h, mask=mask, cache=cache), self.dropout)
        if self.cross is not None:
            if memory is None:
                raise ValueError("this decoder block has cross-attention: pass the encoder's memory (B, S, D)")
            assert self.norm_cross is not None
            x = self._sublayer(x, self.norm_cross, lambda h: self.cross(h, memory, mask=memory_mask), self.dropout)
        return self._sublayer(x, self.norm2, self.ffn, self.dropout)
