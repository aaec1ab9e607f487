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

import torch
from torch import Tensor

from ...attn.rowstats import RowStatistics, weights_at
from ...hf.route import AttentionChunk
from ...inputs import Batch, TokenInfo
from . import native, onepass
from .base import ReducerBase, shared
from .bootstrap import GROUPS, LEVEL, group_table_bytes, group_zeros, intervals, resampled, used_groups

__all__ = ["METRICS", "HeadStatistics", "RowValues", "kernel_key_sets", "row_values", "summary_row_values"]

METRICS = ("entropy", "entropy_norm", "distance", "self", "previous_token", "next_token", "local", "cls", "sep",
           "punctuation", "max_weight", "kl_uniform", "vertical")
#: the metrics that are means over query rows (``vertical`` is one per sentence: a column's share)
ROW_METRICS = METRICS[:12]


class RowValues:
    """One chunk's row metrics summed per text: ``sums`` and ``counts`` (M, B, H) float64 over the
    chunk's query rows that count for each metric (M = len(names), in :data:`ROW_METRICS` order)."""

    def __init__(self, names: Sequence[str], sums: Tensor, counts: Tensor) -> None:
        self.names, self.sums, self.counts = list(names), sums, counts


def row_values(chunk: AttentionChunk, batch: Batch) -> RowValues:
    """The per-row metric values of a chunk of a self-attention map, summed per text — computed
    once per chunk, whichever reducer asks first (head statistics, typical texts): by the compiled
    readers where they apply (:mod:`.native`: a right-padded float32 map in CPU memory), else
    here (the reference)."""
    return shared(chunk.memo, "head-rows", lambda: _row_values(chunk, batch))


def _row_values(chunk: AttentionChunk, batch: Batch) -> RowValues:
    if chunk.weights is None:  # the layer as the row-statistics kernels summed it (chunk.summary; no map)
        s = chunk.summary
        return summary_row_values(s.found, s.query, s.key, batch.tokens, causal=s.causal, scale=s.scale)
    weights, start, tokens = chunk.weights, chunk.start, batch.tokens
    B, H, C, K = weights.shape
    T = tokens.valid.shape[-1]
    if start < 0 or start + C > T or K > T:
        raise ValueError(f"head statistics need self-attention rows {start}..{start + C} of a (T, T) map "
                         f"with T = {T} tokens; got {C} rows over {K} keys")
    found = native.compiled_rows(chunk, batch)
    if found is not None:
        counts = found.rows.expand(B, H)  # (B, H) real query rows
        where = [found.informative if name in ("entropy_norm", "kl_uniform") else counts for name in ROW_METRICS]
        return RowValues(ROW_METRICS, found.heads.permute(2, 0, 1), torch.stack(where))  # (M, B, H) each
    return eager_row_values(chunk, tokens)


def eager_row_values(chunk: AttentionChunk, tokens: TokenInfo) -> RowValues:
    """:func:`row_values` in PyTorch operations: the reference, and the path on any device."""
    weights, visible, start = chunk.weights, chunk.visible, chunk.start
    B, H, C, K = weights.shape
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
    key_mass = _key_masses(p, tokens, start)  # (B, H, C, 5)
    diag, distance = _offsets(p, pos, prefix, vis, key_mass, start)
    return _summed(entropy, distance, diag, key_mass[..., :3], p.amax(-1), log_n, rows, informative)


def _summed(entropy: Tensor, distance: Tensor, diag: dict[int, Tensor], sets: Tensor, max_weight: Tensor,
            log_n: Tensor, rows: Tensor, informative: Tensor) -> RowValues:
    """The twelve row metrics from each row's sums — entropy, distance, max weight (B, H, C), the
    weights at offsets -2..2 ({k: (B, H, C)}), the masses on the first token, separators and
    punctuation (B, H, C, 3), log n (broadcast) — summed over the rows that count (``rows``;
    ``informative`` for the normalised entropy and the KL divergence)."""
    values = {
        "entropy": (entropy, rows),
        "entropy_norm": (entropy / log_n.clamp_min(1e-12), informative),
        "distance": (distance, rows),
        "self": (diag[0], rows),
        "previous_token": (diag[-1], rows),
        "next_token": (diag[1], rows),
        "local": (sum(diag.values()), rows),
        "cls": (sets[..., 0], rows),
        "sep": (sets[..., 1], rows),
        "punctuation": (sets[..., 2], rows),
        "max_weight": (max_weight, rows),
        "kl_uniform": (log_n - entropy, informative),
    }
    names = list(values)
    stacked = torch.stack([values[n][0] for n in names]).to(torch.float64)  # (M, B, H, C)
    where = torch.stack([values[n][1] for n in names]).to(torch.float64)  # (M, B, H, C)
    return RowValues(names, (stacked * where).sum(3), where.sum(3))  # (M, B, H) each


