"""Long-context statistics of every head: how far it looks, and would it survive a window.

Computed over the real query rows of long inputs (``mh.analyze(..., chunk=...)``, ``multihead
analyze --document``), chunk by chunk; ``i`` and ``j`` are positions among the real tokens, and
``d = |i − j|``:

| key | definition for one query row ``p_i`` |
|---|---|
| ``sink_first`` | ``p_i,0``: mass on the first token (the attention sink of StreamingLLM) |
| ``sink_first4`` | mass on the first 4 tokens (the sinks StreamingLLM keeps) |
| ``long_256`` / ``long_1024`` | mass on keys farther than 256 / 1,024 tokens (``d > 256``) |
| ``window_64`` / ``_256`` / ``_1024`` | mass inside ±w (``d ≤ w``): what a window of w would keep |

and, from each head's distance distribution (its mass summed over rows in log-spaced bins
``d = 0, 1, 2–3, 4–7, …, 2^k – 2^(k+1) − 1``):

| key | definition |
|---|---|
| ``distance_median`` / ``_p90`` | the smallest 2^k with half / 90 % of the mass at distances below it (0: on itself) |
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .metrics import TokenInfo

__all__ = ["BINS", "LONG_METRICS", "LongContextStatistics"]

LONG_METRICS = ("sink_first", "sink_first4", "long_256", "long_1024", "window_64", "window_256", "window_1024",
                "distance_median", "distance_p90")
#: Distance bins: d = 0, then [2^k, 2^(k+1)) for k = 0 .. 16 (up to 131,071 tokens).
BINS = 18


class LongContextStatistics:
    """Running sums of the long-context metrics for an (L, H) grid of heads."""

    def __init__(self, num_layers: int, num_heads: int) -> None:
        self.shape = (num_layers, num_heads)
        self.sums = torch.zeros(7, num_layers, num_heads, dtype=torch.float64)  # the row metrics
        self.rows = torch.zeros(num_layers, dtype=torch.float64)
        self.histogram = torch.zeros(num_layers, num_heads, BINS, dtype=torch.float64)

    def update(self, layer: int, weights: Tensor, tokens: TokenInfo, start: int = 0) -> None:
        """weights (B, H, C, S): query rows ``start`` .. ``start + C`` of a self-attention over S tokens."""
        B, H, C, _ = weights.shape
        p = weights.detach().float()  # (B, H, C, S)
        valid = tokens.valid.to(p.device)  # (B, S)
        pos = valid.long().cumsum(-1) - 1  # (B, S) position among real tokens
        rows = valid[:, start:start + C].to(torch.float32)  # (B, C) real query rows
        d = (pos[:, None, :] - pos[:, start:start + C, None]).abs()  # (B, C, S)
        d = torch.where(valid[:, None, :], d, torch.full_like(d, -1))  # padding keys: no bin
        first4 = (valid & (pos < 4)).float()  # (B, S)
        first = (valid & (pos == 0)).float()
        masses = [p @ first[:, None, :, None], p @ first4[:, None, :, None]]  # (B, H, C, 1) each
        for far in (256, 1024):
            masses.append((p * (d > far)[:, None]).sum(-1, keepdim=True))
        for w in (64, 256, 1024):
            masses.append((p * ((d >= 0) & (d <= w))[:, None]).sum(-1, keepdim=True))
        values = torch.cat(masses, -1)  # (B, H, C, 7)
        weighted = (values * rows[:, None, :, None]).sum(dim=(0, 2))  # (H, 7)
        self.sums[:, layer] += weighted.T.to(torch.float64).cpu()
        self.rows[layer] += float(rows.sum())
        bins = torch.where(d > 0, torch.floor(torch.log2(d.clamp_min(1).float())).long() + 1, torch.zeros_like(d))
        bins = bins.clamp_max(BINS - 1)  # (B, C, S); padding keys carry no weight
        keep = (d >= 0) & (rows[:, :, None] > 0)  # (B, C, S)
        mass = (p * keep[:, None]).reshape(B, H, -1)  # (B, H, C·S)
        index = bins.reshape(B, 1, -1).expand(B, H, -1)
        hist = torch.zeros(B, H, BINS, dtype=torch.float32, device=p.device).scatter_add_(-1, index, mass)
        self.histogram[layer] += hist.sum(0).to(torch.float64).cpu()

    def merge(self, other: LongContextStatistics) -> None:
        self.sums += other.sums
        self.rows += other.rows
        self.histogram += other.histogram

    def means(self) -> dict[str, Tensor]:
        """Each metric as an (L, H) float64 tensor (NaN where nothing was counted)."""
        rows = self.rows.where(self.rows > 0, torch.full_like(self.rows, math.nan))[:, None]  # (L, 1)
        out = {name: self.sums[k] / rows for k, name in enumerate(LONG_METRICS[:7])}
        total = self.histogram.sum(-1, keepdim=True)  # (L, H, 1)
        cumulative = self.histogram.cumsum(-1) / total.where(total > 0, torch.full_like(total, math.nan))
        edges = torch.tensor([0.0] + [2.0 ** k for k in range(BINS - 1)], dtype=torch.float64)  # lower edges
        upper = torch.cat([edges[1:], edges[-1:] * 2])  # the edge each bin lies within: 1, 2, 4, ...
        upper[0] = 0.0  # d = 0 lies within 0
        for name, share in (("distance_median", 0.5), ("distance_p90", 0.9)):
            reached = (cumulative >= share - 1e-9).float().argmax(-1)  # (L, H) first bin reaching the share
            value = upper[reached]
            out[name] = value.where(~cumulative[..., -1].isnan(), torch.full_like(value, math.nan))
        return out
