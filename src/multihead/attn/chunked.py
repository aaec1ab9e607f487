"""Exact attention computed chunk by chunk over a *key plan*, with memory O(n·w), not O(n²).

A plan is a list of chunks; each chunk is a set of query rows and the keys those rows may
need: a contiguous key range plus an optional list of extra key positions. The planner
(:func:`multihead.attn.plans.plan_chunks`, from the mask's ``Cover``: bands, global tokens, block
layouts) decides which keys; the mask's own predicate (``Mask.mask_mod``) decides, inside each chunk, exactly which
(query, key) pairs count. Every query row belongs to exactly one chunk.

The forward pass keeps nothing but q, k and v; the backward pass recomputes each chunk's
probabilities (as FlashAttention does), so saved memory is O(n) and temporaries are one
chunk's (B, H, c, W) scores. Top-k selection and attention dropout are recomputed the
same way (the dropout pattern from a per-chunk seed).

Without top-k, dropout or an additive bias, the forward pass hands each chunk, with the
chunk's mask as an additive 0 / -inf tensor (built once per pattern for a relative mask such as a
window), to ``F.scaled_dot_product_attention``: PyTorch's fused kernel never
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
from .precision import as_half_product, compute_dtype, half_matmul, score_operands

__all__ = ["Chunk", "chunked_attention", "fusable"]


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
    forward_plan: list[Chunk] | None = None,
) -> Tensor:
    """Attention of q (B, H, T, Dk) over k (B, Hkv, S, Dk), v (B, Hkv, S, Dv) following ``plan``.

    ``mask`` is evaluated inside each chunk (it must not contain a top-k; pass ``topk``
    instead). Rows that may attend to nothing give zeros. ``forward_plan``: other chunks for the
    forward pass (any plan gives the same numbers; the best chunk size differs between the fused
    forward and the recomputing backward). Returns (B, H, T, Dv).
    """
    seed = int(torch.randint(0, 2**62, (1,)).item()) if dropout_p > 0 else 0
    return _ChunkedAttention.apply(q, k, v, plan, mask, scale, topk, dropout_p, seed, forward_plan or plan)


def fusable(mask: Mask | None, topk: int | None, dropout_p: float) -> bool:
    """Whether the forward pass may hand chunks to PyTorch's fused kernel: no top-k, no dropout,
    no additive bias (the kernel sees a 0 / -inf mask only)."""
    return topk is None and dropout_p == 0 and not (mask is not None and mask.has_bias)


class _ChunkedAttention(torch.autograd.Function):
    """Forward saves only q, k, v; backward recomputes each chunk's probabilities."""

    @staticmethod
    def forward(ctx, q, k, v, plan, mask, scale, topk, dropout_p, seed, forward_plan):  # type: ignore[override]
        with torch.autocast(q.device.type, enabled=False):
            B, H, T, _ = q.shape
            Dv = v.shape[3]
            out = q.new_zeros(B, H, T, Dv)
            work = _Workspace()
            fused = fusable(mask, topk, dropout_p)
            patterns: dict[tuple[int, int, int], Tensor | None] = {}
            for n, chunk in enumerate(forward_plan):
                if chunk.n_keys == 0:  # rows that may attend to nothing stay zero
                    continue
                if fused and _fused_chunk(q, k, v, chunk, mask, scale, out, patterns):
                    continue
                _, _, vc, rows, p, visible = _probabilities(q, k, v, chunk, mask, scale, topk, work)
                pd = _dropout(p, dropout_p, seed + n)  # (B, Hkv, G·c, W)
                oc = half_matmul(pd.to(v.dtype), vc).view(B, H, -1, Dv)  # (B, H, c, Dv)
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
            acc = compute_dtype(q)
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
                dvc = half_matmul(pd.to(v.dtype).transpose(-1, -2), doc)  # (B, Hkv, W, Dv)
                dp = half_matmul(doc, vc.transpose(-1, -2)).to(acc)  # (B, Hkv, G·c, W)
                dp = _dropout(dp, ctx.dropout_p, ctx.seed + n)
                # softmax backward, fused: ds = p ∘ (dp − rowsum(dp ∘ p))
                ds = torch._softmax_backward_data(dp, p, -1, acc).to(q.dtype)  # (B, Hkv, G·c, W)
                dqc = half_matmul(ds, kc) * ctx.scale  # (B, Hkv, G·c, Dk)
                dkc = half_matmul(ds.transpose(-1, -2), qc)  # (B, Hkv, W, Dk)  (qc carries the scale)
                dq.index_copy_(2, rows, dqc.view(B, H, -1, Dk))
                _scatter_keys(dk, dkc, chunk)
                _scatter_keys(dv, dvc, chunk)
        return dq, dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None, None


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