def kernel_key_sets(tokens: TokenInfo) -> Tensor:
    """The key sets whose mass :func:`summary_row_values` reads, as the row-statistics kernel takes
    them (:func:`multihead.attn.rowstats.attention_with_statistics`): (3, B, T) bool — the first
    real token, separators, punctuation."""
    return torch.stack([tokens.first, tokens.separator, tokens.punctuation])


def summary_row_values(found: RowStatistics, query: Tensor, key: Tensor, tokens: TokenInfo, *, causal: bool,
                       scale: float | None = None) -> RowValues:
    """:func:`row_values` of a whole layer from the row-statistics kernel's sums, no map formed:
    ``found`` of :func:`~multihead.attn.rowstats.attention_with_statistics` over ``query`` (B, H,
    T, D) and ``key`` (B, Hkv, T, D), with ``key_valid=tokens.valid`` and
    ``key_sets=kernel_key_sets(tokens)``, for right-padded texts (real tokens 0..n-1); the weights
    at offsets -2..2 are formed at those pairs alone (:func:`~multihead.attn.rowstats.weights_at`)."""
    B, H, T = found.lse.shape
    dev = found.lse.device
    if not tokens.positions[1]:
        raise ValueError("the row-statistics kernel's metrics need right-padded texts (real tokens first)")
    valid = tokens.valid.to(dev)  # (B, T)
    i = torch.arange(T, device=dev)  # (T,) the rows
    real = valid.sum(-1, keepdim=True)  # (B, 1) each text's real tokens
    n_vis = (torch.minimum(i[None, :] + 1, real) if causal else real.expand(B, T)).float()  # (B, T) keys seen
    rows = valid[:, None, :].expand(B, H, T)  # (B, H, T) rows that count
    informative = rows & (n_vis > 1)[:, None, :]
    log_n = n_vis.clamp_min(1).log()[:, None, :]  # (B, 1, T)
    diag = {k: weights_at(query, key, found.lse, i, i + k, causal=causal, key_valid=valid, scale=scale)
            for k in range(-2, 3)}  # {k: (B, H, T)} p_i,i+k
    return _summed(found.entropy, found.distance, diag, found.key_sets, found.max_weight, log_n, rows, informative)


def _key_masses(p: Tensor, tokens: TokenInfo, start: int) -> Tensor:
    """Every key-set mass of each row in one product: on the first token, separators,
    punctuation, Σ_j p·j and Σ_j p — (B, H, C, 5)."""
    B, H, C, K = p.shape
    dev = p.device
    j_abs = torch.arange(K, device=dev)  # (K,) the keys' positions
    keys = kernel_key_sets(tokens)[:, :, :K].to(dev)  # (3, B, K)
    keys = torch.cat([keys.float(), j_abs.float().expand(1, B, K), keys.new_ones(1, B, K).float()])  # (5, B, K)
    # as (B, H·C, K) x (B, K, 5) with the key sets stored row-major: a real GEMM, ~3x faster on the
    # CPU than broadcasting (B, 1, K, 5) against (B, H, C, K)
    return torch.bmm(p.reshape(B, H * C, K), keys.transpose(0, 1).contiguous().transpose(1, 2)
                     ).view(B, H, C, 5)  # (B, H, C, 5)


def _offsets(p: Tensor, pos: Tensor, prefix: bool, vis: Tensor, key_mass: Tensor, start: int
             ) -> tuple[dict[int, Tensor], Tensor]:
    """Each row's mass at offsets -2..2 ({k: (B, H, C)}) and its mean distance Σ_j p_ij |i - j|
    (B, H, C), positions counted among real tokens."""
    B, H, C, K = p.shape
    dev = p.device
    i_abs = torch.arange(start, start + C, device=dev)  # (C,) the rows' positions
    j_abs = torch.arange(K, device=dev)  # (K,)
    if prefix:  # real tokens are 0..n-1 (right padding): offsets are diagonals
        def band(k: int) -> Tensor:  # p[i, i+k] as (B, H, C), 0 where i+k is outside
            col = i_abs + k
            inside = ((col >= 0) & (col < K)).float()  # (C,)
            picked = p.gather(-1, col.clamp(0, K - 1).view(1, 1, C, 1).expand(B, H, C, 1))[..., 0]
            return picked * inside

        diag = {k: band(k) for k in range(-2, 3)}
        # Σ_j p_ij |i - j| = (i·Σ_j p_ij - Σ_j p_ij·j) + 2·Σ_{j>i} p_ij (j - i): the first part from
        # the key-set product, the second over the keys after the chunk's first row only (none
        # past the diagonal block for a causal chunk).
        ahead = (j_abs[start:][None, :] - i_abs[:, None]).clamp_min(0).float()  # (C, K - start)
        distance = i_abs.float() * key_mass[..., 4] - key_mass[..., 3] + 2 * (p[..., start:] * ahead).sum(-1)
        return diag, distance
    # general valid masks: measure offsets between real tokens
    i = pos[:, None, start:start + C, None].float()  # (B, 1, C, 1)
    j = pos[:, None, None, :K].float()  # (B, 1, 1, K)
    offset = (j - i) * vis  # (B, 1|H, C, K)
    diag = {k: (p * (offset == k)).sum(-1) for k in range(-2, 3)}
    return diag, (p * offset.abs()).sum(-1)


