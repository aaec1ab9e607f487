"""Patch statistics of a vision transformer (ViT, DeiT, ...): every head's attention over the patch grid.

Each image is ``P`` prefix tokens ([CLS], and DeiT's distillation token) followed by a ``g × g``
grid of patches, row by row. The metrics are means over the patch query rows (the prefix tokens'
own rows are not patches):

| key | definition for one patch row ``p_i`` |
|---|---|
| ``entropy`` / ``entropy_norm`` | ``-Σ_j p_ij log p_ij``; divided by ``log S`` (1 is uniform) |
| ``max_weight`` | ``max_j p_ij`` |
| ``cls`` | mass on the prefix tokens ([CLS] / distillation) |
| ``self`` | ``p_ii`` |
| ``grid_distance`` | ``Σ_j p_ij · ‖g(i) − g(j)‖`` over patches ``j``: mean Euclidean distance on the grid, in patches |
| ``local_3x3`` | mass on the 3 × 3 neighbourhood of the patch (itself included) |

"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...hf.route import AttentionChunk
from .base import ReducerBase

__all__ = ["PATCH_METRICS", "PatchStatistics", "grid_size"]

PATCH_METRICS = ("entropy", "entropy_norm", "max_weight", "cls", "self", "grid_distance", "local_3x3")


class PatchStatistics(ReducerBase):
    """Running sums of the patch metrics for an (L, H) grid of heads (a reducer)."""

    def __init__(self, num_layers: int, num_heads: int) -> None:
        self.shape = (num_layers, num_heads)
        self.sums = torch.zeros(len(PATCH_METRICS), num_layers, num_heads, dtype=torch.float64)
        self.rows = 0

    def update(self, chunk: AttentionChunk) -> None:
        """A chunk of a map over P prefix tokens and a g x g grid of patches (T = P + g²)."""
        layer, T = chunk.layer, chunk.rows
        p = chunk.weights.detach().float()  # (B, H, c, K)
        B, K = p.shape[0], p.shape[3]
        if K < T:  # a streamed chunk's keys end early (never for a vision model's full attention)
            p = torch.cat([p, p.new_zeros(*p.shape[:3], T - K)], -1)
        g, prefix = grid_size(T)
        first = max(prefix, chunk.start)  # the chunk's first patch row
        if first >= chunk.stop:
            return
        rows = p[:, :, first - chunk.start:, :]  # (B, H, n, T) the chunk's patches' rows
        n = rows.shape[2]
        r_all = torch.arange(g * g, device=p.device) // g
        c_all = torch.arange(g * g, device=p.device) % g
        r, cc = r_all[first - prefix:first - prefix + n], c_all[first - prefix:first - prefix + n]  # (n,)
        dist = ((r[:, None] - r_all[None, :]).float() ** 2 + (cc[:, None] - c_all[None, :]).float() ** 2).sqrt()
        near = ((r[:, None] - r_all[None, :]).abs() <= 1) & ((cc[:, None] - c_all[None, :]).abs() <= 1)  # (n, g²)
        patches = rows[..., prefix:]  # (B, H, n, g²)
        own = torch.arange(n, device=p.device) + (first - prefix)  # (n,) each row's own patch
        entropy = -rows.clamp_min(1e-30).log().mul(rows).sum(-1)  # (B, H, g²)
        values = {
            "entropy": entropy,
            "entropy_norm": entropy / math.log(T),
            "max_weight": rows.amax(-1),
            "cls": rows[..., :prefix].sum(-1),
            "self": patches.gather(-1, own.view(1, 1, n, 1).expand(B, patches.shape[1], n, 1))[..., 0],
            "grid_distance": (patches * dist).sum(-1),
            "local_3x3": (patches * near).sum(-1),
        }
        for name, value in values.items():
            self.sums[PATCH_METRICS.index(name), layer] += value.to(torch.float64).sum(dim=(0, 2)).cpu()
        if layer == 0:
            self.rows += B * n

    def merge(self, other: PatchStatistics) -> None:
        self.sums += other.sums
        self.rows += other.rows

    def result(self) -> dict[str, Tensor]:
        out = self.sums / self.rows if self.rows else torch.full_like(self.sums, math.nan)
        return {name: out[k] for k, name in enumerate(PATCH_METRICS)}


def _grid_size(T: int) -> tuple[int, int]:
    """(g, P): the largest square grid of patches that leaves 1-2 prefix tokens."""
    for prefix in (1, 2, 0):
        g = math.isqrt(T - prefix)
        if g * g == T - prefix:
            return g, prefix
    raise ValueError(f"{T} tokens are not a square grid of patches after [CLS] (and a distillation token)")


def grid_size(T: int) -> tuple[int, int]:
    """(g, P): the largest square grid of patches that leaves 1-2 prefix tokens."""
    for prefix in (1, 2, 0):
        g = math.isqrt(T - prefix)
        if g * g == T - prefix:
            return g, prefix
    raise ValueError(f"{T} tokens are not a square grid of patches after [CLS] (and a distillation token)")
