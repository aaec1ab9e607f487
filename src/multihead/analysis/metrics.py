"""Per-head attention statistics over a corpus, accumulated batch by batch and layer by layer.

Every metric is a token-weighted mean over the real (non-padding) query tokens of the corpus:
each query row ``p_i = weights[b, h, i, :]`` contributes once. ``n_i`` is the number of keys
query ``i`` may see (all real tokens for an encoder; those up to ``i`` for a decoder).

| key | definition for one query row |
|---|---|
| ``entropy`` | ``-Σ_j p_ij log p_ij`` (nats) |
| ``entropy_norm`` | ``entropy / log n_i`` (rows with n_i > 1 only): 1 is uniform |
| ``kl_uniform`` | ``log n_i - entropy``: KL divergence from the uniform distribution |
| ``distance`` | ``Σ_j p_ij |i - j|`` |
| ``self`` | ``p_ii`` |
| ``previous_token`` / ``next_token`` | ``p_i,i-1`` / ``p_i,i+1`` |
| ``local`` | ``Σ_{|i-j| ≤ 2} p_ij`` |
| ``cls`` | mass on the first real token ([CLS] / BOS) |
| ``sep`` | mass on separator / end-of-sequence tokens ([SEP], EOS) |
| ``punctuation`` | mass on tokens made only of punctuation |
| ``max_weight`` | ``max_j p_ij`` (confidence) |
| ``vertical`` | per sentence: ``max_j Σ_i p_ij / #queries``, the largest share of all its queries' |
|  | attention that one key column receives; weighted by the sentence's real tokens |

Padding never counts: padded query rows are skipped, padded keys get no weight (they are
masked), and positions are measured between real tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from .typical import TypicalTexts

__all__ = ["METRICS", "HeadStatistics", "TokenInfo", "real_positions"]

METRICS = ("entropy", "entropy_norm", "distance", "self", "previous_token", "next_token", "local", "cls", "sep",
           "punctuation", "max_weight", "kl_uniform", "vertical")


@dataclass
class TokenInfo:
    """What the metrics need to know about a padded batch of tokens, all (B, T) bool."""

    valid: Tensor  # a real token (not padding)
    first: Tensor  # the first real token of its sequence ([CLS] / BOS position)
    separator: Tensor  # [SEP] / EOS
    punctuation: Tensor
    ids: Tensor | None = None  # (B, T) the token ids, for the texts' own induction pattern (typical texts)

    @cached_property
    def positions(self) -> tuple[Tensor, bool]:
        """:func:`real_positions` of :attr:`valid`, computed once per batch (a streamed capture
        reads it for every chunk of every layer)."""
        return real_positions(self.valid)


def real_positions(valid: Tensor) -> tuple[Tensor, bool]:
    """Each token's index among the real tokens of its row, (B, T), and whether the real tokens
    are the first ones of every row (right padding or none), so offsets are plain diagonals."""
    pos = valid.long().cumsum(-1) - 1  # (B, T)
    T = valid.shape[-1]
    prefix = bool((pos[valid] == torch.arange(T, device=valid.device).expand_as(pos)[valid]).all())
    return pos, prefix


class HeadStatistics:
    """Running sums of every metric for an (L, H) grid of heads."""

    def __init__(self, num_layers: int, num_heads: int) -> None:
        self.shape = (num_layers, num_heads)
        self.sums = torch.zeros(len(METRICS), num_layers, num_heads, dtype=torch.float64)
        self.counts = torch.zeros(len(METRICS), num_layers, num_heads, dtype=torch.float64)
        self.sentences = 0
        self.tokens = 0
        self._columns: dict[int, Tensor] = {}  # a streamed layer's column sums until its last chunk
        #: where each text's own means go (multihead.analysis.typical), when set
        self.typical: TypicalTexts | None = None
        self._ids: list[int] | None = None
        self._per_text: dict[int, tuple[Tensor, Tensor]] = {}  # a streamed layer's per-text sums
        # the batch's repeated-token targets per chunk (start, C, K): the same for every layer
        self._repeats: dict[tuple[int, int, int], tuple[Tensor, Tensor]] = {}

    def add_batch(self, tokens: TokenInfo, ids: Sequence[int] | None = None) -> None:
        """Count a batch's sentences and real tokens (once per batch, not per layer); ``ids``: the
        texts' indices in the corpus (for :attr:`typical`)."""
        self.sentences += int(tokens.valid.shape[0])
        self.tokens += int(tokens.valid.sum())
        self._ids = None if ids is None else list(ids)
        self._repeats = {}

    def update(self, layer: int, weights: Tensor, visible: Tensor, tokens: TokenInfo, start: int = 0) -> None:
        """Add one layer's attention for a batch: weights (B, H, C, K) — query rows ``start`` to
        ``start + C`` of a self-attention over T tokens (all of them, or one chunk of a streamed
        capture: chunks of a layer come in order), over the first K <= T keys (keys K.. get no
        weight) — and visible (B|1, 1|H, C, K) bool, which of those keys each query may see."""
        B, H, C, K = weights.shape
        T = tokens.valid.shape[-1]
        if start < 0 or start + C > T or K > T:
            raise ValueError(f"head statistics need self-attention rows {start}..{start + C} of a (T, T) map "
                             f"with T = {T} tokens; got {C} rows over {K} keys")
        dev = weights.device
        # Per-row values in float32 (one pass each over the maps), sums over rows in float64.
        p = weights.detach().float()  # (B, H, C, K)
        valid = tokens.valid.to(dev)  # (B, T)
        q_valid = valid[:, start:start + C]  # (B, C)
        vis = visible.to(dev) & valid[:, None, None, :K]  # (B, 1|H, C, K)
        n_vis = vis.sum(-1).expand(B, H, C).float()  # (B, H, C)
        rows = q_valid[:, None, :].expand(B, H, C)  # (B, H, C) rows that count

        pos, prefix = tokens.positions
        pos = pos.to(dev)
        # -Σ p ln p, with 0·ln 0 = 0: p is raised to the smallest normal float before the log, a
        # finite number that 0 multiplies away (the CPU's log of 0 or of a subnormal takes a slow
        # path: a causal or padded map's zeros made the log pass ~4x slower; torch.special.entr
        # is ~2x slower than this on maps without zeros)
        logp = p.clamp_min(torch.finfo(p.dtype).tiny).log_()  # (B, H, C, K)
        entropy = -logp.mul_(p).sum(-1)  # (B, H, C)
        del logp
        log_n = n_vis.clamp_min(1).log()
        informative = rows & (n_vis > 1)
        i_abs = torch.arange(start, start + C, device=dev)  # (C,) the rows' positions
        j_abs = torch.arange(K, device=dev)  # (K,) the keys' positions
        # One product gives every key-set mass: first, separators, punctuation, Σ_j p·j and Σ_j p.
        keys = torch.stack([tokens.first[:, :K], tokens.separator[:, :K], tokens.punctuation[:, :K]]).to(dev)
        keys = torch.cat([keys.float(), j_abs.float().expand(1, B, K), keys.new_ones(1, B, K).float()])  # (5, B, K)
        # as (B, H·C, K) x (B, K, 5) with the key sets stored row-major: a real GEMM, ~3x faster on the
        # CPU than broadcasting (B, 1, K, 5) against (B, H, C, K)
        key_mass = torch.bmm(p.reshape(B, H * C, K), keys.transpose(0, 1).contiguous().transpose(1, 2)
                             ).view(B, H, C, 5)  # (B, H, C, 5)
        if prefix:  # real tokens are 0..n-1 (right padding): offsets are diagonals
            def band(k: int) -> Tensor:  # p[i, i+k] as (B, H, C), 0 where i+k is outside
                col = i_abs + k
                inside = ((col >= 0) & (col < K)).float()  # (C,)
                picked = p.gather(-1, col.clamp(0, K - 1).view(1, 1, C, 1).expand(B, H, C, 1))[..., 0]
                return picked * inside

            diag = {k: band(k) for k in range(-2, 3)}
            # Σ_j p_ij |i - j| = (i·Σ_j p_ij - Σ_j p_ij·j) + 2·Σ_{j>i} p_ij (j - i): the first part from
            # the product above, the second over the keys after the chunk's first row only (none
            # past the diagonal block for a causal chunk).
            ahead = (j_abs[start:][None, :] - i_abs[:, None]).clamp_min(0).float()  # (C, K - start)
            distance = i_abs.float() * key_mass[..., 4] - key_mass[..., 3] + 2 * (p[..., start:] * ahead).sum(-1)
        else:  # general valid masks: measure offsets between real tokens
            i = pos[:, None, start:start + C, None].float()  # (B, 1, C, 1)
            j = pos[:, None, None, :K].float()  # (B, 1, 1, K)
            offset = (j - i) * vis  # (B, 1|H, C, K)
            diag = {k: (p * (offset == k)).sum(-1) for k in range(-2, 3)}
            distance = (p * offset.abs()).sum(-1)
        values = {
            "entropy": (entropy, rows),
            "entropy_norm": (entropy / log_n.clamp_min(1e-12), informative),
            "kl_uniform": (log_n - entropy, informative),
            "distance": (distance, rows),
            "self": (diag[0], rows),
            "previous_token": (diag[-1], rows),
            "next_token": (diag[1], rows),
            "local": (sum(diag.values()), rows),
            "cls": (key_mass[..., 0], rows),
            "sep": (key_mass[..., 1], rows),
            "punctuation": (key_mass[..., 2], rows),
            "max_weight": (p.amax(-1), rows),
        }
        names = list(values)
        stacked = torch.stack([values[n][0] for n in names]).to(torch.float64)  # (M, B, H, C)
        where = torch.stack([values[n][1] for n in names]).to(torch.float64)  # (M, B, H, C)
        index = [METRICS.index(n) for n in names]
        per_text, per_count = (stacked * where).sum(3), where.sum(3)  # (M, B, H)
        self.sums[index, layer] += per_text.sum(1).cpu()
        self.counts[index, layer] += per_count.sum(1).cpu()
        if self.typical is not None and self._ids is not None:
            if tokens.ids is not None:  # and, per text only, its own induction pattern
                found = self._repeats.get((start, C, K))
                if found is None:
                    found = self._repeats[(start, C, K)] = _repeat_targets(tokens.ids.to(dev), q_valid, valid, start, K)
                copy_sum, copy_rows = _repeats_followed(p, *found)  # (B, H)
                names = [*names, "repeat_successor"]
                per_text = torch.cat([per_text, copy_sum[None].to(torch.float64)])
                per_count = torch.cat([per_count, copy_rows[None].to(torch.float64)])
            if start > 0:  # the layer's earlier chunks
                before = self._per_text.pop(layer)
                per_text, per_count = per_text + before[0], per_count + before[1]
            if start + C < T:
                self._per_text[layer] = (per_text, per_count)
            else:
                means = per_text / per_count.where(per_count > 0, torch.nan)  # (M, B, H)
                self.typical.add_metrics(layer, {n: means[k] for k, n in enumerate(names)}, valid.sum(-1).cpu(),
                                         self._ids)
        # vertical concentration, per sentence: the column that receives most of its attention,
        # summed over the layer's chunks and taken once its last rows are in
        column = torch.zeros(B, H, T, dtype=torch.float64, device=dev) if start == 0 else self._columns.pop(layer)
        counted = p if bool(q_valid.all()) else p * q_valid[:, None, :, None]  # (B, H, C, K)
        column[..., :K] += counted.sum(2)  # (B, H, K)
        if start + C < T:
            self._columns[layer] = column
            return
        q_count = valid.sum(-1).to(torch.float64)  # (B,)
        vertical = (column / q_count.clamp_min(1)[:, None, None]).amax(-1)  # (B, H)
        m = METRICS.index("vertical")
        self.sums[m, layer] += (vertical * q_count[:, None]).sum(0).cpu()
        self.counts[m, layer] += q_count.sum().cpu()

    def merge(self, other: HeadStatistics) -> None:
        """Add another accumulator's sums (e.g. from another process's shard)."""
        if other.shape != self.shape:
            raise ValueError(f"cannot merge statistics of shapes {other.shape} and {self.shape}")
        self.sums += other.sums
        self.counts += other.counts
        self.sentences += other.sentences
        self.tokens += other.tokens

    def means(self) -> dict[str, Tensor]:
        """Each metric as an (L, H) float64 tensor (NaN where nothing was counted)."""
        out = self.sums / self.counts.where(self.counts > 0, torch.full_like(self.counts, math.nan))
        return {name: out[k] for k, name in enumerate(METRICS)}