def _fused_chunk(q: Tensor, k: Tensor, v: Tensor, chunk: Chunk, mask: Mask | None, scale: float,
                 out: Tensor, patterns: dict[tuple[int, int, int], Tensor | None]) -> bool:
    """One chunk's output through PyTorch's fused attention, written into ``out`` (B, H, T, Dv).

    Returns False, writing nothing, when a row of the chunk may attend to no key. ``patterns``
    keeps the additive masks of a relative mask (:attr:`Mask.relative`) by the chunk's offset to
    its keys: every interior chunk of a band has the same one, built once instead of evaluated
    and converted for each chunk (the per-chunk bool mask cost the forward ~20 %).
    """
    H, T = q.shape[1], q.shape[2]
    Hkv, S = k.shape[1], k.shape[2]
    rows = chunk.row_index(q.device)
    additive = None
    if mask is not None:
        key = None
        if mask.relative and isinstance(chunk.rows, slice) and chunk.extra is None:
            key = (chunk.rows.start + S - T - chunk.key_lo, chunk.rows.stop - chunk.rows.start, chunk.n_keys)
        if key is not None and key in patterns:
            additive = patterns[key]
        else:
            keep = mask.mask_mod(rows.view(-1, 1), chunk.key_index(q.device).view(1, -1), T, S)  # (..., c, W)
            if bool(keep.any(-1).all()):
                additive = torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill_(~keep, float("-inf"))
            if key is not None:
                patterns[key] = additive
        if additive is None:
            return False
    qc = q[:, :, chunk.rows] if isinstance(chunk.rows, slice) else q.index_select(2, rows)  # (B, H, c, Dk)
    kc, vc = _keys(k, chunk), _keys(v, chunk)  # (B, Hkv, W, Dk), (B, Hkv, W, Dv)
    if Hkv != H:  # query heads that share a key/value head are side by side (see _grouped)
        kc, vc = kc.repeat_interleave(H // Hkv, dim=1), vc.repeat_interleave(H // Hkv, dim=1)
    # an additive mask: the fused kernel converts a bool one to this on every call
    oc = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=additive, scale=scale)  # (B, H, c, Dv)
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
    acc = compute_dtype(q)
    c, W = rows.numel(), chunk.n_keys
    # without top-k, scores in the accumulation dtype on every device, as the fused forward's chunks (SDPA)
    # hold them: the backward recomputes these probabilities, and half scores rounded (bfloat16's step is
    # 0.25 at 50) made them another softmax than the forward's — gradients 10-40x worse than SDPA's where a
    # head's logits share an offset (float16's dk 220 against 1.9). Top-k selects among them as the math
    # kernel rounds them (float32 products on a CPU for half inputs: W changes every chunk).
    qs, ks = (qc.to(acc), kc.to(acc)) if topk is None else score_operands(qc, kc, half_product=False)
    if qs.dtype == acc:
        s = torch.matmul(qs, ks.transpose(-1, -2), out=work.scores((B, Hkv, qc.shape[2], W), q, acc))
        if topk is not None:
            s = as_half_product(s, q.dtype)  # (B, Hkv, G·c, W)
    else:
        s = (qs @ ks.transpose(-1, -2)).to(acc)
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
    # in place on a CPU: no (B, H, c, W) allocation (checked against torch.softmax in tests); not while
    # torch.compile traces (Inductor cannot generate code for the out= softmax: KeyError 'buf1')
    if device.type == "cpu" and not torch.compiler.is_compiling():
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
