"""Which heads do the same thing: head × head similarity over a corpus, streaming.

Two measures, both averaged over the real query tokens of the corpus:

* ``js``: Jensen–Shannon distance (base 2, in [0, 1]) between two heads' attention rows for
  the same query token, ``sqrt(JS(p_a,i || p_b,i))``. 0 means the heads attend identically.
* ``cosine``: cosine similarity between two heads' *contributions to the residual stream*
  for the same token, ``head_h(x_i) · W^O[:, h]ᵀ`` (a D-vector). Head outputs before W^O live
  in different coordinates for every head; after W^O they are comparable.

Of one batch, every layer's sampled query rows and its heads' outputs are kept until the batch
ends (cross-layer pairs need them side by side), then reduced and released; nothing grows with
the corpus, and no layer's whole map is ever kept (a streamed document reduces the same way).

JS costs N²/2 · rows · keys elementwise logs (on a CPU in one compiled pass a pair,
:func:`~.native.pairwise_js`, 0.14–0.19 ns a pair-element on two cores of an AVX-512 CPU; the eager
blocks — the reference, and the path on CUDA — ~3 ns on the same CPU), so each batch contributes an
even stride of its query rows chosen to keep that work within :func:`js_budget`: :data:`JS_BUDGET`
(2^23) for the eager blocks, :data:`COMPILED_JS_BUDGET` (2^26) for the compiled pass; of a
32-sentence batch, the compiled pass's budget takes ~600 rows with MiniLM's 72 heads, ~35 with
SmolLM2's 270. A long document is one batch, whose budget affords a few rows, too few to rank the
pairs by: a batch takes at least :data:`JS_ROWS` (32) where every head's rows fit
:data:`JS_ROWS_MEMORY`, at least :data:`MIN_JS_ROWS` (4) whatever the memory, taken from the middle
of their strides. ``rows_js`` in the report says how many rows the JS averages rest on. The cosine uses
every row of a batch up to :data:`COSINE_ROWS` while its N² · rows · D work stays within
:data:`COSINE_BUDGET`, an even sample beyond (at least :data:`MIN_COSINE_ROWS` rows; ``rows_cosine``
in the report). Head outputs and W^O are read as the model has them: its own dtype, its own W^O (no
copy).
"""

from __future__ import annotations

import math
from bisect import bisect_left

import torch
from torch import Tensor

from ...attn import fused
from ...attn.precision import HALF, half_matmul, half_units
from ...attn.rowstats import rows_at
from ...hf.route import AttentionChunk
from ...inputs import Batch
from . import native
from .base import ReducerBase

__all__ = ["COMPILED_JS_BUDGET", "JS_BUDGET", "JS_ROWS", "JS_ROWS_MEMORY", "MIN_JS_ROWS", "RedundancyStatistics",
           "clusters", "js_budget", "most_redundant"]

#: Pair-elements of JS work a batch may take in the eager blocks (~25 ms at ~3 ns each) ...
JS_BUDGET = 1 << 23
#: ... and in the compiled pass (~10 ms at 0.14-0.19 ns each on AVX-512, ~20 at 0.3 with glibc's logf on AVX2
#: builds): 8x the rows — SmolLM2's JS over 100 sentences rested on 31 query tokens at JS_BUDGET.
COMPILED_JS_BUDGET = 1 << 26
#: The query rows of a batch the JS averages rest on, whatever the budget, where their maps fit
#: :data:`JS_ROWS_MEMORY`: a long document is one batch, and the budget of a batch of sentences gave it
#: 4 rows — SmolLM2 bfloat16 on a 4,096-token Penn Treebank document, its 270 heads' JS over 4 rows
#: against 256: pairs up to 0.39 apart (mean 0.040), 3 of the 20 most redundant pairs the same; over
#: 16 rows 0.16 (13 of 20), 64 rows 0.063 (18); at 1,024 tokens against all 1,024 rows, 4: 0.29 (7 of
#: 20), 32: 0.11 (15), 128: 0.049 (20). 32 rows of SmolLM2 at 4k: ~2.4e9 pair-elements, ~0.36 s
#: compiled on two cores (AMD EPYC Zen 4), 4 % of its analysis — ~7 s in the eager blocks (a CPU with no
#: C compiler, or MULTIHEAD_NATIVE=0), the same floor: a ranking that holds is worth their time there too.
JS_ROWS = 32
#: Bytes of sampled rows (float32, every head's, the batch's keys long) a batch holds for
#: :data:`JS_ROWS` at most: SmolLM2 at 8k tokens takes 30 rows (253 MiB); an 8B model's 1,024
#: heads at 32k, 2 — so ...
JS_ROWS_MEMORY = 1 << 28
#: ... the fewest rows, whatever the budget and the memory (an 8B model at 32k tokens: 512 MiB).
MIN_JS_ROWS = 4
#: elements of residual contributions (N x rows x D) formed at once for the cosine
COSINE_CHUNK = 1 << 24
#: The most query rows of a batch the output cosine averages over (an even stride beyond): every
#: row of a batch of sentences; of a long document a sample, so the heads' kept outputs (L·H·rows·Dv)
#: stay bounded — 32 k tokens of an 8B model would otherwise keep 17 GB of them.
COSINE_ROWS = 2048
#: The cosine's work per batch, N² · rows · D multiply-adds (every pair of heads on every row): rows
#: beyond it are an even sample — MiniLM's batches stay whole (72 heads of 384: all 2,048), SmolLM2
#: (270 of 576) takes 818 (of 1,024 rows: 512, every other one), a Qwen2-1.5B shape (336 heads of
#: 1,536) 512, not the 2,048 rows whose cosine alone took 7 s on this machine's CPU. A mean cosine
#: over such a stride moves little: SmolLM2 bfloat16 on a 4,096-token Penn Treebank document, 683
#: rows against all 4,096: every pair within 0.017 (mean 0.0011), the ten most similar pairs the
#: same (1,365 rows at 2^36: within 0.011) — and at 1k tokens the cosine was a sixth of the analysis ...
COSINE_BUDGET = 1 << 35
#: ... and never fewer rows than this, whatever the budget.
MIN_COSINE_ROWS = 512


