"""Exact attention computed chunk by chunk over a *key plan*, with memory O(n·w), not O(n²).

A plan is a list of chunks; each chunk is a set of query rows and the keys those rows may
need: a contiguous key range plus an optional list of extra key positions. The planners
(:mod:`.local` for bands and global tokens, :mod:`.sparse` for block layouts) decide which
keys; the mask's own predicate (``Mask.mask_mod``) decides, inside each chunk, exactly which
(query, key) pairs count. Every query row belongs to exactly one chunk.

The forward pass keeps nothing but q, k and v; the backward pass recomputes each chunk's
probabilities (as FlashAttention does), so saved memory is O(n) and temporaries are one
chunk's (B, H, c, W) scores. Top-k selection and attention dropout are recomputed the
same way (the dropout pattern from a per-chunk seed).

Without top-k, dropout or an additive bias, the forward pass hands each chunk, with the
chunk's boolean mask, to ``F.scaled_dot_product_attention``: PyTorch's fused kernel never
writes the chunk's scores to memory, which makes the forward ~1.4x faster on the CPU than
matmul + softmax + matmul. The backward pass is the same recomputation either way (PyTorch's
fused CPU backward was measured no faster than it). Chunks with a row that may attend to no
key take the unfused path, which defines those rows as zeros on every PyTorch version.

Gradient of top-k attention: the choice of the k kept keys is piecewise constant in the
scores, so it has no gradient; gradients flow through the kept scores as if the selection
were a fixed mask (the same as ``topk`` + ``masked_fill`` under autograd).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..masks import Mask, TopK

__all__ = ["Chunk", "chunked_attention"]

_HALF = (torch.float16, torch.bfloat16)
_SDPA_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


@dataclass(frozen=True)
class Chunk:
    """Query rows ``rows`` (a slice or a 1-D index tensor) and their candidate keys:
    ``range(key_lo, key_hi)`` followed by ``extra`` (positions outside that range)."""

    rows: slice | Tensor
    key_lo: int
    key_hi: int
    extra: Tensor | None = None

    @property
    def n_keys(self) -> int:
        return (self.key_hi - self.key_lo) + (0 if self.extra is None else int(self.extra.numel()))

    def row_index(self, device: torch.device) -> Tensor:
        if isinstance(self.rows, slice):
            return torch.arange(self.rows.start, self.rows.stop, device=device)
        return self.rows.to(device)

    def key_index(self, device: torch.device) -> Tensor:
        keys = torch.arange(self.key_lo, self.key_hi, device=device)
        return keys if self.extra is None else torch.cat([keys, self.extra.to(device)])


def chunked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    plan: list[Chunk],
    mask: Mask | None,
    scale: float,
    *,
    topk: int | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Attention of q (B, H, T, Dk) over k (B, Hkv, S, Dk), v (B, Hkv, S, Dv) following ``plan``.

    ``mask`` is evaluated inside each chunk (it must not contain a top-k; pass ``topk``
    instead). Rows that may attend to nothing give zeros. Returns (B, H, T, Dv).
    """
    seed = int(torch.randint(0, 2**62, (1,)).item()) if dropout_p > 0 else 0
    return _ChunkedAttention.apply(q, k, v, plan, mask, scale, topk, dropout_p, seed)


