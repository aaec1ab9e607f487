"""Exact attention computed chunk by chunk over a *key plan*, with memory O(n·w), not O(n²).

A plan is a list of chunks; each chunk is a set of query rows and the keys those rows may
need: a contiguous key range plus an optional list of extra key positions. The planners
(:mod:`.local` for bands and global tokens, :mod:`.sparse` for block layouts) decide which
keys; the mask's own predicate (``Mask.mask_mod``) decides, inside each chunk, exactly which
(query, key) pairs count. Every query row belongs to exactly one chunk.

The forward pass keeps only the output and the log-sum-exp per row (as FlashAttention does);
the backward pass recomputes each chunk's scores, so saved memory is O(n) and temporaries are
one chunk's (B, H, c, W) scores. Top-k selection and attention dropout are recomputed the
same way (the dropout pattern from a per-chunk seed).

Gradient of top-k attention: the choice of the k kept keys is piecewise constant in the
scores, so it has no gradient; gradients flow through the kept scores as if the selection
were a fixed mask (the same as ``topk`` + ``masked_fill`` under autograd).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .masks import Mask, TopK

__all__ = ["Chunk", "chunked_attention"]

_HALF = (torch.float16, torch.bfloat16)


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
    @staticmethod
    def forward(ctx, q, k, v, plan, mask, scale, topk, dropout_p, seed):  # type: ignore[override]
        with torch.autocast(q.device.type, enabled=False):
            B, H, T, _ = q.shape
            Hkv, S, Dv = k.shape[1], k.shape[2], v.shape[3]
            out = q.new_zeros(B, H, T, Dv)
            lse = torch.full((B, H, T), float("inf"), dtype=_compute(q), device=q.device)
            for n, chunk in enumerate(plan):
                if chunk.n_keys == 0:  # rows that may attend to nothing: zeros, lse = +inf
                    continue
                _, _, vc, rows, p, lse_c = _probabilities(q, k, v, chunk, mask, scale, topk, T, S, None)
                pd = _dropout(p, dropout_p, seed + n)
                oc = _grouped(pd.to(v.dtype), Hkv) @ vc  # (B, Hkv, G·c, Dv)
                out.index_copy_(2, rows, oc.view(B, H, -1, Dv))
                lse.index_copy_(2, rows, lse_c.view(B, H, -1))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan, ctx.mask, ctx.scale, ctx.topk, ctx.dropout_p, ctx.seed = plan, mask, scale, topk, dropout_p, seed
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        with torch.autocast(q.device.type, enabled=False):
            B, H, T, Dk = q.shape
            Hkv, S = k.shape[1], k.shape[2]
            acc = _compute(q)
            dq = torch.zeros_like(q)
            dk = torch.zeros(k.shape, dtype=acc, device=k.device)
            dv = torch.zeros(v.shape, dtype=acc, device=v.device)
            dout = dout.contiguous()
            delta = (dout.to(acc) * out.to(acc)).sum(-1)  # (B, H, T)  rowsum(dO ∘ O)
            for n, chunk in enumerate(ctx.plan):
                if chunk.n_keys == 0:
                    continue
                qc, kc, vc, rows, p, _ = _probabilities(q, k, v, chunk, ctx.mask, ctx.scale, ctx.topk, T, S, lse)
                pd = _dropout(p, ctx.dropout_p, ctx.seed + n)  # (B, Hkv, G·c, W)
                doc = _grouped(dout.index_select(2, rows), Hkv)  # (B, Hkv, G·c, Dv)
                dvc = pd.to(v.dtype).transpose(-1, -2) @ doc  # (B, Hkv, W, Dv)
                dp = (doc @ vc.transpose(-1, -2)).to(acc)  # (B, Hkv, G·c, W)
                if ctx.dropout_p > 0:
                    dp = _dropout(dp, ctx.dropout_p, ctx.seed + n)
                d = _grouped(delta.index_select(2, rows).unsqueeze(-1), Hkv)  # (B, Hkv, G·c, 1)
                ds = (p * (dp - d)).to(q.dtype)  # (B, Hkv, G·c, W)
                dqc = (ds @ kc) * ctx.scale  # (B, Hkv, G·c, Dk)
                dkc = ds.transpose(-1, -2) @ qc  # (B, Hkv, W, Dk)  (qc carries the scale)
                dq.index_copy_(2, rows, dqc.view(B, H, -1, Dk))
                _scatter_keys(dk, dkc, chunk)
                _scatter_keys(dv, dvc, chunk)
        return dq, dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None


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


def _probabilities(q, k, v, chunk: Chunk, mask: Mask | None, scale: float, topk: int | None,
                   T: int, S: int, lse: Tensor | None):
    """Scores of one chunk turned into probabilities.

    Forward (``lse`` None): returns p normalised in the chunk and its log-sum-exp.
    Backward: p = exp(s - lse) with the saved log-sum-exp, exactly the forward's p.
    """
    B, H = q.shape[:2]
    Hkv = k.shape[1]
    device = q.device
    rows = chunk.row_index(device)
    keys = chunk.key_index(device)
    qc = _grouped(q.index_select(2, rows) * scale, Hkv)  # (B, Hkv, G·c, Dk)
    kc, vc = _keys(k, chunk), _keys(v, chunk)  # (B, Hkv, W, Dk), (B, Hkv, W, Dv)
    acc = _compute(q)
    c, W = rows.numel(), keys.numel()
    s = (qc @ kc.transpose(-1, -2)).to(acc).view(B, H, c, W)  # (B, H, c, W)
    if mask is not None:
        i, j = rows.view(-1, 1), keys.view(1, -1)
        if mask.has_bias:
            s = s + mask.bias_mod(i, j, T, S, acc)
        s = s.masked_fill(~mask.mask_mod(i, j, T, S), float("-inf"))
    if topk is not None:
        s = s.masked_fill(~TopK(topk).select(s), float("-inf"))
    if lse is not None:
        p = torch.exp(s - lse.index_select(2, rows).unsqueeze(-1))  # (B, H, c, W); lse=+inf rows -> 0
        return qc, kc, vc, rows, _grouped(p, Hkv), None
    m = s.amax(-1, keepdim=True)  # (B, H, c, 1)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # rows with no key: avoid -inf - -inf
    p = torch.exp(s - m)  # (B, H, c, W), 0 where masked
    total = p.sum(-1, keepdim=True)  # (B, H, c, 1)
    p = p / total.clamp_min(torch.finfo(acc).tiny)
    lse_c = torch.where(total > 0, m + total.log(), torch.full_like(m, float("inf"))).squeeze(-1)  # (B, H, c)
    return qc, kc, vc, rows, _grouped(p, Hkv), lse_c


def _dropout(x: Tensor, p: float, seed: int) -> Tensor:
    """Inverted dropout with a pattern fixed by ``seed``, so backward regenerates it."""
    if p <= 0:
        return x
    g = torch.Generator(device=x.device).manual_seed(seed)
    keep = torch.rand(x.shape, generator=g, device=x.device) >= p
    return x * keep / (1.0 - p)