#: Elements of the largest block of head-pair mixtures :func:`_pairwise_js` forms at once.
JS_BLOCK = 1 << 22


class RedundancyStatistics(ReducerBase):
    """Running sums of pairwise JS distance and output cosine for N = L·H heads (a reducer).

    A batch's maps are needed across layers (cross-layer pairs), so each layer keeps, until the
    batch ends, only what the sums need: the sampled query rows of its map (see
    :data:`JS_BUDGET`) and its heads' outputs at the real tokens — never a whole (T, S) map, so a
    streamed document is reduced like a batch of sentences.
    """

    def __init__(self, num_layers: int, num_heads: int) -> None:
        self.L, self.H = num_layers, num_heads
        n = num_layers * num_heads
        self.js_sum = torch.zeros(n, n, dtype=torch.float64)
        self.cos_sum = torch.zeros(n, n, dtype=torch.float64)
        self.js_count = 0.0
        self.cos_count = 0.0
        self._w_o: dict[int, Tensor] = {}  # layer -> (D, H, Dv), the model's own
        # every layer's sampled rows (L, H, R_s, S) and heads' outputs at the cosine's rows (L, H, R_c, Dv),
        # one block each a batch: the heap is not cut up by a block per layer between the chunks' buffers
        self._all_maps: Tensor | None = None
        self._all_outputs: Tensor | None = None
        self._layers: set[int] = set()  # the layers seen in this batch
        # (B, T) flat index of each real token; its place in the JS sample; its place in the cosine sample
        self._where: tuple[Tensor, Tensor, Tensor | None] | None = None
        self._chunk_rows: dict = {}  # sample -> its rows, sorted (:meth:`_rows_of`)

    @staticmethod
    def planned_bytes(num_layers: int, num_heads: int, rows: int, keys: int, hidden: int, head_dim: int, *,
                      element_size: int = 4, gram_size: int = 4, budget: int = JS_BUDGET) -> tuple[int, int]:
        """(bytes held through a batch of ``rows`` real query rows over ``keys`` keys, bytes its
        end-of-batch work adds): each layer's sampled rows (H, R_s, S) in float32 (a float64 model's in
        float64) and its heads' outputs at the cosine's rows (H, R_c, Dv) in the model's dtype
        (``element_size`` bytes; W^O is the model's own, not a copy); at the end the JS's blocks or one cosine step, its
        contributions in ``gram_size`` bytes (:func:`gram_dtype`). ``budget``: the JS's
        (:func:`js_budget`)."""
        L, H, N = num_layers, num_heads, num_layers * num_heads
        sampled = len(range(rows)[_row_sample(N, rows, keys, budget)])
        cosine = len(range(rows)[_cosine_sample(N, hidden, rows)])
        maps = L * H * sampled * keys * (8 if element_size == 8 else 4)  # float32 rows, a float64 model's its own
        held = maps + L * H * cosine * head_dim * element_size
        # at the end, beside what is held: the eager JS's temporaries (the rows' lengths read from a
        # bool copy of the maps, then blocks of JS_BLOCK mixtures and their logarithms; the compiled
        # pass's are O(N·R + N²), so on a CPU this is a little over) or the cosine's
        # block of contributions (gram_size) with one layer's temporaries, whichever is more
        js = max(N * sampled * keys, 2 * JS_BLOCK * 4)
        at_once = _cosine_step(N, hidden, cosine)  # a block of every head's contributions
        # one layer's temporaries: its float32 squares beside its products in the model's dtype (a float32
        # block) or beside its float32 copy (a block in the half dtype itself)
        layer = H * at_once * hidden * (4 + (element_size if gram_size == 4 else 4))
        gram = N * N * (4 + 4 + 8)  # the Gram's bands, the Gram and its float64 sum
        return held, max(js, N * at_once * hidden * gram_size + layer + gram)

    @staticmethod
    def summary_needs(batch: Batch) -> frozenset[str]:
        """What this reducer reads of a layer given as row sums: nothing beyond them — its sampled
        rows are formed from the layer's queries, keys and rows' ``lse`` (:func:`~multihead.attn.rowstats.rows_at`)."""
        return frozenset()

    def begin_batch(self, batch: Batch) -> None:
        """Choose the batch's sampled rows: an even stride through its real query tokens in (text,
        position) order."""
        self.end_batch()
        super().begin_batch(batch)
        valid = batch.host_tokens.valid  # on the host: the batch's samples are chosen there
        R = int(valid.sum())
        B, T = valid.shape
        flat = (valid.flatten().long().cumsum(0) - 1).view(B, T)  # (B, T) index among the real tokens
        # the JS work that the pass reading the sample affords where the maps are (not the host's copy)
        budget = js_budget(batch.tokens.valid.device)
        chosen = torch.arange(R)[_row_sample(self.L * self.H, R, T, budget)]  # (R_s,)
        sample = torch.full((max(R, 1),), -1, dtype=torch.long)
        sample[chosen] = torch.arange(len(chosen))
        self._where = (flat, sample, None)  # the cosine's rows: once W^O (its D) is seen
        self._chunk_rows = {}
        self._real = R
        self._sampled = len(chosen)

    def update(self, chunk: AttentionChunk) -> None:
        """Keep this chunk's sampled rows and its heads' outputs at real tokens (which rows: found
        on the host once a batch; nothing read back from the device)."""
        assert self.batch is not None and self._where is not None, "begin_batch first"
        start, stop, layer = chunk.start, chunk.stop, chunk.layer
        device = chunk.outputs.device
        H, S = chunk.outputs.shape[1], chunk.keys
        if self._all_maps is None:
            dtype = torch.float32 if chunk.weights is None else chunk.weights.dtype  # the maps' (float64 model's: its)
            self._all_maps = torch.zeros(self.L, H, self._sampled, S, dtype=dtype, device=device)
        self._layers.add(layer)
        sampled = self._rows_of(start, stop, 1, device)
        if sampled is not None and chunk.weights is None:  # a summary chunk: the sampled rows from Q, K and lse
            b, c, place = _as_indices(sampled, device)
            s = chunk.summary
            rows = rows_at(s.query, s.key, s.found.lse, b, c + start, causal=s.causal, key_valid=s.key_valid,
                           scale=s.scale)  # (r, H, S)
            self._all_maps[layer][:, place] = rows.transpose(0, 1)  # (H, r, S)
        elif sampled is not None:  # (b, c, place) of the chunk's rows in the JS sample
            weights = chunk.weights.detach()
            K = weights.shape[3]
            self._all_maps[layer][:, sampled[2], :K] = _rows(weights, sampled)  # (H, r, K)
        w_o = chunk.output_projection()
        if w_o is not None:
            if self._where[2] is None:  # the batch's cosine rows, from its work: N² · rows · D
                self._cosine_rows(w_o.shape[0])
            # outputs and W^O as the model has them (its dtype, its own W^O): its residual contributions
            # are products in that dtype, and a bfloat16 8B model's W^O in float32 would be 2 GiB more
            if self._all_outputs is None:
                self._all_outputs = chunk.outputs.new_zeros(self.L, H, self._rows, chunk.outputs.shape[-1])
            if start == 0:
                self._w_o[layer] = w_o.detach().view(w_o.shape[0], self.H, -1)  # (D, H, Dv)
            kept = self._rows_of(start, stop, 2, device)
            if kept is not None:
                self._all_outputs[layer][:, kept[2]] = _rows(chunk.outputs.detach(), kept)  # (H, r, Dv)

    def _rows_of(self, start: int, stop: int, which: int, device: torch.device
                 ) -> tuple[Tensor | int, Tensor | slice, Tensor | slice] | None:
        """The real rows ``start`` .. ``stop`` of the batch that are in sample ``which`` (1: the
        JS's, 2: the cosine's) as (text, row in the chunk, place in the sample), each (r,) on
        ``device`` — or, where they are one text's rows at an even stride (a document's sample), its
        row and two slices, so that the chunk's rows are read and kept as strided views (one copy,
        not a gather and a scatter a chunk: 0.2 ms a chunk at 1k tokens) — or None when none is:
        found on the host and moved once a batch (no chunk asks the device, none leaves a block behind)."""
        if which not in self._chunk_rows:
            flat, place_of = self._where[0], self._where[which]
            b, i = self.batch.host_tokens.valid.nonzero(as_tuple=True)  # (R,) each real row
            place = place_of[flat[b, i]]  # (R,) -1: not in the sample
            keep = place >= 0
            b, i, place = b[keep], i[keep], place[keep]
            order = i.argsort(stable=True)  # by row
            b, i, place = b[order], i[order], place[order]
            stride = _even_stride(b, i, place)
            self._chunk_rows[which] = (i.tolist(), b.to(device), i.to(device), place.to(device),
                                       None if stride is None else (int(b[0]), stride, int(i[0]), int(place[0])))
        rows, b, i, place, even = self._chunk_rows[which]
        lo, hi = bisect_left(rows, start), bisect_left(rows, stop)
        if lo == hi:
            return None
        if even is not None:  # one text's rows at an even stride, its places one after another
            text, stride, first, at = even
            return text, slice(first + lo * stride - start, first + (hi - 1) * stride - start + 1, stride), \
                slice(at + lo, at + hi)
        return b[lo:hi], i[lo:hi] - start, place[lo:hi]

    def _cosine_rows(self, hidden: int) -> None:
        """Choose the batch's cosine sample: each real row's place in it (-1: not in it)."""
        R = self._real
        chosen = torch.arange(R)[_cosine_sample(self.L * self.H, hidden, R)]  # (R_c,)
        cosine = torch.full((max(R, 1),), -1, dtype=torch.long)
        cosine[chosen] = torch.arange(len(chosen))
        flat, sample, _ = self._where
        self._where = (flat, sample, cosine)
        self._rows = len(chosen)

    def end_batch(self) -> None:
        """Reduce the batch's layers into the running sums and release them."""
        seen_all = len(self._layers) == self.L
        if seen_all:
            maps = self._all_maps.flatten(0, 1)  # (N, R_s, S), layer by layer
            R = maps.shape[1]
            self.js_sum += js_sums(maps)
            self.js_count += R
        if seen_all and len(self._w_o) == self.L and self._all_outputs.shape[2]:
            outputs = self._all_outputs  # (L, H, R_c, Dv)
            R = outputs.shape[2]
            D = self._w_o[0].shape[0]
            H, N = self.H, self.L * self.H
            step = _cosine_step(N, D, R)  # R >= 1 here
            in_dtype = gram_dtype(outputs.dtype, outputs.device)  # the contributions' and their Gram's
            # one block for every step's contributions (N, D, rows), made once: a fresh one per step, larger
            # than glibc keeps in its heap, would be mapped and page-faulted anew each time
            block = torch.empty(N * D * step, dtype=in_dtype, device=outputs.device)
            # a model whose products are not the Gram's dtype forms them in its own, then copies them into the
            # block: on a GPU through a staging block; on a CPU (one without half units: gram_dtype) through
            # half_matmul, whose float32 sums run at MKL's speed where PyTorch's half GEMM is a scalar loop
            staged = outputs.dtype != in_dtype and outputs.device.type != "cpu"
            staging = outputs.new_empty(H * D * step) if staged else None
            # the unit vectors in one compiled pass a layer where it runs (a CPU block: 6x the eager steps, whose
            # float32 temporaries took fresh pages a layer), else the eager steps (the reference)
            compiled = (block.device.type == "cpu" and block.dtype in (torch.bfloat16, torch.float32)
                        and native.available())
            for r in range(0, R, step):  # (N, D, rows) at a time: memory stays flat in the batch size
                n = min(step, R - r)
                contrib = block[:N * D * n].view(N, D, n)
                for layer in range(self.L):
                    # W^O's columns of head h, (D, Dv) with row stride H·Dv, times its outputs transposed: one
                    # batched product over the heads that reads both in place (no copy; 3-4x an einsum's speed);
                    # in the model's dtype (its own W^O, no float32 copy of it)
                    mine = contrib[layer * H:(layer + 1) * H]  # (H, D, rows), contiguous
                    w_o = self._w_o[layer].to(outputs.dtype).permute(1, 0, 2)  # (H, D, Dv), where its layer is
                    rows = outputs[layer, :, r:r + n].transpose(1, 2)  # (H, Dv, rows)
                    if w_o.device != mine.device:  # a layer a device map put on another GPU: its product
                        mine.copy_(torch.bmm(w_o, rows.to(w_o.device)))  # there (no copy of its W^O here)
                    elif staging is not None:
                        mine.copy_(torch.bmm(w_o, rows, out=staging[:H * D * n].view(H, D, n)))
                    elif mine.dtype == w_o.dtype:
                        torch.bmm(w_o, rows, out=mine)
                    else:
                        mine.copy_(half_matmul(w_o, rows))
                    # unit vectors layer by layer, while the layer's part is in cache: (H, 1, rows) norms summed
                    # in float32 whatever the block's dtype (2x .norm(dim=1)'s speed for float32)
                    if compiled:
                        native.unit_columns(mine)
                    else:
                        norm = mine.float().square().sum(1, keepdim=True).sqrt_()
                        mine.div_(norm.clamp_min_(1e-12))  # a half block: each quotient formed in float32, then rounded
                self.cos_sum += _gram(contrib.view(N, D * n)).to(torch.float64).cpu()  # Σ_r cos_r for every pair
            del block, staging
            self.cos_count += R
        self._layers.clear()
        self._all_maps = self._all_outputs = None
        self._w_o.clear()
        self._where = None
        self._chunk_rows = {}  # (device tensors: not carried into a merge)

    def merge(self, other: RedundancyStatistics) -> None:
        """Add another accumulator's sums (e.g. from another process's shard)."""
        if (other.L, other.H) != (self.L, self.H):
            raise ValueError(f"cannot merge statistics of {other.L}x{other.H} and {self.L}x{self.H} heads")
        self.end_batch()
        self.js_sum += other.js_sum
        self.cos_sum += other.cos_sum
        self.js_count += other.js_count
        self.cos_count += other.cos_count

    def js(self) -> Tensor:
        """(N, N) mean JS distance; N = L·H, head n is (n // H, n % H)."""
        return self.js_sum / max(self.js_count, 1)

    def cosine(self) -> Tensor:
        """(N, N) mean cosine of residual contributions (NaN when not captured)."""
        return self.cos_sum / self.cos_count if self.cos_count else torch.full_like(self.cos_sum, math.nan)

    def result(self) -> RedundancyStatistics:
        """The finished sums (:meth:`js`, :meth:`cosine`, ``js_count`` rows)."""
        self.end_batch()
        return self


