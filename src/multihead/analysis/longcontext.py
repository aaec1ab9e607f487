"""Long-context statistics of every head: how far it looks, and would it survive a window.

Computed over the real query rows of long inputs (``mh.analyze(..., chunk=...)``, ``multihead
analyze --document``), chunk by chunk; ``i`` and ``j`` are positions among the real tokens, and
``d = |i − j|``:

| key | definition for one query row ``p_i`` |
|---|---|
| ``sink_first`` | ``p_i,0``: mass on the first token (the attention sink of StreamingLLM) |
| ``sink_first4`` | mass on the first 4 tokens (the sinks StreamingLLM keeps) |
| ``long_256`` / ``long_1024`` | mass on keys farther than 256 / 1,024 tokens (``d > 256``) |
| ``long_1024_past_sinks`` | mass farther than 1,024 tokens on keys other than the first 4 (reading, not a sink) |
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

from .metrics import TokenInfo, real_positions

__all__ = ["BINS", "LONG_METRICS", "LongContextStatistics"]

LONG_METRICS = ("sink_first", "sink_first4", "long_256", "long_1024", "window_64", "window_256", "window_1024",
                "long_1024_past_sinks", "distance_median", "distance_p90")
#: the metrics that are row means (the rest come from the distance histogram)
_ROW_METRICS = LONG_METRICS[:8]
#: Distance bins: d = 0, then [2^k, 2^(k+1)) for k = 0 .. 16 (up to 131,071 tokens).
BINS = 18


class LongContextStatistics:
    """Running sums of the long-context metrics for an (L, H) grid of heads."""

    def __init__(self, num_layers: int, num_heads: int) -> None:
        self.shape = (num_layers, num_heads)
        self.sums = torch.zeros(len(_ROW_METRICS), num_layers, num_heads, dtype=torch.float64)  # the row metrics
        self.rows = torch.zeros(num_layers, dtype=torch.float64)
        self.histogram = torch.zeros(num_layers, num_heads, BINS, dtype=torch.float64)
        self.longest = 0  # real tokens of the longest text seen

    def update(self, layer: int, weights: Tensor, tokens: TokenInfo, start: int = 0) -> None:
        """weights (B, H, C, K): query rows ``start`` .. ``start + C`` of a self-attention over T
        tokens, over its first K <= T keys (keys K.. get no weight)."""
        C = weights.shape[2]
        p = weights.detach().float()  # (B, H, C, K)
        valid = tokens.valid.to(p.device)  # (B, T)
        pos, prefix = real_positions(valid)  # (B, T) position among real tokens
        rows = valid[:, start:start + C].to(torch.float32)  # (B, C) real query rows
        if start == 0:  # once per layer and batch
            self.longest = max(self.longest, int(valid.sum(-1).max()))
        values, hist = (_by_prefix_sums if prefix else _by_offsets)(p, valid, pos, start)
        weighted = (values * rows[:, None, :, None]).sum(dim=(0, 2))  # (H, 8)
        self.sums[:, layer] += weighted.T.to(torch.float64).cpu()
        self.rows[layer] += float(rows.sum())
        self.histogram[layer] += (hist * rows[:, None, :, None]).sum(dim=(0, 2)).to(torch.float64).cpu()

    def merge(self, other: LongContextStatistics) -> None:
        self.longest = max(self.longest, other.longest)
        self.sums += other.sums
        self.rows += other.rows
        self.histogram += other.histogram

    def means(self) -> dict[str, Tensor]:
        """Each metric as an (L, H) float64 tensor (NaN where nothing was counted)."""
        rows = self.rows.where(self.rows > 0, torch.full_like(self.rows, math.nan))[:, None]  # (L, 1)
        out = {name: self.sums[k] / rows for k, name in enumerate(_ROW_METRICS)}
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


def _by_prefix_sums(p: Tensor, valid: Tensor, pos: Tensor, start: int) -> tuple[Tensor, Tensor]:
    """The row metrics (B, H, C, 8) and distance histograms (B, H, C, BINS) when the real tokens
    are 0..n-1 (right padding): every mass inside ±r of row i is a difference of two prefix sums
    of the row, so one cumulative pass serves all windows and bins."""
    B, H, C, K = p.shape
    dev = p.device
    # float32 suffices: a window's mass is a difference of two prefix sums, measured within 1e-7 of
    # float64 at 32k keys (and float64 cumsum is ~10x slower on the CPU).
    cs = p.cumsum(-1)  # (B, H, C, K): cs[..., j] = Σ_{<=j}
    i = torch.arange(start, start + C, device=dev)  # (C,) the rows' positions
    # Σ_{|j-i| <= r} p_ij = cs[i + r] - cs[i - r - 1] for every radius at once: r = 0, 2^k - 1 for
    # the bins' edges (k = 1 .. BINS - 1), then the windows 64, 256, 1,024.
    radii = torch.tensor([0] + [2 ** k - 1 for k in range(1, BINS)] + [64, 256, 1024], device=dev)  # (R,)
    ends = torch.cat([i[:, None] + radii, i[:, None] - radii - 1], -1)  # (C, 2R)
    picked = cs.gather(-1, ends.clamp(0, K - 1).expand(B, H, C, -1)) * (ends >= 0)  # (B, H, C, 2R)
    within = picked[..., :len(radii)] - picked[..., len(radii):]  # (B, H, C, R)
    total = cs[..., -1]  # (B, H, C)
    inside, windows = within[..., :BINS].clone(), within[..., BINS:]  # (B, H, C, BINS), (B, H, C, 3)
    # the first 4 keys' mass beyond 1,024 tokens: keys j <= min(3, i - 1025)
    sink_far = cs.gather(-1, (i - 1025).clamp(0, min(3, K - 1)).view(1, 1, C, 1).expand(B, H, C, 1))[..., 0] \
        * (i >= 1025)  # (B, H, C)
    values = torch.stack([p[..., 0], cs[..., min(4, K) - 1], total - windows[..., 1], total - windows[..., 2],
                          windows[..., 0], windows[..., 1], windows[..., 2],
                          total - windows[..., 2] - sink_far], -1)  # (B, H, C, 8)
    # bins: d = 0, then [2^(k-1), 2^k) for k = 1 .. BINS - 1; the mass with d < 2^k is within 2^k - 1
    inside[..., -1] = total  # the last bin takes every farther key too
    hist = torch.cat([inside[..., :1], inside.diff(dim=-1)], -1).clamp_min(0)  # (B, H, C, BINS)
    return values, hist


def _by_offsets(p: Tensor, valid: Tensor, pos: Tensor, start: int) -> tuple[Tensor, Tensor]:
    """The same as :func:`_by_prefix_sums` for any padding: distances between real tokens,
    measured key by key."""
    B, H, C, K = p.shape
    valid_k, pos_k = valid[:, :K], pos[:, :K]
    d = (pos_k[:, None, :] - pos[:, start:start + C, None]).abs()  # (B, C, K)
    d = torch.where(valid_k[:, None, :], d, torch.full_like(d, -1))  # padding keys: no bin
    first4 = (valid_k & (pos_k < 4)).float()  # (B, K)
    first = (valid_k & (pos_k == 0)).float()
    masses = [p @ first[:, None, :, None], p @ first4[:, None, :, None]]  # (B, H, C, 1) each
    for far in (256, 1024):
        masses.append((p * (d > far)[:, None]).sum(-1, keepdim=True))
    for w in (64, 256, 1024):
        masses.append((p * ((d >= 0) & (d <= w))[:, None]).sum(-1, keepdim=True))
    masses.append((p * ((d > 1024) & (pos_k >= 4)[:, None, :])[:, None]).sum(-1, keepdim=True))
    values = torch.cat(masses, -1)  # (B, H, C, 8)
    bins = torch.where(d > 0, torch.floor(torch.log2(d.clamp_min(1).float())).long() + 1, torch.zeros_like(d))
    bins = bins.clamp_max(BINS - 1)  # (B, C, K)
    mass = (p * (d >= 0)[:, None]).reshape(B, H, C, K)  # padding keys carry no weight
    index = bins[:, None].expand(B, H, C, K)
    hist = torch.zeros(B, H, C, BINS, dtype=torch.float32, device=p.device).scatter_add_(-1, index, mass)
    return values, hist
