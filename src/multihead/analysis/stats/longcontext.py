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

from ...attn.rowstats import RowStatistics, weights_at
from ...hf.route import AttentionChunk
from ...inputs import Batch
from . import native, onepass
from .base import ReducerBase

__all__ = ["BINS", "LONG_METRICS", "LongContextStatistics", "summary_long_values"]

LONG_METRICS = ("sink_first", "sink_first4", "long_256", "long_1024", "window_64", "window_256", "window_1024",
                "long_1024_past_sinks", "distance_median", "distance_p90")
#: the metrics that are row means (the rest come from the distance histogram)
_ROW_METRICS = LONG_METRICS[:8]
#: Distance bins: d = 0, then [2^k, 2^(k+1)) for k = 0 .. 16 (up to 131,071 tokens).
BINS = 18


class LongContextStatistics(ReducerBase):
    """Running sums of the long-context metrics for an (L, H) grid of heads (a reducer)."""

    def __init__(self, num_layers: int, num_heads: int) -> None:
        self.shape = (num_layers, num_heads)
        self.sums = torch.zeros(len(_ROW_METRICS), num_layers, num_heads, dtype=torch.float64)  # the row metrics
        self.rows = torch.zeros(num_layers, dtype=torch.float64)
        self.histogram = torch.zeros(num_layers, num_heads, BINS, dtype=torch.float64)
        self.longest = 0  # real tokens of the longest text seen
        self._batch: tuple[Tensor, Tensor, Tensor] | None = None  # this batch's sums, on the chunks' device

    @staticmethod
    def summary_needs(batch: Batch) -> frozenset[str]:
        """What this reducer reads of a layer given as row sums: the distance bins."""
        return frozenset({"bins"})

    def begin_batch(self, batch: Batch) -> None:
        self.end_batch()
        super().begin_batch(batch)
        self.longest = max(self.longest, int(batch.host_tokens.valid.sum(-1).max()))  # on the host, once a batch
        batch.memo[native.LONG] = True  # the compiled readers sum this reducer's rows in their pass too
        batch.memo[onepass.ROWS] = True

    def update(self, chunk: AttentionChunk) -> None:
        """A chunk of query rows ``start`` .. ``start + C`` of a self-attention over T tokens, over
        its first K <= T keys (keys K.. get no weight). Summed on the chunk's device, read back
        once the batch ends."""
        assert self.batch is not None, "begin_batch first"
        tokens, layer, start = self.batch.tokens, chunk.layer, chunk.start
        summary = chunk.summary if chunk.weights is None else None  # the layer as the kernels summed it (no map)
        C = chunk.rows if summary is not None else chunk.weights.shape[2]
        dev = chunk.outputs.device if summary is not None else chunk.weights.device
        valid = tokens.valid.to(dev)  # (B, T)
        pos, prefix = tokens.positions  # (B, T) position among real tokens
        rows = valid[:, start:start + C].to(torch.float32)  # (B, C) real query rows
        if self._batch is None:  # row sums (8, L, H), rows (L,), histogram (L, H, BINS), where the chunks are
            L, H = self.shape
            self._batch = (torch.zeros(len(_ROW_METRICS), L, H, dtype=torch.float64, device=dev),
                           torch.zeros(L, dtype=torch.float64, device=dev),
                           torch.zeros(L, H, BINS, dtype=torch.float64, device=dev))
        sums, counted, histogram = self._batch
        counted[layer] += rows.sum()
        if summary is not None:
            s = summary
            values, hist = summary_long_values(s.found, s.query, s.key, tokens, causal=s.causal, scale=s.scale)
            sums[:, layer] += (values * rows[:, None, :, None]).sum(dim=(0, 2)).T  # (8, H)
            histogram[layer] += (hist * rows[:, None, :, None]).sum(dim=(0, 2))  # (H, BINS)
            return
        p = chunk.weights.detach().float()  # (B, H, C, K)
        found = native.compiled_rows(chunk, self.batch)  # the compiled readers' sums over the real rows
        if found is not None:
            sums[:, layer] += found.long.sum(0).T  # (8, H)
            histogram[layer] += found.hist.sum(0)  # (H, BINS)
            return
        values, hist = (_by_prefix_sums if prefix else _by_offsets)(p, valid, pos.to(p.device), start)
        sums[:, layer] += (values * rows[:, None, :, None]).sum(dim=(0, 2)).T  # (8, H)
        histogram[layer] += (hist * rows[:, None, :, None]).sum(dim=(0, 2))  # (H, BINS)

    def end_batch(self) -> None:
        if self._batch is not None:
            sums, counted, histogram = (t.cpu() for t in self._batch)
            self._batch = None
            self.sums += sums
            self.rows += counted
            self.histogram += histogram

    def merge(self, other: LongContextStatistics) -> None:
        self.end_batch()
        other.end_batch()
        self.longest = max(self.longest, other.longest)
        self.sums += other.sums
        self.rows += other.rows
        self.histogram += other.histogram

    def result(self) -> dict[str, Tensor]:
        """Each metric as an (L, H) float64 tensor (NaN where nothing was counted)."""
        self.end_batch()
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
    of the row, read at the few points they need (:func:`prefix_sums_at`)."""
    C, K = p.shape[2:]
    dev = p.device
    i = torch.arange(start, start + C, device=dev)  # (C,) the rows' positions
    # Σ_{|j-i| <= r} p_ij = cs[i + r] - cs[i - r - 1] for every radius at once: r = 0, 2^k - 1 for
    # the bins' edges (k = 1 .. BINS - 1), then the windows 64, 256, 1,024; cs[x] = Σ_{j<=x} p_ij.
    radii = torch.tensor([0] + [2 ** k - 1 for k in range(1, BINS)] + [64, 256, 1024], device=dev)  # (R,)
    R = len(radii)
    # and the first 4 keys' mass beyond 1,024 tokens: keys j <= min(3, i - 1025); the first 4; all
    points = torch.cat([i[:, None] + radii, i[:, None] - radii - 1, (i - 1025).clamp(max=3)[:, None],
                        torch.full((C, 1), 3, device=dev), torch.full((C, 1), K - 1, device=dev)], -1)  # (C, 2R + 3)
    cs = prefix_sums_at(p, points.clamp(0, K - 1)) * (points >= 0)  # (B, H, C, 2R + 3)
    within = cs[..., :R] - cs[..., R:2 * R]  # (B, H, C, R)
    sink_far, first4, total = cs[..., 2 * R], cs[..., 2 * R + 1], cs[..., 2 * R + 2]  # (B, H, C) each
    inside, windows = within[..., :BINS].clone(), within[..., BINS:]  # (B, H, C, BINS), (B, H, C, 3)
    values = torch.stack([p[..., 0], first4, total - windows[..., 1], total - windows[..., 2],
                          windows[..., 0], windows[..., 1], windows[..., 2],
                          total - windows[..., 2] - sink_far], -1)  # (B, H, C, 8)
    # bins: d = 0, then [2^(k-1), 2^k) for k = 1 .. BINS - 1; the mass with d < 2^k is within 2^k - 1
    inside[..., -1] = total  # the last bin takes every farther key too
    hist = torch.cat([inside[..., :1], inside.diff(dim=-1)], -1).clamp_min(0)  # (B, H, C, BINS)
    return values, hist


def summary_long_values(found: RowStatistics, query: Tensor, key: Tensor, tokens, *, causal: bool,
                        scale: float | None = None) -> tuple[Tensor, Tensor]:
    """:func:`_by_prefix_sums` of a whole layer from the row-statistics kernel's sums, no map formed:
    ``found`` of :func:`~multihead.attn.rowstats.attention_with_statistics` over ``query`` (B, H,
    T, D) and ``key`` (B, Hkv, T, D) with ``key_valid=tokens.valid`` and ``bins=BINS``, for
    right-padded texts; the first four keys and each window's exact edge (d = w) are weights at
    those pairs (:func:`~multihead.attn.rowstats.weights_at`). Returns the row metrics (B, H, T, 8)
    and the distance histograms (B, H, T, BINS)."""
    T = found.lse.shape[-1]
    if not tokens.positions[1]:
        raise ValueError("the row-statistics kernel's metrics need right-padded texts (real tokens first)")
    dev = found.lse.device
    valid = tokens.valid.to(dev)
    i = torch.arange(T, device=dev)  # (T,) the rows

    def at(keys: Tensor) -> Tensor:  # (B, H, T) p_i,keys[i]
        return weights_at(query, key, found.lse, i, keys, causal=causal, key_valid=valid, scale=scale)

    first = [at(torch.full_like(i, j)) for j in range(4)]  # (B, H, T) each: p_i0 .. p_i3
    hist = found.bins  # (B, H, T, BINS)
    total = hist.sum(-1)  # (B, H, T)
    within = hist.cumsum(-1)  # [k]: the mass at d <= 2^k - 1 (k >= 1; [0]: d = 0)
    # d <= w for w = 2^k: the bins up to 2^k - 1, and the two keys at d = w exactly
    windows = [within[..., w.bit_length() - 1] + at(i - w) + at(i + w) for w in (64, 256, 1024)]
    sink_far = sum(p * (i - j > 1024) for j, p in enumerate(first))  # keys j < 4 farther than 1,024
    values = torch.stack([first[0], sum(first), total - windows[1], total - windows[2], *windows,
                          total - windows[2] - sink_far], -1)  # (B, H, T, 8)
    return values, hist


#: Keys per block of :func:`prefix_sums_at`.
PREFIX_BLOCK = 16


def prefix_sums_at(p: Tensor, points: Tensor) -> Tensor:
    """``cs[..., x] = Σ_{j<=x} p[..., j]`` of every row of p (B, H, C, K) at its own points
    (C, P), each in 0..K-1: (B, H, C, P).

    Each block of :data:`PREFIX_BLOCK` keys' running sum (one vectorised pass over p, ~1.5x cheaper
    on the CPU than gathering every point's block and summing it: torch.cumsum along a whole row
    runs one key at a time), the running sum of the blocks' totals (K / 16 per row), and one read
    of each point in each.
    """
    B, H, C, K = p.shape
    P, b = points.shape[1], PREFIX_BLOCK
    full = K // b
    within = p[..., :full * b].unflatten(-1, (full, b)).cumsum(-1)  # (B, H, C, K // b, b) running sums per block
    blocks = within[..., -1]  # (B, H, C, K // b) each block's total
    before = torch.cat([blocks.new_zeros(B, H, C, 1), blocks.cumsum(-1)], -1)  # (B, H, C, K // b + 1)
    block = points // b  # (C, P)
    sums = before.gather(-1, block.expand(B, H, C, P))  # the whole blocks before each point's
    in_full = points < full * b  # (C, P): the point is in a whole block (else in the short last one)
    if full:
        sums += within.view(B, H, C, full * b).gather(-1, points.clamp(max=full * b - 1).expand(B, H, C, P)) * in_full
    if K % b:
        tail = p[..., full * b:].cumsum(-1)  # (B, H, C, K % b)
        sums += tail.gather(-1, (points - full * b).clamp(0, K % b - 1).expand(B, H, C, P)) * ~in_full
    return sums


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
