"""Bootstrap over texts: how much a corpus statistic would move on another corpus like this one.

Every head metric is a ratio of sums over texts (a token-weighted mean: Σ_t s_t / Σ_t n_t). The
reducers keep those sums per *group* of texts — text ``i`` goes to group ``i % GROUPS`` — so memory
does not grow with the corpus; a corpus of at most :data:`GROUPS` texts has one text per group.
A resample draws the groups with replacement (seeded: the same draws in every run); the interval is
the percentile interval of the resampled ratios at :data:`LEVEL`. Resampling whole groups (the
cluster bootstrap) keeps each text's tokens together: a text's rows are not independent. So a
corpus of one text (a ``--document``) has no interval: every resample of one group is that group,
and its interval would be the point itself, a certainty nothing measured.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["GROUPS", "LEVEL", "MIN_GROUPS", "RESAMPLES", "SEED", "intervals", "resample_weights", "resampled",
           "used_groups"]

#: Text groups the per-group sums are kept for.
GROUPS = 256
#: Resamples of the groups, and their seed.
RESAMPLES, SEED = 200, 0
#: Coverage of the percentile intervals.
LEVEL = 0.95
#: Groups that must hold counts for an interval (or a label's stability): one group resamples to itself.
MIN_GROUPS = 2


def resample_weights(used: int, *, resamples: int = RESAMPLES, seed: int = SEED) -> Tensor:
    """(R, used) float64: how many times each of ``used`` groups is drawn in each resample."""
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randint(used, (resamples, used), generator=generator)  # (R, used)
    weights = torch.zeros(resamples, used, dtype=torch.float64)
    return weights.scatter_add_(1, draws, torch.ones_like(draws, dtype=torch.float64))


def resampled(sums: Tensor, counts: Tensor, weights: Tensor) -> Tensor:
    """The ratio Σ w_g s_g / Σ w_g n_g for each resample: ``sums``, ``counts`` (G, ...) per group,
    ``weights`` (R, G) -> (R, ...) (NaN where a resample counted nothing)."""
    G = sums.shape[0]
    flat_s = sums.reshape(G, -1).double()  # (G, X)
    flat_n = counts.reshape(G, -1).double()
    num, den = weights @ flat_s, weights @ flat_n  # (R, X)
    ratio = num / den.where(den > 0, torch.full_like(den, float("nan")))
    return ratio.reshape(weights.shape[0], *sums.shape[1:])


def intervals(sums: Tensor, counts: Tensor, *, level: float = LEVEL, resamples: int = RESAMPLES,
              seed: int = SEED) -> tuple[Tensor, Tensor]:
    """Percentile bootstrap interval (low, high), each shaped ``sums.shape[1:]``, of the ratio of
    group sums over the groups that hold any count (NaN where nothing was counted, and everywhere
    when fewer than :data:`MIN_GROUPS` groups counted anything)."""
    used = used_groups(counts)
    if int(used.sum()) < MIN_GROUPS:  # nothing counted (no head measured), or one text: no spread to draw
        nothing = torch.full(sums.shape[1:], float("nan"), dtype=torch.float64)
        return nothing, nothing.clone()
    weights = resample_weights(int(used.sum()), resamples=resamples, seed=seed)
    values = resampled(sums[used], counts[used], weights)  # (R, ...)
    alpha = (1 - level) / 2
    low = torch.nanquantile(values, alpha, dim=0)
    high = torch.nanquantile(values, 1 - alpha, dim=0)
    return low, high


def used_groups(counts: Tensor) -> Tensor:
    """(G,) the groups that counted anything (empty groups would only dilute the draws)."""
    return counts.reshape(counts.shape[0], -1).gt(0).any(-1)