def _cosine_step(N: int, D: int, rows: int) -> int:
    """Rows of the cosine's contributions (N, D, rows) formed at once: :data:`COSINE_CHUNK` elements,
    whole vectors of 16 rows where more than 16 fit — a layer's unit vectors are then made with no
    scalar tail a row of D (SmolLM2's 107 rows a step: 0.20 → 0.12 ms a layer, Intel Xeon with AMX) —
    and never more than ``rows``."""
    step = max(1, COSINE_CHUNK // (N * D))
    return min(rows, step // 16 * 16 if step > 16 else step)


def _even_stride(b: Tensor, i: Tensor, place: Tensor) -> int | None:
    """The stride of a sample's rows (b, i, place: (r,) each, by row) where they are one text's rows at
    an even stride with places one after another, else None."""
    if len(i) == 0 or bool((b != b[0]).any()) or bool((place.diff() != 1).any()):
        return None
    if len(i) == 1:
        return 1
    steps = i.diff()
    return int(steps[0]) if bool((steps == steps[0]).all()) and int(steps[0]) > 0 else None


def _rows(x: Tensor, found: tuple) -> Tensor:
    """The rows ``found`` (:meth:`RedundancyStatistics._rows_of`) of a chunk's x (B, H, c, ·), (H, r, ·):
    a strided view of one text's rows, or a gather of the rows named."""
    b, c, _ = found
    if isinstance(c, slice):
        return x[b, :, c]
    return x[b, :, c].transpose(0, 1)


def _as_indices(found: tuple, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """``found`` (:meth:`RedundancyStatistics._rows_of`) as three (r,) index tensors on ``device``."""
    b, c, place = found
    if not isinstance(c, slice):
        return b, c, place
    rows = torch.arange(c.start, c.stop, c.step, device=device)
    return torch.full_like(rows, b), rows, torch.arange(place.start, place.stop, device=device)


def js_budget(device: torch.device | str) -> int:
    """Pair-elements of JS work a batch on ``device`` may take: :data:`COMPILED_JS_BUDGET` where the
    compiled pass reads its maps (a CPU with the library built), else :data:`JS_BUDGET` (the eager
    blocks; on CUDA too, where the maps are)."""
    return COMPILED_JS_BUDGET if torch.device(device).type == "cpu" and native.available() else JS_BUDGET


def gram_dtype(dtype: torch.dtype, device: torch.device | str) -> torch.dtype:
    """The dtype the cosine's contributions and their Gram are formed in: a half-precision model's own
    on a CPU with units for it (:func:`~multihead.attn.precision.half_units`), float32 otherwise.

    A half model's contributions are products in its dtype already (each rounded to it); rounding
    their unit vectors to it as well and multiplying them in its units — oneDNN sums each product in
    float32 and rounds the step's (N, N) sums once, which float64 then adds (the tiles' own Gram,
    :func:`_gram`, keeps them float32) — moves a mean cosine by
    at most ~6e-3 in bfloat16 (2^-8 from the unit vectors' rounding, by Cauchy–Schwarz, 2^-9 from the
    sums') and by less than 1e-3 in practice (SmolLM2 at 1k: 8.2e-4; docs/analysis.md), for 2.6x
    (AVX-512 BF16, AMD EPYC) to 4x (AMX) the float32 Gram's speed — the largest single step of a
    bfloat16 model's analysis. Float32 on CUDA, where the float32 Gram is cheap beside the model."""
    if dtype in HALF and torch.device(device).type == "cpu" and half_units(dtype):
        return dtype
    return torch.float32


def _gram(unit: Tensor, parts: int = 3) -> Tensor:
    """unit @ unitᵀ (N, N) of unit (N, X). Of bfloat16 rows on a CPU with the AMX tiles, their own
    Gram (:func:`~multihead.attn.fused.gram`: float32 sums, none rounded to bfloat16 — 1.4-1.6x
    oneDNN's product of this short, wide shape, SmolLM2's 270 heads × 55,296, Xeon with AMX). Else
    ``parts`` square blocks of ceil(N / parts) rows (the last
    one ending at N, overlapping the one before where ``parts`` does not divide N), each pair of them
    on and above the diagonal one product — 2/3 of the full product's multiply-adds for 3 parts —
    and every product of one shape, so a GEMM library that builds a kernel for each shape it meets
    (oneDNN's AMX kernels, ~15 ms each) builds one where bands of rows against all later rows (three
    shapes) had cost SmolLM2's first analysis in a process 0.1 s (Intel Xeon with AMX). Its upper
    triangle mirrored below: symmetric exactly, whatever the BLAS."""
    if unit.dtype == torch.bfloat16 and unit.device.type == "cpu" and unit.is_contiguous() and fused.tiles_available():
        return fused.gram(unit)
    N = unit.shape[0]
    size = -(-N // max(1, min(parts, N)))
    starts = sorted({min(i * size, N - size) for i in range(-(-N // size))})
    gram = unit.new_empty(N, N)
    for n, a in enumerate(starts):
        rows = unit[a:a + size]  # (size, X)
        for b in starts[n:]:  # every entry (i <= j) lies in a block (a, b) with a <= b: i's first, j's last
            gram[a:a + size, b:b + size] = rows @ unit[b:b + size].T  # (size, size)
    return gram.triu() + gram.triu(1).T  # each entry plus an exact zero


def js_sums(maps: Tensor) -> Tensor:
    """Σ over rows of sqrt(JS) between every two heads, maps (N, R, S) -> (N, N) float64 on the host:
    the compiled pass (:func:`~.native.pairwise_js`) where it reads the maps, else the eager one."""
    if native.usable(maps) and maps.is_contiguous():
        return native.pairwise_js(maps)
    return _pairwise_js(maps).cpu() * maps.shape[1]


def _pairwise_js(maps: Tensor, budget: int = JS_BLOCK) -> Tensor:
    """Mean over rows of sqrt(JS) (base 2) between every pair of heads: maps (N, R, S) -> (N, N).

    Symmetric, so only blocks on and above the diagonal are computed; block size keeps each
    temporary at about ``budget`` elements. A row is read only up to its last key any head
    weighs (a causal row i: keys 0..i; a padded sentence: its own tokens) — keys where every
    head's weight is 0 add exactly 0 — rows of about the same length together.
    """
    N, R = maps.shape[:2]
    maps = maps.float()
    out = torch.zeros(N, N, dtype=torch.float64, device=maps.device)
    for rows, keys in _by_length(maps):
        part = maps[:, rows, :keys]  # (N, r, keys): a view where the rows are consecutive
        r = rows.stop - rows.start if isinstance(rows, slice) else len(rows)
        c = max(1, int(math.sqrt(budget / max(r * keys, 1))))
        # Σ p ln p of each head's rows (N, r), summed as the mixtures are (a head with itself: exactly
        # 0), c² heads at a time: no temporary the size of the maps
        own_part = torch.cat([_plogp_sum(part[a:a + c * c]) for a in range(0, N, c * c)])
        for a in range(0, N, c):
            pa = part[a:a + c, None]  # (c, 1, r, keys)
            for b in range(a, N, c):
                mix = (pa + part[None, b:b + c]).mul_(0.5)  # (c, c', r, keys)
                js = (own_part[a:a + c, None] + own_part[None, b:b + c]).mul_(0.5)  # (c, c', r)
                js.sub_(_plogp_sum(mix)).clamp_min_(0).div_(math.log(2))
                block = js.sqrt_().sum(-1, dtype=torch.float64)  # (c, c')
                out[a:a + c, b:b + c] += block
                if b != a:
                    out[b:b + c, a:a + c] += block.T
    return out / max(R, 1)


def _by_length(maps: Tensor, slack: float = 0.75) -> list[tuple[Tensor | slice, int]]:
    """The rows of maps (N, R, S) in groups of about the same length — each row's length its last
    key with weight in any head, plus one; a group's rows at least ``slack`` of its longest — as
    (rows, keys) pairs, rows a slice where they are consecutive (one text's causal rows, an
    encoder's: read as a view, not copied), else (r,): read once per batch, so one host read of
    R lengths."""
    S = maps.shape[2]
    weighed = (maps != 0).any(0)  # (R, S)
    lengths = torch.where(weighed, torch.arange(1, S + 1, device=maps.device), 0).amax(-1).clamp_min(1)  # (R,)
    order = lengths.argsort(descending=True).tolist()
    lengths = lengths.tolist()
    groups, current = [], []
    for r in order:
        if current and lengths[r] < slack * lengths[current[0]]:
            groups.append(current)
            current = []
        current.append(r)
    if current:
        groups.append(current)
    found = []
    for g in groups:
        keys = lengths[g[0]]  # the group's longest row
        g.sort()
        consecutive = g[-1] - g[0] + 1 == len(g)
        found.append((slice(g[0], g[-1] + 1) if consecutive else torch.tensor(g, device=maps.device), keys))
    return found


def _plogp_sum(p: Tensor) -> Tensor:
    """Σ p ln p over the last dim; 0·ln 0 = 0. (A shifted log is ~1.5x faster than xlogy here.)"""
    return p.add(1e-30).log_().mul_(p).sum(-1)


def _row_sample(N: int, R: int, S: int, budget: int) -> slice:
    """Every row when the batch's JS work fits the budget, else an even stride through them, each
    row in the middle of its stride — never only the first rows (a causal model's row 0 sees one
    key: every head's is the same, and a sample of it alone would call every pair identical) — and
    at least :data:`JS_ROWS` rows where N heads' rows of S keys fit :data:`JS_ROWS_MEMORY`, at least
    :data:`MIN_JS_ROWS` whatever the budget and the memory."""
    pairs = N * (N + 1) // 2
    held = JS_ROWS_MEMORY // max(N * S * 4, 1)  # float32 rows of every head
    return _even_sample(R, max(MIN_JS_ROWS, min(JS_ROWS, held), budget // max(pairs * S, 1)))


def _cosine_sample(N: int, hidden: int, R: int) -> slice:
    """The cosine's rows of a batch of R: all while N² · R · hidden stays within
    :data:`COSINE_BUDGET` (and R within :data:`COSINE_ROWS`), else an even sample of at least
    :data:`MIN_COSINE_ROWS`."""
    within = COSINE_BUDGET // max(N * N * hidden, 1)
    return _even_sample(R, max(MIN_COSINE_ROWS, min(COSINE_ROWS, within)))


def _even_sample(R: int, keep: int) -> slice:
    """Every one of R rows when ``keep`` reaches R, else an even stride through them, each row in
    the middle of its stride."""
    if keep >= R:
        return slice(None)
    stride = math.ceil(R / keep)
    return slice(stride // 2, None, stride)


def most_redundant(similarity: Tensor, num_heads: int, *, k: int = 10, distance: bool = True,
                   allowed: Tensor | None = None) -> list[tuple[tuple[int, int], tuple[int, int], float]]:
    """The k most similar pairs of different heads as ((layer, head), (layer, head), value);
    ``allowed`` (N, N) bool: only the pairs it allows."""
    N = similarity.shape[0]
    i, j = torch.triu_indices(N, N, offset=1)
    values = similarity[i, j]
    keep = ~torch.isnan(values) if allowed is None else ~torch.isnan(values) & allowed[i, j]
    i, j, values = i[keep], j[keep], values[keep]
    order = values.argsort(descending=not distance)[:k]
    return [((int(i[o]) // num_heads, int(i[o]) % num_heads), (int(j[o]) // num_heads, int(j[o]) % num_heads),
             float(values[o])) for o in order]


def clusters(distance: Tensor, threshold: float) -> list[list[int]]:
    """Groups of heads linked by distance <= threshold (single linkage), largest first; singletons dropped."""
    N = distance.shape[0]
    close = [(a, b) for a, b in (distance <= threshold).nonzero().tolist() if a < b]
    groups: dict[int, list[int]] = {}
    for n, root in enumerate(_linked(N, close)):
        groups.setdefault(root, []).append(n)
    return sorted((g for g in groups.values() if len(g) > 1), key=len, reverse=True)


def _linked(N: int, links: list[tuple[int, int]]) -> list[int]:
    """For each of N items, the representative of the group the ``links`` join it into (union-find)."""
    parent = list(range(N))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in links:
        parent[find(b)] = find(a)
    return [find(x) for x in range(N)]


def informative_groups(distance: Tensor, max_groups: int = 20) -> dict:
    """Heads grouped by Ward's agglomerative clustering of ``distance`` (N, N) — each merge adds the
    least within-group variance (Lance–Williams update on squared distances) — cut at the number of
    groups (2 .. ``max_groups``) with the best mean silhouette among the cuts whose largest group
    holds at most half the heads (a group of most heads says little; all cuts when none qualifies).
    Single or average linkage chain near neighbours into one group of most heads plus a few
    outliers (measured on MiniLM: 71 + 1 heads at the best average-linkage cut).

    Returns {"groups": [[head, ...], ...] largest first, "silhouette": the cut's mean silhouette,
    "height": the merge distance at the cut}."""
    import numpy as np

    D = np.nan_to_num(distance.double().numpy(), nan=1.0)
    N = D.shape[0]
    if N < 3:
        return {"groups": [list(range(N))], "silhouette": 0.0, "height": 0.0}
    merges = _ward_linkage(D)
    cuts = []
    for k in range(2, min(max_groups, N - 1) + 1):
        labels = _cut(merges, N, k)
        cuts.append((_silhouette(D, labels), k, labels))
    # a group of more than half the heads says little: the best cut without one, if there is such a cut
    balanced = [c for c in cuts if np.bincount(c[2]).max() <= N / 2]
    score, k, labels = max(balanced or cuts, key=lambda c: c[0])
    groups: dict[int, list[int]] = {}
    for n, g in enumerate(labels.tolist()):
        groups.setdefault(g, []).append(n)
    return {"groups": sorted(groups.values(), key=len, reverse=True), "silhouette": round(float(score), 4),
            "height": round(float(merges[N - k - 1][2]), 4)}


def _ward_linkage(D):
    """Merges [(a, b, height)] in order; a cluster keeps the index of its first member."""
    import numpy as np

    M = (D.astype(np.float64) ** 2).copy()  # Ward's update works on squared distances
    np.fill_diagonal(M, np.inf)
    size = np.ones(len(M))
    merges = []
    for _ in range(len(M) - 1):
        i, j = divmod(int(np.argmin(M)), len(M))
        i, j = min(i, j), max(i, j)
        merges.append((i, j, float(np.sqrt(M[i, j]))))
        row = ((size + size[i]) * M[i] + (size + size[j]) * M[j] - size * M[i, j]) / (size + size[i] + size[j])
        M[i], M[:, i] = row, row
        M[i, i] = np.inf
        M[j], M[:, j] = np.inf, np.inf
        size[i] += size[j]
    return merges


def _cut(merges, N: int, k: int):
    """Group labels (N,) after the first N − k merges."""
    import numpy as np

    found = _linked(N, [(a, b) for a, b, _ in merges[:N - k]])
    roots = {r: n for n, r in enumerate(sorted(set(found)))}
    return np.array([roots[r] for r in found])


def _silhouette(D, labels) -> float:
    """Mean silhouette of a grouping (a head alone in its group scores 0)."""
    import numpy as np

    k = int(labels.max()) + 1
    onehot = np.eye(k)[labels]  # (N, k)
    counts = onehot.sum(0)  # (k,)
    sums = D @ onehot  # (N, k) summed distance of each head to each group
    own = labels
    n_own = counts[own]
    a = np.where(n_own > 1, sums[np.arange(len(D)), own] / np.maximum(n_own - 1, 1), 0.0)
    other = sums / np.maximum(counts, 1)
    other[np.arange(len(D)), own] = np.inf
    b = other.min(1)
    s = np.where(n_own > 1, (b - a) / np.maximum(np.maximum(a, b), 1e-12), 0.0)
    return float(s.mean())
