"""Key plans: which keys each chunk of queries needs, read from a mask's :class:`~.masks.Cover`.

* band (sliding window, causal window, packed segments): a contiguous key range per query
  chunk — time and memory O(n·w);
* global tokens (Longformer): their key columns are added to every chunk, and their query
  rows get chunks of their own over all keys;
* block layouts (BigBird random blocks, arbitrary layouts): the key blocks any query block of
  the chunk may see, gathered.

The kernel (:mod:`.chunked`) evaluates the exact mask inside each chunk, so a plan only has to
include every key that may be needed, never exclude one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..masks import INF, Cover
from .chunked import Chunk

__all__ = ["PlanSummary", "keys_per_query", "plan_chunks", "plan_cost"]

#: Largest (B, H, c, W) float32 score block a chunk may hold (per temporary).
CHUNK_BYTES = 64 * 2**20


@dataclass(frozen=True)
class PlanSummary:
    """What a plan costs: chunks, mean keys per query row, largest chunk's score elements."""

    chunks: int
    mean_keys: float
    max_block: int
    kind: str  # "local" (contiguous ranges) or "sparse" (gathered key blocks)


def keys_per_query(cover: Cover, T: int, S: int) -> float:
    """Mean number of keys per query row the cover includes (cheap, from structure only)."""
    band = 0.0
    if cover.has_band:
        band = min(S, (S if cover.left == INF else cover.left) + (S if cover.right == INF else cover.right) + 1)
    cols = len(cover.global_cols)
    blocks = 0.0
    for bs, layout in cover.layouts:
        blocks += float(layout.float().sum(1).mean()) * bs if layout.numel() else 0.0
    rows = len(cover.global_rows) * S / max(T, 1)
    return min(float(S), band + cols + blocks) + rows


def plan_chunks(cover: Cover, T: int, S: int, *, B: int = 1, H: int = 1, chunk_size: int | None = None,
                fused: bool = False) -> list[Chunk]:
    """Chunks covering every query row once, with the keys the cover allows for them.

    ``fused``: for a forward pass through the fused kernel, whose chunks cost little Python, so
    a band's chunks are half as tall (less of the band's corners computed in vain).
    """
    off = S - T
    c = chunk_size or _chunk_size(cover, T, S, B, H, fused)
    global_rows = sorted(r for r in cover.global_rows if 0 <= r < T)
    global_row_set = set(global_rows)
    cols = torch.tensor(sorted(x for x in cover.global_cols if 0 <= x < S), dtype=torch.long)
    chunks: list[Chunk] = []
    for q0 in range(0, T, c):
        q1 = min(T, q0 + c)
        lo, hi = _band_range(cover, q0, q1, off, S)
        parts = [cols] if cols.numel() else []
        for bs, layout in cover.layouts:
            key_blocks = layout[q0 // bs:(q1 - 1) // bs + 1].any(0).nonzero().flatten()
            keys = (key_blocks[:, None] * bs + torch.arange(bs)[None, :]).flatten()
            parts.append(keys[keys < S])
        extra = None
        if parts:
            extra = torch.unique(torch.cat(parts))
            extra = extra[(extra < lo) | (extra >= hi)]
            extra = extra if extra.numel() else None
        rows: slice | torch.Tensor = slice(q0, q1)
        inside = [r for r in range(q0, q1) if r in global_row_set] if global_row_set else []
        if inside:
            keep = [r for r in range(q0, q1) if r not in global_row_set]
            if not keep:
                continue
            rows = torch.tensor(keep, dtype=torch.long)
        chunks.append(Chunk(rows, lo, hi, extra))
    # Global query rows see every key: chunks of their own over the full key range.
    per = max(1, CHUNK_BYTES // max(1, B * H * S * 4))
    for start in range(0, len(global_rows), per):
        chunks.append(Chunk(torch.tensor(global_rows[start:start + per], dtype=torch.long), 0, S, None))
    return chunks


def plan_cost(cover: Cover, T: int, S: int, *, B: int = 1, H: int = 1) -> PlanSummary:
    """What :func:`plan_chunks` would cost, from the cover alone (no plan is built)."""
    c = _chunk_size(cover, T, S, B, H)
    width = keys_per_query(cover, T, S)
    rows = len([r for r in cover.global_rows if 0 <= r < T])
    per = max(1, CHUNK_BYTES // max(1, B * H * S * 4))
    max_block = B * H * min(c, T) * int(min(S, width + c))
    if rows:
        max_block = max(max_block, B * H * min(per, rows) * S)
    chunks = -(-T // max(c, 1)) + -(-rows // per)
    return PlanSummary(chunks, width, max_block, "sparse" if cover.layouts else "local")


def _band_range(cover: Cover, q0: int, q1: int, off: int, S: int) -> tuple[int, int]:
    if not cover.has_band:
        return 0, 0
    lo = 0 if cover.left == INF else max(0, q0 + off - int(cover.left))
    hi = S if cover.right == INF else min(S, q1 - 1 + off + int(cover.right) + 1)
    return (lo, hi) if hi > lo else (0, 0)


def _chunk_size(cover: Cover, T: int, S: int, B: int, H: int, fused: bool = False) -> int:
    if cover.layouts:
        bs = min(bs for bs, _ in cover.layouts)
        c = bs * max(1, math.ceil(64 / bs))  # whole query blocks, at least 64 rows
    elif cover.has_band and cover.left < INF and cover.right < INF:
        # Larger chunks waste (c + w) / w of the scores on the band's corners; smaller ones pay
        # Python overhead per chunk. A quarter of the band width, 32..256 rows, balances both; an
        # eighth for the fused forward (±256: 58 % of the mm peak at 64 rows, 54 % at 128, while
        # the recomputing backward is ~15 % slower at 64).
        c = int(min(256, max(32, (cover.left + cover.right) // (8 if fused else 4))))
    else:
        c = 256
    width = keys_per_query(cover, T, S) + c
    fit = max(1, int(CHUNK_BYTES // max(1.0, B * H * width * 4)))
    return max(1, min(c, fit, T))
