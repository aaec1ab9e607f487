"""What a page shows of a few texts, kept in the same pass as every other statistic.

:class:`TextViews` is a reducer that keeps, for a few chosen texts of the corpus, their attention
as the views draw it (:class:`TextView`):

* a text of at most :data:`LONG_TEXT` tokens: its whole maps (L, H, T, T) — the head view's lines,
  the matrix, rollout and flow read them;
* a longer one (a document of thousands of tokens cannot be kept as L·H·T² weights: SmolLM2 at
  4,096 tokens is 18 GB): **block-pooled maps** — the T x T map cut into blocks of ``block`` x
  ``block`` tokens (``block`` chosen from T so the pooled map has at most :data:`POOLED_CELLS`
  cells a side); per block the *mass* (the mean over its query rows of the weight they put on its
  keys) and the *max* (the largest single weight in it) — and **the k largest weights of every
  row** (k from T, :func:`top_k_for`), from which a view draws any region at full resolution.

Both come from the chunks the pass streams anyway: a document's page needs no second pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...hf.route import AttentionChunk
from ...inputs import Batch, readable_tokens
from ..rollout import attention_flow, attention_rollout
from . import native, onepass
from .base import ReducerBase

__all__ = ["EVIDENCE_TOP_K", "FLOW_BUDGET", "HEAD_VIEW_TOKENS", "LONG_TEXT", "POOLED_CELLS", "ROLLOUT_TOKENS",
           "HeadMaps", "HeadView", "Pooled", "TextView", "TextViews", "WholeMaps", "key_blocks", "pooled_maps",
           "stored_bytes", "top_k_for", "top_weights"]

#: Above this many tokens a text is kept pooled (the head view's lines and the plain matrix stop
#: being readable long before).
LONG_TEXT = 512
#: The pooled maps have at most this many blocks a side.
POOLED_CELLS = 128
#: Weights kept per row of the maps of the inputs that define labels (a probe's pattern is a peak or
#: two per row; the page's views of the probes' inputs).
EVIDENCE_TOP_K = 8
#: Bytes of stored top-k entries (3 bytes each: a uint16 key, a uint8 weight; 5 past 65,536 tokens) a page may hold
#: for one text before compression; k is the largest that fits, between 1 and 16 (SmolLM2 at 4,096 tokens: 6,
#: a page of ~18 MB; at 8,192: 3; MiniLM at 512: 16). Where even one weight a row of every head
#: passes it (an 8B model's 1,024 heads at 32k tokens: 100 MB), the page stores the rows of the
#: heads that fit (:func:`~multihead.render.page.stored_heads`).
TOP_K_BYTES = 20 << 20


def top_k_for(num_heads_total: int, tokens: int) -> int:
    """How many weights per row a page of ``num_heads_total`` heads over ``tokens`` tokens stores."""
    return max(1, min(16, TOP_K_BYTES // max(1, num_heads_total * tokens * stored_bytes(tokens))))


def stored_bytes(tokens: int) -> int:
    """Bytes a page stores per kept weight of a text of ``tokens`` tokens: a uint8 weight and its
    key, uint16 — or uint32 past 65,536 tokens, where uint16 would wrap."""
    return 3 if tokens <= 1 << 16 else 5


@dataclass
class Pooled:
    """A long text's attention, pooled (see the module): ``index`` (L, H, T, k) int32 and
    ``values`` (L, H, T, k) uint8 (weight · 255) — each row's k largest weights; ``mass`` and
    ``largest`` (L, H, cells, cells) float32 over blocks of ``block`` tokens."""

    block: int
    cells: int
    k: int
    index: Tensor
    values: Tensor
    mass: Tensor
    largest: Tensor


#: Rollout is kept for texts up to this many tokens (L·T² values each).
ROLLOUT_TOKENS = 64
#: Attention flow (after the last layer) is solved for a text when L·T⁴ stays within this: the cost
#: of its T² maximum flows on a graph of L·T² edges (about 3 s at the budget on one core).
FLOW_BUDGET = 2_000_000


@dataclass
class TextView:
    """One text as the page's views draw it: its tokens as people read them and either its whole
    maps ``maps`` (L, H, T, T) or its :class:`Pooled` attention. Its rollout and flow
    (:meth:`rollout_and_flow`) are solved the first time a view asks."""

    text: str
    tokens: list[str]
    maps: Tensor | None = None
    pooled: Pooled | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    _flows: tuple | None = field(default=None, repr=False, compare=False)

    def rollout_and_flow(self) -> tuple[Tensor | None, Tensor | None]:
        """Rollout at every layer (L, T, T) for texts of at most :data:`ROLLOUT_TOKENS`, and flow
        after the last layer (T, T) while L·T⁴ stays within :data:`FLOW_BUDGET`
        (:mod:`multihead.analysis.rollout`); None where the text is too long for them."""
        if self._flows is None:
            rollout = flow = None
            if self.maps is not None and self.maps.shape[-1] <= ROLLOUT_TOKENS:
                L, T = self.maps.shape[0], self.maps.shape[-1]
                rollout = attention_rollout(self.maps)
                if L * T ** 4 <= FLOW_BUDGET:
                    flow = attention_flow(self.maps, layers=[L - 1])[L - 1]
            self._flows = (rollout, flow)
        return self._flows


def pooled_maps(weights: Tensor, start: int, block: int, cells: int) -> tuple[Tensor, Tensor, Tensor]:
    """One chunk's contribution to the pooled maps.

    weights (H, c, K): query rows ``start`` .. ``start + c`` over keys 0..K-1. Returns, over
    (row block, key block) cells (H, cells, cells): the weight summed over each cell, the largest
    weight in it, and how many query rows each row block received from this chunk (cells,).
    """
    sums, maxima = key_blocks(weights, block)  # (H, c, nb) each
    return _by_row_block(sums, maxima, start, block, cells)


def key_blocks(weights: Tensor, block: int) -> tuple[Tensor, Tensor]:
    """Each row's weight summed, and its largest weight, over blocks of ``block`` keys (the last
    block may be shorter): (H, c, ceil(K / block)) each, in float32. Read from the map as it is
    (no padded copy); the maxima by ``max_pool1d`` (~2x faster on the CPU than ``amax`` over a
    short last axis)."""
    maxima = F.max_pool1d(weights, block, ceil_mode=True).float()  # (H, c, ceil(K / block))
    return _block_sums(weights, block), maxima


def _block_sums(weights: Tensor, block: int) -> Tensor:
    """Each row's weight summed over blocks of ``block`` keys (the last may be shorter), in float32:
    (H, c, ceil(K / block))."""
    K = weights.shape[-1]
    full = K // block
    whole = weights[..., :full * block].unflatten(-1, (full, block))  # (H, c, full, block) a view
    sums = whole.sum(-1, dtype=torch.float32)  # (H, c, full)
    if K % block:  # the short last block
        sums = torch.cat([sums, weights[..., full * block:].sum(-1, keepdim=True, dtype=torch.float32)], -1)
    return sums


def _by_row_block(sums: Tensor, maxima: Tensor, start: int, block: int, cells: int) -> tuple[Tensor, Tensor, Tensor]:
    """Rows' key-block sums and maxima (H, c, nb) gathered into their row blocks (see :func:`pooled_maps`)."""
    H, c, nb = sums.shape
    dev = sums.device
    row_block = torch.arange(start, start + c, device=dev) // block  # (c,)
    total = torch.zeros(H, cells, cells, device=dev)
    total[..., :nb].index_add_(1, row_block, sums)
    largest = torch.zeros(H, cells, cells, device=dev)
    largest[..., :nb].scatter_reduce_(1, row_block.view(1, c, 1).expand(H, c, nb), maxima, reduce="amax")
    return total, largest, _rows_per_block(start, c, block, cells, dev)


