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

import math
import mmap

import torch
from torch import Tensor

__all__ = ["GROUPS", "LEVEL", "MAPPED_ZEROS", "MIN_GROUPS", "RESAMPLES", "SEED", "group_table_bytes", "group_zeros",
           "groups_met", "intervals", "resample_weights", "resampled", "used_groups"]

#: Text groups the per-group sums are kept for.
GROUPS = 256
#: Resamples of the groups, and their seed.
RESAMPLES, SEED = 200, 0
#: Coverage of the percentile intervals.
LEVEL = 0.95
#: Groups that must hold counts for an interval (or a label's stability): one group resamples to itself.
MIN_GROUPS = 2


#: Bytes from which :func:`group_zeros` maps its own pages (a smaller table is a page or two anyway).
MAPPED_ZEROS = 1 << 16
#: The system's page.
PAGE = mmap.PAGESIZE
#: Whether this system maps private anonymous memory (not Windows).
_PRIVATE_MAPS = hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS")


def group_zeros(*shape: int) -> Tensor:
    """A float64 table of zeros per group of texts (G, ...) whose pages the system supplies as they
    are first written: a private anonymous memory map of its own (the kernel's zero page behind every
    page until it is written — a read takes no memory — unmapped with the tensor, and not shared with
    a forked child), where ``torch.zeros`` writes every page — and calloc does too once glibc's heap
    serves blocks this large, as it does in a process that has freed some. A run writes the groups
    it meets — a document one of :data:`GROUPS` — so the others hold no memory: SmolLM2's head
    metrics and 47 relations' syntax tables had written 40 MB of zeros a run (~10k page faults,
    ~12 ms of a 1k-token analysis on an Intel Xeon), an 80-layer, 64-head model's syntax tables
    ~0.5 GB. Below :data:`MAPPED_ZEROS`, or where the system has no private anonymous maps, it is
    ``torch.zeros``."""
    count = math.prod(shape)
    if count * 8 < MAPPED_ZEROS or not _PRIVATE_MAPS:
        return torch.zeros(shape, dtype=torch.float64)
    # MAP_PRIVATE: Python's default is MAP_SHARED, whose pages a mere read makes resident (shared memory
    # has no zero page) and whose writes a forked child would share with its parent
    pages = mmap.mmap(-1, count * 8, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(pages, dtype=torch.float64, count=count).view(shape)  # holds the map while it lives


def group_table_bytes(groups: int, row_bytes: int, texts: int | None) -> int:
    """The memory a (``groups``, ...) :func:`group_zeros` table of ``row_bytes`` a group holds through a
    run of ``texts`` texts (None: every group): all of it where it is ``torch.zeros`` (below
    :data:`MAPPED_ZEROS`), else the pages of the groups met — each group's row rounded up to whole
    pages, and one more where it straddles a page's end."""
    whole = groups * row_bytes
    if whole < MAPPED_ZEROS or not _PRIVATE_MAPS:
        return whole
    return min(whole, groups_met(texts, groups) * (-(-row_bytes // PAGE) + 1) * PAGE)


def groups_met(texts: int | None, groups: int = GROUPS) -> int:
    """The groups a run of ``texts`` texts writes (every one where ``texts`` is None: not known)."""
    return groups if texts is None else min(groups, max(texts, 1))


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