class _ChunkedAttention(torch.autograd.Function):
    """Forward saves only q, k, v; backward recomputes each chunk's probabilities."""

    @staticmethod
    def forward(ctx, q, k, v, plan, mask, scale, topk, dropout_p, seed):  # type: ignore[override]
        with torch.autocast(q.device.type, enabled=False):
            B, H, T, _ = q.shape
            Dv = v.shape[3]
            out = q.new_zeros(B, H, T, Dv)
            work = _Workspace()
            fused = topk is None and dropout_p == 0 and not (mask is not None and mask.has_bias)
            grouped = _band_groups(plan, mask, q, k) if fused else {}
            skip = 0
            for n, chunk in enumerate(plan):
                if skip:  # computed with an earlier chunk's group
                    skip -= 1
                    continue
                if chunk.n_keys == 0:  # rows that may attend to nothing stay zero
                    continue
                if n in grouped:
                    size, keep = grouped[n]
                    _fused_band_group(q, k, v, plan[n:n + size], keep, scale, out)
                    skip = size - 1
                    continue
                if fused and _fused_chunk(q, k, v, chunk, mask, scale, out):
                    continue
                _, _, vc, rows, p, visible = _probabilities(q, k, v, chunk, mask, scale, topk, work)
                pd = _dropout(p, dropout_p, seed + n)  # (B, Hkv, G·c, W)
                oc = (pd.to(v.dtype) @ vc).view(B, H, -1, Dv)  # (B, H, c, Dv)
                if visible is not None:
                    oc = oc * visible
                out.index_copy_(2, rows, oc)
        ctx.save_for_backward(q, k, v)
        ctx.plan, ctx.mask, ctx.scale, ctx.topk, ctx.dropout_p, ctx.seed = plan, mask, scale, topk, dropout_p, seed
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v = ctx.saved_tensors
        with torch.autocast(q.device.type, enabled=False):
            B, H, _, Dk = q.shape
            Hkv = k.shape[1]
            acc = _compute(q)
            dq = torch.zeros_like(q)
            dk = torch.zeros(k.shape, dtype=acc, device=k.device)
            dv = torch.zeros(v.shape, dtype=acc, device=v.device)
            work = _Workspace()
            for n, chunk in enumerate(ctx.plan):
                if chunk.n_keys == 0:
                    continue
                qc, kc, vc, rows, p, visible = _probabilities(q, k, v, chunk, ctx.mask, ctx.scale, ctx.topk, work)
                doc = dout.index_select(2, rows)  # (B, H, c, Dv)
                if visible is not None:  # rows with no key had their output zeroed
                    doc = doc * visible
                doc = _grouped(doc, Hkv)  # (B, Hkv, G·c, Dv)
                pd = _dropout(p, ctx.dropout_p, ctx.seed + n)  # (B, Hkv, G·c, W)
                dvc = pd.to(v.dtype).transpose(-1, -2) @ doc  # (B, Hkv, W, Dv)
                dp = (doc @ vc.transpose(-1, -2)).to(acc)  # (B, Hkv, G·c, W)
                dp = _dropout(dp, ctx.dropout_p, ctx.seed + n)
                # softmax backward, fused: ds = p ∘ (dp − rowsum(dp ∘ p))
                ds = torch._softmax_backward_data(dp, p, -1, acc).to(q.dtype)  # (B, Hkv, G·c, W)
                dqc = (ds @ kc) * ctx.scale  # (B, Hkv, G·c, Dk)
                dkc = ds.transpose(-1, -2) @ qc  # (B, Hkv, W, Dk)  (qc carries the scale)
                dq.index_copy_(2, rows, dqc.view(B, H, -1, Dk))
                _scatter_keys(dk, dkc, chunk)
                _scatter_keys(dv, dvc, chunk)
        return dq, dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None


class _Workspace:
    """One reusable score buffer per pass: fresh multi-megabyte tensors per chunk would each
    be a new mapping and page faults on the CPU, which cost more than the arithmetic."""

    def __init__(self) -> None:
        self.buffer: Tensor | None = None

    def scores(self, shape: tuple[int, ...], like: Tensor, dtype: torch.dtype) -> Tensor:
        n = 1
        for d in shape:
            n *= d
        if self.buffer is None or self.buffer.numel() < n or self.buffer.dtype != dtype:
            self.buffer = torch.empty(n, dtype=dtype, device=like.device)
        return self.buffer[:n].view(shape)


def _compute(q: Tensor) -> torch.dtype:
    return torch.float32 if q.dtype in _HALF else q.dtype


