"""Cross-attention statistics of an encoder–decoder model's decoder over its source tokens.

| key | definition for one decoder query row ``p_i`` over the source tokens |
|---|---|
| ``entropy`` / ``entropy_norm`` | as for self-attention, over the real source tokens |
| ``max_weight`` | ``max_j p_ij`` |
| ``diagonal_distance`` | ``Σ_j p_ij · |j − a(i)|``, ``a(i) = i · (n_src − 1)/(n_tgt − 1)`` the aligned position |
| ``aligned`` | ``Σ_{|j − a(i)| ≤ 1} p_ij``: mass within one token of the aligned position |
| ``source_special`` | mass on the source's special tokens (first token, separators / EOS) |

Positions count real tokens only.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...hf.route import AttentionChunk
from .base import ReducerBase

__all__ = ["CROSS_METRICS", "CrossStatistics"]

CROSS_METRICS = ("entropy", "entropy_norm", "max_weight", "diagonal_distance", "aligned", "source_special")


class CrossStatistics(ReducerBase):
    """Running sums of the cross-attention metrics for an (L, H) grid of heads (a reducer: its
    batches carry the decoder's tokens as ``tokens`` and the encoder's as ``keys``)."""

    def __init__(self, num_layers: int, num_heads: int) -> None:
        self.shape = (num_layers, num_heads)
        self.sums = torch.zeros(len(CROSS_METRICS), num_layers, num_heads, dtype=torch.float64)
        self.counts = torch.zeros(len(CROSS_METRICS), num_layers, num_heads, dtype=torch.float64)

    def update(self, chunk: AttentionChunk) -> None:
        """A chunk of decoder query rows over the source keys: rows ``start`` .. ``stop`` of (T, S)."""
        assert self.batch is not None and self.batch.keys is not None, "begin_batch with the source's tokens first"
        layer, start = chunk.layer, chunk.start
        p = chunk.weights.detach().float()  # (B, H, c, K)
        B, H, T, K = p.shape
        queries, keys = self.batch.tokens, self.batch.keys
        if K < keys.valid.shape[-1]:  # a streamed chunk's keys end early: the rest have weight 0
            p = torch.cat([p, p.new_zeros(B, H, T, keys.valid.shape[-1] - K)], -1)
        all_valid, k_valid = queries.valid.to(p.device), keys.valid.to(p.device)  # (B, T_all), (B, S)
        q_valid = all_valid[:, start:start + T]  # (B, T) this chunk's rows
        n_src = k_valid.sum(-1).float()  # (B,)
        n_tgt = all_valid.sum(-1).float()  # (B,)
        i = (all_valid.long().cumsum(-1) - 1).float()[:, start:start + T]  # (B, T) position among real target tokens
        j = (k_valid.long().cumsum(-1) - 1).float()  # (B, S) position among real source tokens
        a = i * ((n_src - 1) / (n_tgt - 1).clamp_min(1))[:, None]  # (B, T) aligned source position
        offset = (j[:, None, :] - a[:, :, None]).abs()  # (B, T, S)
        offset = offset.masked_fill(~k_valid[:, None, :], 0.0)
        n_vis = k_valid.sum(-1, keepdim=True).float().expand(B, T)  # (B, T) keys each row may see
        entropy = -p.add(1e-30).log().mul(p).sum(-1)  # (B, H, T)
        special = (keys.first | keys.separator).to(p.device).float()  # (B, S)
        rows = q_valid[:, None, :].expand(B, H, T)
        informative = rows & (n_vis[:, None, :] > 1)
        values = {
            "entropy": (entropy, rows),
            "entropy_norm": (entropy / n_vis.clamp_min(2).log()[:, None, :], informative),
            "max_weight": (p.amax(-1), rows),
            "diagonal_distance": ((p * offset[:, None]).sum(-1), rows),
            "aligned": ((p * (offset[:, None] <= 1)).sum(-1), rows),
            "source_special": ((p * special[:, None, None, :]).sum(-1), rows),
        }
        for name, (value, where) in values.items():
            m = CROSS_METRICS.index(name)
            w = where.to(torch.float64)
            self.sums[m, layer] += (value.to(torch.float64) * w).sum(dim=(0, 2)).cpu()
            self.counts[m, layer] += w.sum(dim=(0, 2)).cpu()

    def merge(self, other: CrossStatistics) -> None:
        self.sums += other.sums
        self.counts += other.counts

    def result(self) -> dict[str, Tensor]:
        out = self.sums / self.counts.where(self.counts > 0, torch.full_like(self.counts, math.nan))
        return {name: out[k] for k, name in enumerate(CROSS_METRICS)}


def cross_label(metrics: dict[str, float]) -> str:
    """The label of a cross-attention head (rules in the module docstring)."""
    def at_least(key: str, threshold: float) -> bool:
        value = metrics.get(key, math.nan)
        return not math.isnan(value) and value >= threshold

    if at_least("source_special", 0.5):
        return "source-special"
    if at_least("aligned", 0.5):
        return "aligned"
    if at_least("entropy_norm", 0.8):
        return "broad"
    return "mixed"