class HeadStatistics(ReducerBase):
    """Running sums of every metric of :data:`METRICS` for an (L, H) grid of heads (a reducer), also
    per group of texts (``group_sums``, ``group_counts``: (G, M, L, H), text i in group i % G) for
    the bootstrap intervals (:meth:`intervals`, :mod:`.bootstrap`)."""

    def __init__(self, num_layers: int, num_heads: int, groups: int = GROUPS) -> None:
        self.shape = (num_layers, num_heads)
        self.sums = torch.zeros(len(METRICS), num_layers, num_heads, dtype=torch.float64)
        self.counts = torch.zeros(len(METRICS), num_layers, num_heads, dtype=torch.float64)
        self.group_sums = group_zeros(groups, len(METRICS), num_layers, num_heads)  # pages at the groups met only
        self.group_counts = group_zeros(groups, len(METRICS), num_layers, num_heads)
        self.sentences = 0
        self.tokens = 0
        self._columns: dict = {}  # a streamed layer's column sums until its last chunk (and the buffer between)
        # the batch's per-text sums and counts (M, B, L, H), on the device of its chunks, until it ends
        self._batch_sums: Tensor | None = None
        self._batch_counts: Tensor | None = None

    @staticmethod
    def planned_bytes(num_layers: int, num_heads: int, groups: int = GROUPS, texts: int | None = None) -> int:
        """Bytes of the running sums (float64): the totals and their bootstrap groups (G, M, L, H) —
        with ``texts``, the memory those hold through a run of that many texts
        (:func:`~.bootstrap.group_table_bytes`: the pages of the groups it writes)."""
        row = len(METRICS) * num_layers * num_heads * 8
        return 2 * (row + group_table_bytes(groups, row, texts))

    @staticmethod
    def summary_needs(batch: Batch) -> frozenset[str]:
        """What this reducer reads of a layer given as row sums (the head metrics' key sets, the
        columns for vertical concentration): see ``pipelines.common.summary_request``."""
        return frozenset({"key_sets", "columns"})

    def begin_batch(self, batch: Batch) -> None:
        """Count a batch's sentences and real tokens (once per batch, not per layer, on the host)."""
        self.end_batch()
        super().begin_batch(batch)
        valid = batch.host_tokens.valid
        self.sentences += int(valid.shape[0])
        self.tokens += int(valid.sum())
        batch.memo[native.COLUMNS] = True  # the compiled readers sum the columns (vertical) in their pass too
        batch.memo[onepass.ROWS] = True  # it reads the compiled row sums

    def update(self, chunk: AttentionChunk) -> None:
        """Add one chunk of one layer's attention for the batch: query rows ``chunk.start`` ..
        ``chunk.stop`` of a self-attention over T tokens, over its first K <= T keys. Summed where
        the chunk is (per text, (M, B, L, H)), read back once the batch ends: nothing waits for a
        device per chunk."""
        assert self.batch is not None, "begin_batch first"
        tokens = self.batch.tokens
        found = row_values(chunk, self.batch)
        if self._batch_sums is None:
            B, L, H = found.sums.shape[1], *self.shape
            self._batch_sums = found.sums.new_zeros(len(METRICS), B, L, H)  # float64, on the chunk's device
            self._batch_counts = torch.zeros_like(self._batch_sums)
        index = [METRICS.index(n) for n in found.names]
        self._batch_sums[index, :, chunk.layer] += found.sums  # (M, B, H)
        self._batch_counts[index, :, chunk.layer] += found.counts
        self._vertical(chunk, tokens)

    def end_batch(self) -> None:
        """Fold the batch's per-text sums into the totals and their bootstrap groups (one read back)."""
        if self._batch_sums is None:
            return
        sums, counts = self._batch_sums.cpu(), self._batch_counts.cpu()  # (M, B, L, H)
        self._batch_sums = self._batch_counts = None
        self._columns.clear()
        self.sums += sums.sum(1)
        self.counts += counts.sum(1)
        groups = torch.tensor(self.batch.texts, dtype=torch.long) % self.group_sums.shape[0]  # (B,)
        self.group_sums.index_add_(0, groups, sums.transpose(0, 1))  # (B, M, L, H) into (G, M, L, H)
        self.group_counts.index_add_(0, groups, counts.transpose(0, 1))

    def _vertical(self, chunk: AttentionChunk, tokens: TokenInfo) -> None:
        """Vertical concentration, per sentence: the column that receives most of its attention,
        summed over the layer's chunks and taken once its last rows are in."""
        if chunk.weights is None:  # the whole layer's columns, summed over its real rows by the kernel
            self._vertical_of(chunk.summary.columns.double(), chunk.layer, tokens.valid.to(chunk.outputs.device))
            return
        p, start, layer = chunk.weights.detach().float(), chunk.start, chunk.layer
        B, H, C, K = p.shape
        T = tokens.valid.shape[-1]
        dev = p.device
        valid = tokens.valid.to(dev)
        if start == 0:  # one buffer a batch, zeroed per layer: no block per layer between the chunks' buffers
            column = self._columns.pop("buffer", None)
            if column is None or column.shape != (B, H, T) or column.device != dev:
                column = torch.zeros(B, H, T, dtype=torch.float64, device=dev)
            else:
                column.zero_()
        else:
            column = self._columns.pop(layer)
        compiled = native.compiled_rows(chunk, self.batch)
        summed = None if compiled is None else compiled.columns  # summed in the compiled pass (asked at begin_batch)
        if summed is not None:
            column[..., :K] += summed  # (B, H, K)
        else:
            real = bool(self.batch.host_tokens.valid[:, start:start + C].all())  # asked of the host, not the device
            counted = p if real else p * valid[:, None, start:start + C, None]  # (B, H, C, K)
            column[..., :K] += counted.sum(2)  # (B, H, K)
        if start + C < T:
            self._columns[layer] = column
            return
        self._columns["buffer"] = column
        self._vertical_of(column, layer, valid)

    def _vertical_of(self, column: Tensor, layer: int, valid: Tensor) -> None:
        """A layer's vertical concentration from its columns' sums over the real rows (B, H, T)."""
        q_count = valid.sum(-1).to(torch.float64)  # (B,)
        vertical = (column / q_count.clamp_min(1)[:, None, None]).amax(-1)  # (B, H)
        m = METRICS.index("vertical")
        self._batch_sums[m, :, layer] += vertical * q_count[:, None]  # (B, H)
        self._batch_counts[m, :, layer] += q_count[:, None]

    def merge(self, other: HeadStatistics) -> None:
        """Add another accumulator's sums (e.g. from another process's shard)."""
        if other.shape != self.shape:
            raise ValueError(f"cannot merge statistics of shapes {other.shape} and {self.shape}")
        self.end_batch()
        other.end_batch()
        self.sums += other.sums
        self.counts += other.counts
        self.group_sums += other.group_sums
        self.group_counts += other.group_counts
        self.sentences += other.sentences
        self.tokens += other.tokens

    def result(self) -> dict[str, Tensor]:
        """Each metric as an (L, H) float64 tensor (NaN where nothing was counted)."""
        self.end_batch()
        out = self.sums / self.counts.where(self.counts > 0, torch.full_like(self.counts, math.nan))
        return {name: out[k] for k, name in enumerate(METRICS)}

    def intervals(self, *, level: float = LEVEL) -> dict[str, tuple[Tensor, Tensor]]:
        """Each metric's bootstrap interval over texts at ``level``: {name: ((L, H) low, (L, H) high)}."""
        self.end_batch()
        low, high = intervals(self.group_sums, self.group_counts, level=level)  # (M, L, H) each
        return {name: (low[k], high[k]) for k, name in enumerate(METRICS)}

    def resampled(self, weights: Tensor) -> dict[str, Tensor]:
        """Each metric on resampled corpora: ``weights`` (R, G') over the used groups
        (:func:`~.bootstrap.used_groups`) -> {name: (R, L, H)}."""
        self.end_batch()
        used = used_groups(self.group_counts)
        values = resampled(self.group_sums[used], self.group_counts[used], weights)  # (R, M, L, H)
        return {name: values[:, k] for k, name in enumerate(METRICS)}