def _grouped(x: Tensor, Hkv: int) -> Tensor:
    """(B, H, c, X) -> (B, Hkv, G·c, X): query heads that share a key/value head side by side."""
    B, H = x.shape[:2]
    return x.reshape(B, Hkv, (H // Hkv) * x.shape[2], x.shape[3])


def _keys(t: Tensor, chunk: Chunk) -> Tensor:
    part = t[:, :, chunk.key_lo:chunk.key_hi]  # (B, Hkv, range, D), a view
    if chunk.extra is None:
        return part
    return torch.cat([part, t.index_select(2, chunk.extra.to(t.device))], dim=2)  # (B, Hkv, W, D)


def _scatter_keys(acc: Tensor, grad: Tensor, chunk: Chunk) -> None:
    n = chunk.key_hi - chunk.key_lo
    acc[:, :, chunk.key_lo:chunk.key_hi] += grad[:, :, :n]
    if chunk.extra is not None:
        acc.index_add_(2, chunk.extra.to(acc.device), grad[:, :, n:].to(acc.dtype))


#: Most query rows one batched band call takes (its key windows are copied if the kernel wants them contiguous).
GROUP_ROWS = 4096


def _band_groups(plan: list[Chunk], mask: Mask | None, q: Tensor, k: Tensor) -> dict[int, tuple[int, Tensor | None]]:
    """Runs of consecutive band chunks that are the same problem shifted along the diagonal:
    equal rows and key-window width, keys at the same offset from the rows, and the same mask
    inside (checked chunk by chunk, so only truly translation-invariant stretches group).
    Returns {first chunk: (chunks in the run, their shared mask (…, c, W) or None)}; runs of one
    are left to :func:`_fused_chunk`.

    One fused call for a whole run instead of one per chunk: the per-call overhead of a
    128-row chunk is a large share of its arithmetic on the CPU.
    """
    T, S = q.shape[2], k.shape[2]
    groups: dict[int, tuple[int, Tensor | None]] = {}

    def shape_of(chunk: Chunk) -> tuple[int, int, int] | None:
        if not isinstance(chunk.rows, slice) or chunk.extra is not None or chunk.n_keys == 0:
            return None
        return chunk.rows.stop - chunk.rows.start, chunk.key_hi - chunk.key_lo, chunk.key_lo - chunk.rows.start

    def keep_of(chunk: Chunk) -> Tensor | None:
        if mask is None:
            return None
        rows = torch.arange(chunk.rows.start, chunk.rows.stop, device=q.device)
        return mask.mask_mod(rows.view(-1, 1), chunk.key_index(q.device).view(1, -1), T, S)  # (..., c, W)

    n = 0
    while n < len(plan):
        first = shape_of(plan[n])
        if first is None:
            n += 1
            continue
        keep = keep_of(plan[n])
        if keep is not None and not bool(keep.any(-1).all()):  # a row with no key: the unfused path
            n += 1
            continue
        size = 1
        while (n + size < len(plan) and (size + 1) * first[0] <= GROUP_ROWS and shape_of(plan[n + size]) == first
               and plan[n + size].rows.start == plan[n + size - 1].rows.stop):
            other = keep_of(plan[n + size])
            if (keep is None) != (other is None) or (keep is not None and not torch.equal(keep, other)):
                break
            size += 1
        if size > 1:
            groups[n] = (size, keep)
        n += size
    return groups


def _fused_band_group(q: Tensor, k: Tensor, v: Tensor, run: list[Chunk], keep: Tensor | None, scale: float,
                      out: Tensor) -> None:
    """A run of :func:`_band_groups` as one call of PyTorch's fused attention: the g chunks'
    rows side by side as a batch dimension, each against its own key window — overlapping
    strided views of k and v, never gathered — with the one shared mask."""
    B, H, _, Dk = q.shape
    Hkv = k.shape[1]
    g = len(run)
    r0, c = run[0].rows.start, run[0].rows.stop - run[0].rows.start
    W, lo = run[0].key_hi - run[0].key_lo, run[0].key_lo

    def windows(t: Tensor) -> Tensor:  # (B, g, Hkv, W, D): window m starts at key lo + m·c
        sB, sH, sS, sD = t.stride()
        return t.as_strided((B, g, Hkv, W, t.shape[3]), (sB, c * sS, sH, sS, sD), t.storage_offset() + lo * sS)

    if keep is not None and keep.dim() == 4:  # (B|1, H|1, c, W): broadcast over the chunks too
        keep = keep.unsqueeze(1)
    qs = q[:, :, r0:r0 + g * c].reshape(B, H, g, c, Dk).transpose(1, 2)  # (B, g, H, c, Dk)
    ks, vs = windows(k), windows(v)  # (B, g, Hkv, W, Dk), (B, g, Hkv, W, Dv)
    if Hkv != H:  # query heads that share a key/value head are side by side
        if _SDPA_HAS_GQA:
            oc = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=keep, scale=scale, enable_gqa=True)
        else:
            G = H // Hkv
            ks, vs = ks.repeat_interleave(G, dim=2), vs.repeat_interleave(G, dim=2)
            oc = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=keep, scale=scale)
    else:
        oc = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=keep, scale=scale)  # (B, g, H, c, Dv)
    out[:, :, r0:r0 + g * c] = oc.transpose(1, 2).reshape(B, H, g * c, -1)


