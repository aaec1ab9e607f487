"""Swap our ``MultiHeadAttention`` into Hugging Face BERT-family models.

A BERT attention block is ``BertAttention = (self: BertSelfAttention, output: BertSelfOutput)``:
query/key/value projections, softmax attention, then ``output.dense`` (W^O), dropout, residual
and LayerNorm. :class:`BertAttentionAdapter` replaces the whole block with our layer (which
owns W^O) plus the block's own dropout and LayerNorm, and accepts the same call.

Modules are recognised by structure (``.self.query/key/value`` and ``.output.dense/LayerNorm``),
not by class, so BERT, RoBERTa, MiniLM and other copies of the BERT code work alike.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from ..attn.layer import MultiHeadAttention
from ..masks import causal, from_tensor
from .model import ModelLike, as_module
from .sites import UnsupportedModelError, find_sites

__all__ = ["BertAttentionAdapter", "attention_from_bert", "is_bert_attention", "swap_bert_attention"]


def is_bert_attention(module: nn.Module) -> bool:
    """True for a BERT-style attention block (``.self`` projections + ``.output`` W^O/LayerNorm)."""
    inner, output = getattr(module, "self", None), getattr(module, "output", None)
    return (
        isinstance(inner, nn.Module)
        and all(isinstance(getattr(inner, n, None), nn.Linear) for n in ("query", "key", "value"))
        and isinstance(getattr(output, "dense", None), nn.Linear)
        and isinstance(getattr(output, "LayerNorm", None), nn.LayerNorm)
    )


def attention_from_bert(block: nn.Module) -> MultiHeadAttention:
    """Our layer with the exact weights of a BERT attention block (query/key/value + output.dense).

    The block's dropout and LayerNorm are not part of the returned layer; see
    :class:`BertAttentionAdapter` for a drop-in replacement of the whole block.
    """
    if not is_bert_attention(block):
        raise TypeError(
            f"expected a BERT-style attention block with .self.query/key/value and .output.dense; "
            f"got {type(block).__name__}"
        )
    inner, dense = block.self, block.output.dense
    num_heads = int(inner.num_attention_heads)
    query, key, value = inner.query, inner.key, inner.value
    hidden = query.in_features
    if query.out_features != hidden or dense.out_features != hidden:
        raise ValueError(
            f"BERT attention with all_head_size={query.out_features} != hidden_size={hidden} is not supported"
        )
    kv_in = key.in_features
    layer = MultiHeadAttention(
        hidden, num_heads, kdim=kv_in, vdim=value.in_features,
        bias=query.bias is not None, dropout=float(getattr(inner.dropout, "p", 0.0)),
        device=query.weight.device, dtype=query.weight.dtype,
    )
    layer.train(block.training)
    with torch.no_grad():
        for ours, theirs in ((layer.q_proj, query), (layer.k_proj, key), (layer.v_proj, value),
                             (layer.out_proj, dense)):
            ours.weight.copy_(theirs.weight)
            if ours.bias is not None:
                ours.bias.copy_(theirs.bias)
    scaling = getattr(inner, "scaling", None)
    if scaling is not None and abs(float(scaling) - layer.head_dim ** -0.5) > 1e-12:
        raise ValueError(f"BERT attention with scaling {scaling} != 1/sqrt(head_dim) is not supported")
    return layer


class BertAttentionAdapter(nn.Module):
    """Drop-in replacement of a BERT attention block built on :class:`MultiHeadAttention`.

    ``forward(hidden_states (B, T, D), attention_mask=None, encoder_hidden_states=None,
    encoder_attention_mask=None, ...) -> (hidden_states (B, T, D), weights (B, H, T, S) | None)``.
    ``attention_mask`` is whatever transformers passes to its attention functions: a bool
    (True = may attend) or additive float tensor broadcastable to (B, 1, T, S), or None.
    """

    def __init__(self, attn: MultiHeadAttention, layer_norm: nn.LayerNorm, dropout: nn.Module,
                 *, is_causal: bool = False, is_cross_attention: bool = False) -> None:
        super().__init__()
        self.attn = attn
        self.LayerNorm = layer_norm
        self.dropout = dropout
        self.is_causal = is_causal
        self.is_cross_attention = is_cross_attention
        self.need_weights = False  # set True to return per-head weights as the second output

    @classmethod
    def from_bert(cls, block: nn.Module) -> BertAttentionAdapter:
        """Build the adapter from a BERT attention block, sharing its LayerNorm and dropout."""
        attn = attention_from_bert(block)
        adapter = cls(
            attn, block.output.LayerNorm, block.output.dropout,
            is_causal=bool(getattr(block.self, "is_causal", False)),
            is_cross_attention=bool(getattr(block, "is_cross_attention", False)),
        )
        return adapter.train(block.training)  # a model in eval mode must stay without dropout

    def forward(
        self,
        hidden_states: Tensor,
        attention_mask: Tensor | None = None,
        encoder_hidden_states: Tensor | None = None,
        encoder_attention_mask: Tensor | None = None,
        cache: Any = None,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor | None]:
        if cache is not None or past_key_values is not None:
            raise NotImplementedError("BertAttentionAdapter does not support a key/value cache")
        if self.is_cross_attention:
            context, mask_tensor = encoder_hidden_states, encoder_attention_mask
        else:
            context, mask_tensor = None, attention_mask
        if mask_tensor is not None:
            mask = from_tensor(mask_tensor)
        else:
            # transformers leaves a pure causal mask implicit (is_causal) for fused kernels.
            mask = causal() if self.is_causal and not self.is_cross_attention else None
        result = self.attn(hidden_states, context, mask=mask, need_weights=self.need_weights)
        out, weights = result if self.need_weights else (result, None)
        hidden = self.LayerNorm(self.dropout(out) + hidden_states)  # (B, T, D)
        return hidden, weights


def swap_bert_attention(model: ModelLike, *, inplace: bool = False) -> nn.Module:
    """Replace every BERT-style attention block of ``model`` with a :class:`BertAttentionAdapter`.

    Returns the modified model: a deep copy unless ``inplace`` (the caller's model is left
    untouched by default). Raises ValueError when the model has no such block.
    """
    model = as_module(model)
    target = model if inplace else copy.deepcopy(model)
    blocks = []
    for site in _sites_or_none(target):  # the one way of finding attention; a BERT block holds its site
        block_name = site.name.rpartition(".")[0]
        block = target.get_submodule(block_name) if block_name else target
        if site.name and is_bert_attention(block):
            blocks.append((block_name, block))
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no BERT-style attention blocks to swap")
    for name, block in blocks:
        parent_name, _, child = name.rpartition(".")
        parent = target.get_submodule(parent_name) if parent_name else target
        setattr(parent, child, BertAttentionAdapter.from_bert(block))
    return target


def _sites_or_none(model: nn.Module) -> list:
    try:
        return find_sites(model)
    except UnsupportedModelError:
        return []
