"""Feeding reducers by hand in tests: hand-built maps as the chunks a capture would hand over."""

from __future__ import annotations

import torch
from torch import nn

from multihead.hf.route import AttentionChunk
from multihead.hf.sites import AttentionSite
from multihead.inputs import Batch, TokenInfo


def site(num_heads: int, *, w_o: torch.Tensor | None = None, stack: str = "encoder") -> AttentionSite:
    """A stand-in attention site (its W^O, (D, H·Dv), when given)."""
    o = None
    if w_o is not None:
        o = nn.Linear(w_o.shape[1], w_o.shape[0], bias=False)
        o.weight.data = w_o
    return AttentionSite("", nn.Identity(), stack, 0, "self", num_heads, num_heads, 1, False, o=o)


def chunk(weights: torch.Tensor, *, layer: int = 0, start: int = 0, rows: int | None = None,
          keys: int | None = None, visible: torch.Tensor | None = None, outputs: torch.Tensor | None = None,
          w_o: torch.Tensor | None = None, call_memo: dict | None = None) -> AttentionChunk:
    """weights (B, H, c, K) as query rows ``start`` .. of a (rows, keys) map."""
    B, H, c, K = weights.shape
    rows = start + c if rows is None else rows
    if visible is None:
        visible = torch.ones(1, 1, c, K, dtype=torch.bool)
    if outputs is None:
        outputs = torch.zeros(B, H, c, 1)
    return AttentionChunk(site(H, w_o=w_o), layer, start, rows, K if keys is None else keys, weights, outputs,
                          visible, {} if call_memo is None else call_memo)


def feed(reducer, tokens: TokenInfo | Batch, layers: dict[int, torch.Tensor] | list[torch.Tensor], *,
         visible: torch.Tensor | None = None, outputs: dict | list | None = None, w_o: torch.Tensor | None = None,
         rows_per_chunk: int | None = None, causal_keys: bool = False):
    """One batch of whole maps (B, H, T, S) per layer through ``reducer``: begin, every layer's
    chunks (``rows_per_chunk`` rows each; ``causal_keys``: each chunk's keys end after its last
    row, as a causal streamed capture hands them over), end. Returns the reducer."""
    batch = tokens if isinstance(tokens, Batch) else Batch(tokens, list(range(tokens.valid.shape[0])))
    reducer.begin_batch(batch)
    items = layers.items() if isinstance(layers, dict) else enumerate(layers)
    for layer, weights in items:
        T, S = weights.shape[2], weights.shape[3]
        step = rows_per_chunk or T
        memo: dict = {}
        out = None if outputs is None else outputs[layer]
        for start in range(0, T, step):
            stop = min(T, start + step)
            K = stop if causal_keys else S
            vis = None if visible is None else visible[..., start:stop, :K]
            reducer.update(chunk(weights[:, :, start:stop, :K], layer=layer, start=start, rows=T, keys=S,
                                 visible=vis, outputs=None if out is None else out[:, :, start:stop],
                                 w_o=w_o, call_memo=memo))
    reducer.end_batch()
    return reducer