def _fused_chunk(q: Tensor, k: Tensor, v: Tensor, chunk: Chunk, mask: Mask | None, scale: float,
                 out: Tensor) -> bool:
    """One chunk's output through PyTorch's fused attention, written into ``out`` (B, H, T, Dv).

    Returns False, writing nothing, when a row of the chunk may attend to no key.
    """
    H, T = q.shape[1], q.shape[2]
    Hkv, S = k.shape[1], k.shape[2]
    rows = chunk.row_index(q.device)
    keep = None
    if mask is not None:
        keep = mask.mask_mod(rows.view(-1, 1), chunk.key_index(q.device).view(1, -1), T, S)  # (..., c, W)
        if not bool(keep.any(-1).all()):
            return False
    qc = q[:, :, chunk.rows] if isinstance(chunk.rows, slice) else q.index_select(2, rows)  # (B, H, c, Dk)
    kc, vc = _keys(k, chunk), _keys(v, chunk)  # (B, Hkv, W, Dk), (B, Hkv, W, Dv)
    if Hkv != H:  # query heads that share a key/value head are side by side (see _grouped)
        kc, vc = kc.repeat_interleave(H // Hkv, dim=1), vc.repeat_interleave(H // Hkv, dim=1)
    oc = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=keep, scale=scale)  # (B, H, c, Dv)
    if isinstance(chunk.rows, slice):
        out[:, :, chunk.rows] = oc
    else:
        out.index_copy_(2, rows, oc)
    return True


def _probabilities(q, k, v, chunk: Chunk, mask: Mask | None, scale: float, topk: int | None,
                   work: _Workspace):
    """One chunk's attention probabilities p (B, Hkv, G·c, W), the same in forward and backward.

    ``visible`` (..., c, 1), broadcastable to (B, H, c, 1), is False for rows that may attend
    to no key (their scores are unmasked so the softmax stays finite; the caller zeroes those
    rows), or None when every row has a key.
    """
    B, H, T = q.shape[:3]
    Hkv, S = k.shape[1], k.shape[2]
    device = q.device
    rows = chunk.row_index(device)
    picked = q[:, :, chunk.rows] if isinstance(chunk.rows, slice) else q.index_select(2, rows)  # (B, H, c, Dk)
    qc = _grouped(picked * scale, Hkv)  # (B, Hkv, G·c, Dk)
    kc, vc = _keys(k, chunk), _keys(v, chunk)  # (B, Hkv, W, Dk), (B, Hkv, W, Dv)
    acc = _compute(q)
    c, W = rows.numel(), chunk.n_keys
    if acc == q.dtype:
        s = torch.matmul(qc, kc.transpose(-1, -2), out=work.scores((B, Hkv, qc.shape[2], W), q, acc))
    else:
        s = (qc @ kc.transpose(-1, -2)).to(acc)
    s = s.view(B, H, c, W)  # (B, H, c, W)
    visible = None
    if mask is not None:
        i, j = rows.view(-1, 1), chunk.key_index(device).view(1, -1)
        if mask.has_bias:
            s += mask.bias_mod(i, j, T, S, acc)
        keep = mask.mask_mod(i, j, T, S)  # (..., c, W)
        seen = keep.any(-1, keepdim=True)  # (..., c, 1)
        if not bool(seen.all()):
            visible = seen
            keep = keep | ~seen
        _fill_masked(s, keep)
    if topk is not None:
        s.masked_fill_(~TopK(topk).select(s), float("-inf"))
    if device.type == "cpu":  # in place: no (B, H, c, W) allocation (checked against torch.softmax in tests)
        p = torch.ops.aten._softmax.out(s, -1, False, out=s)
    else:
        p = torch.softmax(s, dim=-1)
    return qc, kc, vc, rows, _grouped(p, Hkv), visible


def _fill_masked(s: Tensor, keep: Tensor) -> None:
    """``s[~keep] = -inf`` in place, touching only the key columns some row may not attend.

    In a band chunk the middle columns are visible to every query of the chunk; only the two
    edges (the band's corners) hold masked entries. Filling just those skips most of the pass.
    """
    W = keep.shape[-1]
    open_cols = keep.reshape(-1, W).all(0)  # (W,) every row and example may attend
    if bool(open_cols.all()):
        return
    lead = int((~open_cols).int().cumprod(0).sum())  # masked columns before the first open one
    trail = int((~open_cols).flip(0).int().cumprod(0).sum())
    if lead == W or not bool(open_cols[lead:W - trail].all()):
        s.masked_fill_(~keep, float("-inf"))
        return
    if lead:
        s[..., :lead].masked_fill_(~keep[..., :lead], float("-inf"))
    if trail:
        s[..., W - trail:].masked_fill_(~keep[..., W - trail:], float("-inf"))


def _dropout(x: Tensor, p: float, seed: int) -> Tensor:
    """Inverted dropout with a pattern fixed by ``seed``, so backward regenerates it."""
    if p <= 0:
        return x
    g = torch.Generator(device=x.device).manual_seed(seed)
    keep = torch.rand(x.shape, generator=g, device=x.device) >= p
    return x * keep / (1.0 - p)