def _repeat_targets(ids: Tensor, q_valid: Tensor, valid: Tensor, start: int, K: int) -> tuple[Tensor, Tensor]:
    """Where a text's own induction pattern points, for query rows ``start``.. (``q_valid`` (B, C))
    over its first K keys: ``target`` (N, 3), the (example, row, key) triples where key j follows
    an earlier occurrence (at j - 1 < i) of row i's token, for real rows only; and ``counted``
    (B, C), the real rows that have one. ids, valid (B, T).

    The triples, not a (B, C, K) mask: a row's token recurs a few times, not K, so reading p at
    them costs far less than a pass over the map."""
    B, C = q_valid.shape
    rows = ids[:, start:start + C]  # (B, C)
    i = torch.arange(start, start + C, device=ids.device)[:, None]  # (C, 1)
    j = torch.arange(K, device=ids.device)[None, :]  # (1, K): key j follows token j - 1
    before = torch.cat([ids.new_full((B, 1), -1), ids[:, :K - 1]], 1)  # (B, K) the token before each key
    real_before = torch.cat([valid.new_zeros(B, 1), valid[:, :K - 1]], 1) & valid[:, :K]  # (B, K)
    target = (rows[:, :, None] == before[:, None, :]) & real_before[:, None, :] & (j <= i)  # (B, C, K)
    target &= q_valid[:, :, None]
    return target.nonzero(), target.any(-1)


def _repeats_followed(p: Tensor, target: Tensor, counted: Tensor) -> tuple[Tensor, Tensor]:
    """A text's own induction pattern in p (B, H, C, K): for each row that repeats an earlier token
    (``counted`` (B, C)), its mass on the tokens right after those occurrences (``target``
    (N, 3) triples, :func:`_repeat_targets`). Returns the summed mass over such rows, (B, H), and
    how many rows there are, (B, H)."""
    B, H = p.shape[:2]
    b, c, k = target.unbind(1)  # (N,) each
    picked = p[b, :, c, k]  # (N, H)
    mass = p.new_zeros(B, H).index_add_(0, b, picked)  # (B, H)
    return mass, counted.sum(-1)[:, None].expand(B, H)