def _rows_per_block(start: int, c: int, block: int, cells: int, device: torch.device) -> Tensor:
    """How many of the query rows ``start .. start + c`` fall in each block of ``block`` rows (cells,)."""
    row_block = torch.arange(start, start + c, device=device) // block  # (c,)
    return torch.zeros(cells, device=device).index_add_(0, row_block, torch.ones(c, device=device))


#: Keys per block from which a pooled text's top-k candidates are read (see :func:`_fine_block`).
FINE_BLOCK = 16


def _fine_block(block: int) -> int:
    """The largest divisor of ``block`` within :data:`FINE_BLOCK` (at least half of it; else
    ``block``): a row's top-k is read from k such blocks (8k tokens: k·16 keys instead of k·64),
    and the pooled blocks are whole numbers of them."""
    for fine in range(min(block, FINE_BLOCK), FINE_BLOCK // 2 - 1, -1):
        if block % fine == 0:
            return fine
    return block


def _coarser(sums: Tensor, maxima: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """Key-block sums and maxima (H, c, n) over blocks m times wider: (H, c, ceil(n / m)) each."""
    if m == 1:
        return sums, maxima
    return _block_sums(sums, m), F.max_pool1d(maxima, m, ceil_mode=True)


def top_weights(weights: Tensor, k: int, maxima: Tensor | None = None, block: int = 0) -> tuple[Tensor, Tensor]:
    """Each row's k largest weights and their keys, as ``weights.topk(k, -1)`` (H, c, K) -> (H, c, k)
    each — from the row's key blocks whose largest weight is among its k largest blocks' (``maxima``
    (H, c, nb) over blocks of ``block`` keys, :func:`key_blocks`): the k-th largest weight is at least
    the k-th largest block maximum, so every one of the k largest lies in such a block. Reads k·block
    keys per row instead of K (equal weights may be taken from other keys)."""
    H, c, K = weights.shape
    if maxima is None or maxima.shape[-1] <= k:
        return weights.topk(k, dim=-1)
    blocks = maxima.topk(k, dim=-1).indices  # (H, c, k)
    offsets = torch.arange(block, device=weights.device)
    keys = (blocks[..., None] * block + offsets).view(H, c, k * block)  # (H, c, k·block) candidate keys
    candidates = weights.gather(-1, keys.clamp_max(K - 1)).masked_fill_(keys >= K, -1.0)  # past the last key: never
    top, where = candidates.topk(k, dim=-1)  # (H, c, k)
    return top, keys.gather(-1, where)


class _Kept:
    """What is being kept of one chosen text while its batch runs."""

    def __init__(self, row: int, n: int, L: int, H: int, pooled: bool, top_k: int | None) -> None:
        self.row, self.n = row, n
        self._layer: dict[str, Tensor] = {}  # the layer being streamed, on its device
        self._in_place = False  # the layer's buffers are the host tables themselves
        if not pooled:
            self.maps = torch.zeros(L, H, n, n)
            self.pooled = None
            return
        k = min(n, top_k or top_k_for(L * H, n))
        block = max(1, math.ceil(n / POOLED_CELLS))
        cells = math.ceil(n / block)
        self.maps = None
        self.pooled = Pooled(block, cells, k, torch.zeros(L, H, n, k, dtype=torch.int32),
                             torch.zeros(L, H, n, k, dtype=torch.uint8), torch.zeros(L, H, cells, cells),
                             torch.zeros(L, H, cells, cells))
        self.rows = torch.zeros(cells)  # query rows per row block, counted once: on the first layer that comes
        self.rows_layer: int | None = None  # that layer
        self.rows_counted = False  # its last rows are in

    def layer_on(self, weights: Tensor, first: bool, layer: int) -> dict[str, Tensor]:
        """The streamed ``layer``'s buffers on the device of ``weights``, its sums zeroed at its first
        chunk: on the host the text's own tables at the layer (written in place: no copy a layer, no
        buffers to zero — at 1k tokens 8 ms of an analysis), elsewhere one set a text (no block a
        layer between the chunks' buffers), copied to the host at the layer's end (:meth:`keep_layer`)."""
        if weights.device.type == "cpu":
            self._in_place = True
            if self.pooled is None:
                found = {"maps": self.maps[layer]}
            else:
                p = self.pooled
                found = {"index": p.index[layer], "values": p.values[layer], "mass": p.mass[layer],
                         "largest": p.largest[layer], "rows": self.rows}
            if first:
                for name in ("maps", "mass", "largest"):
                    if name in found:
                        found[name].zero_()
            return found
        self._in_place = False
        if not self._layer or next(iter(self._layer.values())).device != weights.device:
            H, dev = weights.shape[0], weights.device
            if self.pooled is None:
                self._layer = {"maps": torch.zeros(H, self.n, self.n, device=dev)}
            else:
                p = self.pooled
                self._layer = {"index": torch.zeros(H, self.n, p.k, dtype=torch.int32, device=dev),
                               "values": torch.zeros(H, self.n, p.k, dtype=torch.uint8, device=dev),
                               "mass": torch.zeros(H, p.cells, p.cells, device=dev),
                               "largest": torch.zeros(H, p.cells, p.cells, device=dev),
                               "rows": torch.zeros(p.cells, device=dev)}
        elif first:
            for buffer in self._layer.values():
                buffer.zero_()
        return self._layer

    def keep_layer(self, layer: int) -> None:
        """The layer's last rows are in: copy its buffers into the text's maps or pooled view (host
        memory), where they were not the host's own; the rows a row block holds are then counted."""
        if not self._in_place:
            found = self._layer
            if self.pooled is None:
                self.maps[layer].copy_(found["maps"])
            else:
                for name in ("index", "values", "mass", "largest"):
                    getattr(self.pooled, name)[layer].copy_(found[name])
                if self.counts_rows(layer):
                    self.rows.add_(found["rows"].cpu())
        if self.pooled is not None and layer == self.rows_layer:
            self.rows_counted = True

    def counts_rows(self, layer: int) -> bool:
        """Whether ``layer``'s chunks count the rows each row block holds: the first layer that comes
        (not layer 0 alone: a capture of some layers had left the mass unaveraged), until its last rows
        are in (a layer streamed again does not count them twice)."""
        if self.rows_layer is None:
            self.rows_layer = layer
        return layer == self.rows_layer and not self.rows_counted

    def done(self) -> None:
        """The text's last layer is in: its device buffers go."""
        self._layer = {}

    def rows_of(self, chunk: AttentionChunk) -> Tensor | None:
        """The text's rows of ``chunk`` over its own keys, (H, c, K) — None where the chunk holds none."""
        if chunk.start >= self.n:
            return None
        stop, K = min(chunk.stop, self.n), min(chunk.weights.shape[-1], self.n)
        return chunk.weights[self.row, :, :stop - chunk.start, :K].detach()  # (H, c, K)

    def pooled_job(self, chunk: AttentionChunk, parts: int) -> native.PooledJob | None:
        """The compiled reader's pass over the pooled text's rows of ``chunk`` in ``parts`` parts (one
        pass a row: its cells and top-k), or None where it holds none or the eager steps read them."""
        w = self.rows_of(chunk)
        pooled = self.pooled
        if w is None or pooled is None or not native.usable(w) or pooled.k > native.TOP_K:
            return None
        c, K = w.shape[1:]
        fine = _fine_block(pooled.block)  # the top-k's candidates come from blocks of `fine` keys
        extents = native.row_extents(chunk)[self.row, :, :c].clamp(max=K)  # (H, c)
        return native.pooled_job(w, chunk.start, fine, pooled.block // fine, pooled.cells, min(pooled.k, K), extents,
                                 parts)


class TextViews(ReducerBase):
    """Keeps the :class:`TextView` of the chosen corpus texts (a reducer).

    ``chosen``: corpus index -> text; ``tokenizer``: reads the tokens for people; ``long``: texts
    above this many tokens are pooled; ``top_k``: weights kept per row of a pooled text (default
    :func:`top_k_for`). Batches must be right-padded (a text's real tokens come first)."""

    def __init__(self, num_layers: int, num_heads: int, chosen: Mapping[int, str], tokenizer: Any, *,
                 long: int = LONG_TEXT, top_k: int | None = None) -> None:
        self.shape = (num_layers, num_heads)
        self.chosen = dict(chosen)
        self.tokenizer = tokenizer
        self.long = long
        self.top_k = top_k
        self.views: dict[int, TextView] = {}
        self._kept: dict[int, _Kept] = {}

    @staticmethod
    def planned_bytes(num_layers: int, num_heads: int, tokens: int, *, long: int = LONG_TEXT,
                      top_k: int | None = None) -> int:
        """Bytes kept in host memory for one chosen text of ``tokens`` tokens while its batch runs: its
        whole maps (L, H, n, n) float32, or — above ``long`` tokens — its pooled attention (see
        :class:`_Kept`), written in place layer by layer (a run on an accelerator streams each layer
        into one set of buffers there, a layer's share, and copies it over at the layer's end)."""
        L, H, n = num_layers, num_heads, tokens
        if n <= long:
            return L * H * n * n * 4
        k = min(n, top_k or top_k_for(L * H, n))
        cells = math.ceil(n / max(1, math.ceil(n / POOLED_CELLS)))
        return L * (H * n * k * 5 + 2 * H * cells * cells * 4) + cells * 4

    def begin_batch(self, batch: Batch) -> None:
        super().begin_batch(batch)
        self._finish()
        L, H = self.shape
        for row, index in enumerate(batch.texts):
            if index in self.chosen and index not in self.views:
                n = int(batch.host_tokens.valid[row].sum())
                kept = self._kept[index] = _Kept(row, n, L, H, n > self.long, self.top_k)
                if kept.pooled is not None:  # its rows read with the chunk's other compiled readers, where they run
                    batch.memo.setdefault(onepass.POOLED, {})[row] = kept.pooled_job

    def summary_needs(self, batch: Batch) -> frozenset[str] | None:
        """Nothing for a batch without a text this page shows (a layer of it may come as row sums,
        :mod:`multihead.attn.rowstats`: there is nothing to keep); None — its maps, formed from the row
        sums where the layer ran through the kernels — for a batch with one."""
        return None if self._kept else frozenset()

    def update(self, chunk: AttentionChunk) -> None:
        """Keep the chosen texts' rows of this chunk: on the chunk's device until the text's last
        row of the layer is in, then in host memory (one copy per layer, none per chunk)."""
        for kept in self._kept.values():
            w = kept.rows_of(chunk)  # (H, c, K)
            if w is None:
                continue
            stop, K = chunk.start + w.shape[1], w.shape[2]
            layer = kept.layer_on(w, chunk.start == 0, chunk.layer)
            if kept.pooled is None:
                layer["maps"][:, chunk.start:stop, :K] = w
            else:
                pooled = kept.pooled
                fine = _fine_block(pooled.block)  # the top-k's candidates come from blocks of `fine` keys
                found = onepass.pooled_result(chunk, kept.row)  # read with the chunk's other readers, or here
                job = None if found is not None else kept.pooled_job(chunk, native.pooled_parts(w))
                counted, counting = None, kept.counts_rows(chunk.layer)  # the rows a row block holds: counted once
                if found is not None or job is not None:  # one pass a row, cells and top-k
                    first, total, big, top, where = found if found is not None else native.pooled_pass(job)
                    if counting:
                        counted = _rows_per_block(chunk.start, w.shape[1], pooled.block, pooled.cells, w.device)
                else:
                    sums, maxima = key_blocks(w, fine)  # (H, c, ceil(K / fine)) each
                    top, where = top_weights(w, min(pooled.k, K), maxima, fine)  # (H, c, k')
                    sums, maxima = _coarser(sums, maxima, pooled.block // fine)  # (H, c, nb) each
                    first = 0
                    total, big, counted = _by_row_block(sums, maxima, chunk.start, pooled.block, pooled.cells)
                layer["index"][:, chunk.start:stop, :top.shape[-1]] = where  # int64 keys into the int32 table
                _byte(top, out=layer["values"][:, chunk.start:stop, :top.shape[-1]])
                blocks = slice(first, first + total.shape[1])  # the row blocks this chunk's rows are in
                layer["mass"][:, blocks] += total
                if counting:
                    layer["rows"] += counted
                torch.maximum(layer["largest"][:, blocks], big, out=layer["largest"][:, blocks])
            if stop == kept.n:  # the text's last rows of this layer: to host memory
                kept.keep_layer(chunk.layer)

    def end_batch(self) -> None:
        self._finish()

    def _finish(self) -> None:
        """Turn the texts kept in the last batch into views."""
        if not self._kept or self.batch is None:
            return
        for index, kept in self._kept.items():
            ids = self.batch.host_tokens.ids[kept.row, :kept.n].tolist()
            text = self.chosen[index]
            tokens = readable_tokens(self.tokenizer, ids, text, _offsets(self.tokenizer, text, len(ids)))
            kept.done()
            if kept.pooled is not None:
                kept.pooled.mass /= kept.rows.clamp_min(1).view(1, 1, -1, 1)  # mean row mass per block, in [0, 1]
            self.views[index] = TextView(text, tokens, maps=kept.maps, pooled=kept.pooled)
        self._kept = {}

    def merge(self, other: TextViews) -> None:
        self.views.update(other.views)

    def result(self) -> list[TextView]:
        """The chosen texts' views, in the order they were chosen."""
        self._finish()
        return [self.views[i] for i in self.chosen if i in self.views]


def _offsets(tokenizer: Any, text: str, n: int) -> list | None:
    """The first n tokens' character spans in ``text`` (fast tokenizers; None otherwise)."""
    if not getattr(tokenizer, "is_fast", False):
        return None
    spans = tokenizer(text, return_offsets_mapping=True, verbose=False)["offset_mapping"]
    return [tuple(s) for s in spans[:n]] if len(spans) >= n else None


def _byte(weights: Tensor, out: Tensor | None = None) -> Tensor:
    """Weights in [0, 1] as bytes (weight·255, rounded): how the page stores a kept weight — into
    ``out`` (uint8, weights' shape) where given (the same bytes: weight·255 rounded, then clamped to
    0..255, is exact in the cast that follows)."""
    scaled = weights.mul(255).round_().clamp_(0, 255)
    if out is None:
        return scaled.to(torch.uint8)
    return out.copy_(scaled)


@dataclass
class HeadView:
    """One head's map on one text, as the page draws it: the text's readable ``tokens`` and each
    row's ``k`` largest weights, ``index`` (T, k) int32 and ``values`` (T, k) uint8 (weight·255)."""

    text: int
    tokens: list[str]
    index: Tensor
    values: Tensor


#: A head's own map is kept on texts of at most this many tokens (:class:`HeadMaps`).
HEAD_VIEW_TOKENS = 128


class HeadMaps(ReducerBase):
    """Keeps single heads' maps on single texts (a reducer): ``wanted`` maps a corpus index to the
    (layer, head) cells whose rows to keep — e.g. every head on the texts where it is most typical
    of its label — as each row's ``k`` largest weights, so memory is cells·T·k, never L·H·T².
    Texts of more than ``longest`` tokens are left out."""

    def __init__(self, wanted: Mapping[int, set[tuple[int, int]]], texts: Mapping[int, str], tokenizer: Any, *,
                 k: int = 16, longest: int = HEAD_VIEW_TOKENS) -> None:
        self.wanted = {i: set(cells) for i, cells in wanted.items()}
        self.texts = dict(texts)
        self.tokenizer = tokenizer
        self.k, self.longest = k, longest
        self.found: dict[tuple[int, int, int], HeadView] = {}
        self._rows: dict[int, tuple[int, int]] = {}  # corpus index -> (batch row, tokens)

    def begin_batch(self, batch: Batch) -> None:
        super().begin_batch(batch)
        self._rows = {}
        for row, index in enumerate(batch.texts):
            n = int(batch.host_tokens.valid[row].sum())
            if index in self.wanted and n <= self.longest:
                self._rows[index] = (row, n)
                ids = batch.host_tokens.ids[row, :n].tolist()
                tokens = readable_tokens(self.tokenizer, ids, self.texts[index],
                                         _offsets(self.tokenizer, self.texts[index], n))
                for layer, head in self.wanted[index]:
                    k = min(self.k, n)
                    self.found[(index, layer, head)] = HeadView(index, tokens, torch.zeros(n, k, dtype=torch.int32),
                                                                torch.zeros(n, k, dtype=torch.uint8))

    def update(self, chunk: AttentionChunk) -> None:
        for index, (row, n) in self._rows.items():
            heads = sorted(h for layer, h in self.wanted[index] if layer == chunk.layer)
            if not heads or chunk.start >= n:
                continue
            stop, K = min(chunk.stop, n), min(chunk.weights.shape[-1], n)
            w = chunk.weights[row, heads, :stop - chunk.start, :K].detach().float()  # (h', c, K)
            top, where = w.topk(min(self.k, K), dim=-1)  # (h', c, k)
            values = _byte(top)  # (h', c, k)
            where = where.masked_fill(values == 0, 0)  # a weight quantised to 0 is not stored: its key says nothing
            for n_head, h in enumerate(heads):
                view = self.found[(index, chunk.layer, h)]
                view.index[chunk.start:stop, :top.shape[-1]] = where[n_head].to(torch.int32).cpu()
                view.values[chunk.start:stop, :top.shape[-1]] = values[n_head].cpu()

    def merge(self, other: HeadMaps) -> None:
        self.found.update(other.found)

    def result(self) -> dict[tuple[int, int, int], HeadView]:
        """{(corpus index, layer, head): HeadView}."""
        return dict(self.found)


class WholeMaps(ReducerBase):
    """The whole maps (L, H, T, T) of the chosen corpus items (e.g. a vision model's first image:
    every row of its batch is real), assembled from however the pass streams them (a reducer)."""

    def __init__(self, num_layers: int, num_heads: int, chosen: list[int]) -> None:
        self.shape = (num_layers, num_heads)
        self.chosen = list(chosen)
        self.maps: dict[int, Tensor] = {}
        self._rows: dict[int, int] = {}

    def begin_batch(self, batch: Batch) -> None:
        super().begin_batch(batch)
        self._rows = {index: row for row, index in enumerate(batch.texts) if index in self.chosen}

    def update(self, chunk: AttentionChunk) -> None:
        for index, row in self._rows.items():
            if index not in self.maps:
                self.maps[index] = torch.zeros(*self.shape, chunk.rows, chunk.keys)
            K = chunk.weights.shape[-1]
            self.maps[index][chunk.layer, :, chunk.start:chunk.stop, :K] = chunk.weights[row].detach().float().cpu()

    def merge(self, other: WholeMaps) -> None:
        self.maps.update(other.maps)

    def result(self) -> dict[int, Tensor]:
        return dict(self.maps)
