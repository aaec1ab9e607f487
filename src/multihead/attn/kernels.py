"""The attention kernel: ``attention(q, k, v, mask, ...) -> (out, weights | None)``.

Backends:

* ``"math"``  — the readable reference: ``softmax(q·kᵀ·scale + mask)·v``. It is the oracle
  every other path is tested against, and the only one that returns weights.
* ``"sdpa"``  — ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch's fused
  flash / memory-efficient / CPU-flash kernels).
* ``"auto"``  — the fastest exact path for the request; :func:`explain_backend` says which
  one and why the others were not taken.

Shapes: q (B, H, T, Dk); k (B, Hkv, S, Dk); v (B, Hkv, S, Dv), with Hkv dividing H
(grouped-query attention; Hkv = 1 is multi-query). out is (B, H, T, Dv); weights
(B, H, T, S).

A query row whose every key is masked yields zeros in ``out`` and in ``weights`` (never
NaN), in every dtype. Half-precision inputs are soft-maxed in float32. On a CPU with AVX-512 or AVX2,
without a gradient, the math path's softmax (with its mask, and for half inputs the casts around it)
is one compiled pass a row (:mod:`.fused`; the eager steps stay the reference it is tested against),
and on a CPU with AMX a bfloat16 attention's products run on the tiles around it, 16 rows at a time.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..masks import FULL, Causal, Mask, TopK, as_mask, split_topk
from . import fused, gemm, precision
from .autodiff import differentiated
from .chunked import chunked_attention, fusable
from .cpu_trace import runs_as_cpu
from .dispatch import BACKENDS, BackendChoice, choose
from .memory import check_memory, estimate_memory
from .plans import plan_chunks
from .precision import HALF, as_half_product, compute_dtype, half_matmul, key_grid, raised_dtype, score_operands
from .workspace import Workspace

__all__ = ["BACKENDS", "BackendChoice", "attention", "explain_backend"]

_SDPA_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask | Tensor | None = None,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    backend: str = "auto",
    softcap: float | None = None,
    sinks: Tensor | None = None,
    weights_dtype: torch.dtype | None = None,
    workspace: Workspace | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention over heads.

    Args:
        q: (B, H, T, Dk) queries.
        k: (B, Hkv, S, Dk) keys; Hkv must divide H (each group of H/Hkv query heads
            shares one key/value head).
        v: (B, Hkv, S, Dv) values.
        mask: a :class:`~multihead.masks.Mask`, a tensor broadcastable to (B, H, T, S)
            (bool: True = may attend; float: additive bias, ``-inf`` = may not attend),
            or None.
        scale: multiplier of q·kᵀ; default 1/sqrt(Dk).
        dropout_p: dropout on the attention weights (applied only when > 0; callers pass
            0 in eval mode).
        need_weights: also return the per-head attention weights (B, H, T, S).
        backend: one of :data:`BACKENDS`: "auto", "math", "sdpa", or the chunked kernels
            "local" (bands, global tokens), "sparse" (block layouts), "topk".
        softcap: cap the scores smoothly at ±softcap before the mask: ``softcap·tanh(s/softcap)``
            (Gemma 2's logit soft-capping). Math path only.
        sinks: (H,) learned sink logits (GPT-OSS, StreamingLLM-style sinks): each row's softmax
            gets one extra logit that takes probability mass and is then dropped, so a row's
            weights sum to less than 1. Math path only.
        weights_dtype: the dtype of the returned weights (default q's). Half-precision inputs are
            soft-maxed in float32; ``torch.float32`` hands over that result as it is — what the
            analyses read — while P·V still uses the weights rounded to v's dtype, as
            transformers' eager attention does.
        workspace: buffers of a caller that streams chunks through the math kernel without
            gradients (:class:`~multihead.attn.workspace.Workspace`): its scores and weights are
            made in them, reused call after call — the weights returned then live there until
            the next call with the same workspace (and the rows' entropies it asked for, where
            the softmax formed them, in its ``entropy``). Ignored by the other backends and when a
            gradient is wanted.

    Returns:
        ``(out, weights)``: out (B, H, T, Dv) in q's dtype; weights (B, H, T, S) before
        dropout, or None when ``need_weights`` is False.

    Raises:
        AttentionMemoryError: the chosen kernel would need more memory than is available
            (the message gives the estimate and what to change).
    """
    mask = as_mask(mask)
    if workspace is not None:
        workspace.entropy = None  # set again only by a path that forms it (the compiled softmax)
    _check_inputs(q, k, v, scale, dropout_p)
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be a positive number; got {softcap!r}")
    if sinks is not None and (sinks.dim() != 1 or sinks.shape[0] != q.shape[1]):
        raise ValueError(f"sinks must be one logit per query head, ({q.shape[1]},); got {tuple(sinks.shape)}")
    extras = [name for name, value in (("softcap", softcap), ("sinks", sinks)) if value is not None]
    choice = choose(q, k, mask, need_weights, "math" if extras and backend == "auto" else backend)
    if extras and choice.backend != "math":
        raise ValueError(f"{' and '.join(extras)} need backend='math' (the fused and chunked kernels do not "
                         f"implement them); got backend={backend!r}")
    if 0 in (q.shape[0], q.shape[1], q.shape[2], k.shape[2]):
        if mask is not None:  # its shape checked as for any batch: on its first row and key, no (T, S) grid made
            T, S = q.shape[2], k.shape[2]
            mask.mask_mod(torch.arange(min(T, 1)).view(-1, 1), torch.arange(min(S, 1)).view(1, -1), T, S)
        return _nothing_to_attend(q, k, v, need_weights, weights_dtype)
    if not torch.compiler.is_compiling():  # traced once for a range of shapes (symbols): checked by eager calls
        check_memory(estimate_memory(q, k, v, mask, need_weights=need_weights, backend=choice.backend))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if choice.backend == "math":
        out, weights = _math_attention(q, k, v, mask, scale, dropout_p, softcap=softcap, sinks=sinks,
                                       workspace=workspace)
        return out, (weights.to(weights_dtype or q.dtype) if need_weights else None)
    if choice.backend == "sdpa":
        return _sdpa_attention(q, k, v, mask, scale, dropout_p), None
    top, rest = split_topk(mask)
    cover = FULL if rest is None else rest.cover(q.shape[2], k.shape[2])
    plan = plan_chunks(cover, q.shape[2], k.shape[2], B=q.shape[0], H=q.shape[1])
    forward_plan = plan
    if fusable(rest, top, dropout_p):
        forward_plan = plan_chunks(cover, q.shape[2], k.shape[2], B=q.shape[0], H=q.shape[1], fused=True)
    return chunked_attention(q, k, v, plan, rest, scale, topk=top, dropout_p=dropout_p,
                             forward_plan=forward_plan), None


def explain_backend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask | Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    backend: str = "auto",
) -> BackendChoice:
    """Say which backend :func:`attention` would use for these arguments, and why."""
    mask = as_mask(mask)
    _check_inputs(q, k, v, None, dropout_p)
    return choose(q, k, mask, need_weights, backend)


# --------------------------------------------------------------------------- backends


def _math_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Mask | None, scale: float, dropout_p: float, *,
    softcap: float | None = None, sinks: Tensor | None = None, workspace: Workspace | None = None,
) -> tuple[Tensor, Tensor]:
    B, H, T, _ = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = H // Hkv  # grouped-query: query heads kv·G .. kv·G + G - 1 share key/value head kv
    compute = compute_dtype(q)
    if workspace is not None and torch.is_grad_enabled():
        workspace = None  # autograd keeps what it saves (of q, k, v, or a mask's bias): no buffer reused under it
    take = _Take(workspace, q.device)
    if _tiles_apply(q, k, v, mask, softcap, sinks, dropout_p):
        return _tiles_attention(q, k, v, mask, scale, take, (B, H, T, S))
    # The G query heads of a group are stacked as G·T rows against their one key head, so keys
    # and values are never copied G times.
    q3, k3 = q.reshape(B * Hkv, G * T, -1), k.reshape(B * Hkv, S, -1)  # views when contiguous
    q3, k3 = score_operands(q3, k3)  # float32 on a CPU without half units (see precision.score_operands)
    grid = key_grid(k3, S)  # a half product on a CPU over a few key counts only (see precision.key_grid)
    if grid != S:
        k3 = take.padded("keys", k3, grid)  # (B·Hkv, grid, Dk): zero keys, their scores dropped below
    # A power-of-two scale (head dims 16, 64, 256…) scales q exactly: one pass over (G·T, Dk), not
    # (G·T, S). Any other scales the product, as the reference implementations round it. (baddbmm's
    # alpha would cost no pass at all, but MKL's baddbmm runs at half bmm's speed once S nears 4k.)
    if _power_of_two(scale):  # scores (B·Hkv, G·T, S) in each branch
        product = take.bmm("product", q3 * scale, k3.transpose(1, 2))  # (B·Hkv, G·T, grid)
        scores = as_half_product(product[..., :S], q.dtype)
    elif q3.dtype != q.dtype:  # float32 operands of half inputs: the product rounded, then its scaling, as eager's
        product = take.bmm("product", q3, k3.transpose(1, 2))
        scores = as_half_product(product[..., :S], q.dtype, scale)
    else:
        product = take.bmm("product", q3, k3.transpose(1, 2))
        scores = product[..., :S]
        scores = scores.mul_(scale) if not scores.requires_grad else scores * scale  # (B·Hkv, G·T, S)
    if _compiled_softmax_applies(product, S, mask, softcap, sinks, dropout_p):
        return _compiled_softmax_attention(product, v, mask, take, (B, H, T, S))
    scores = take.cast("weights", scores.view(B, H, T, S), compute)  # (B, H, T, S), float32 for half inputs
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)  # (B, H, T, S) within ±softcap
    visible = None
    top, mask = split_topk(mask)
    if mask is not None:
        keep, visible, bias = _dense_mask(mask, B, H, T, S, q.device, compute)
        inplace = not scores.requires_grad and not torch.compiler.is_compiling()
        if bias is not None:
            scores = scores.add_(bias) if inplace and scores.shape == torch.broadcast_shapes(scores.shape, bias.shape) \
                else scores + bias  # (B, H, T, S)
        if inplace:  # the scores are fresh: fill them where they stand, and only past the keys every row sees
            seen = _seen_by_every_row(keep) if scores.device.type == "cpu" else 0  # a GPU fills faster than it syncs
            scores[..., seen:].masked_fill_(~keep[..., seen:], float("-inf"))
        else:
            scores = scores.masked_fill(~keep, float("-inf"))
    if top is not None:  # keep each row's k largest allowed scores
        scores = scores.masked_fill(~TopK(top).select(scores), float("-inf"))  # (B, H, T, S)
    if sinks is not None:  # one extra logit per head joins each row's softmax, then leaves with its mass
        sink = sinks.to(compute).view(1, H, 1, 1).expand(B, H, T, 1)  # (B, H, T, 1)
        weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :S]  # (B, H, T, S)
    elif differentiated(scores) or scores.device.type != "cpu" or torch.compiler.is_compiling():
        weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
    else:
        # No autograd graph: soft-max the fresh scores in place. On the CPU this skips a
        # (B, H, T, S) allocation and its page faults, about 3x faster for long inputs.
        weights = torch.ops.aten._softmax.out(scores, -1, False, out=scores)  # (B, H, T, S)
    # Rows that may see no key: zeros, not uniform (the check spares the CPU a pass; a GPU fills faster than it syncs).
    if visible is not None and (weights.device.type != "cpu" or not bool(visible.all())):
        weights = weights.masked_fill(~visible, 0.0)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    grouped = dropped.reshape(B * Hkv, G * T, S)  # (B·Hkv, G·T, S)
    values, grid = _values_on_grid(v, take)  # (B·Hkv, grid, Dv)
    if grid == S:
        grouped = take.cast("half weights", grouped, v.dtype)
    elif grouped.requires_grad:
        grouped = F.pad(grouped.to(v.dtype), (0, grid - S))
    else:  # the weights in the model's dtype beside zero weights for the padding keys: one pass
        padded = take("half weights", (B * Hkv, G * T, grid), v.dtype)  # (B·Hkv, G·T, grid)
        padded[..., S:].zero_()
        padded[..., :S].copy_(grouped)
        grouped = padded
    out = half_matmul(grouped, values).view(B, H, T, -1)  # (B, H, T, Dv); float32 sums on a CPU without half units
    return out, weights  # weights in the softmax's dtype (float32 for half-precision inputs)


def _compiled_softmax_applies(product: Tensor, keys: int, mask: Mask | None, softcap: float | None,
                              sinks: Tensor | None, dropout_p: float) -> bool:
    """Whether a chunk's softmax may take the compiled pass (:mod:`.fused`): the final scores in
    ``product`` — half ones formed in their dtype on a CPU with units for it, or float32 ones over
    exactly ``keys`` keys (a float32 model's, or a half model's rounded in place) — no gradient, and
    nothing between the scores and the softmax but a mask that only hides keys — on the CPU, or on
    ``meta`` in a memory plan's trace of a CPU run (:func:`~.cpu_trace.traced_as_cpu`), which then
    holds the buffers this path holds, not the eager path's masked copies."""
    return ((product.dtype in HALF or (product.dtype == torch.float32 and product.shape[-1] == keys))
            and runs_as_cpu(product.device) and not differentiated(product)
            and _only_hides_keys(mask, softcap, sinks, dropout_p) and fused.available())


def _only_hides_keys(mask: Mask | None, softcap: float | None, sinks: Tensor | None, dropout_p: float) -> bool:
    """Whether nothing stands between the scores and the softmax but a mask that only hides keys (no
    bias, no top-k, no softcap, sinks or dropout), and a compiled C pass may run: not under
    ``torch.compile`` or a trace (a ctypes call is invisible to one: it would record empty weights)."""
    return (softcap is None and sinks is None and dropout_p == 0 and not torch.compiler.is_compiling()
            and not torch.jit.is_tracing() and (mask is None or (not mask.has_bias and split_topk(mask)[0] is None)))


def _power_of_two(scale: float) -> bool:
    """Whether ``scale`` is a power of two: it then scales q exactly, one pass over (G·T, Dk), not (G·T, S)."""
    return math.frexp(scale)[0] == 0.5


def _kept(mask: Mask | None, shape: tuple[int, int, int, int], device: torch.device) -> Tensor | None:
    """The keys each row may see, as the compiled passes read them: ``mask`` made a (..., T, S) bool
    tensor broadcastable to ``shape`` (B, H, T, S), or None for no mask."""
    if mask is None:
        return None
    keep = mask.materialize(shape[2], shape[3], device=device)  # (..., T, S) bool
    _check_broadcast("mask", keep.shape, shape)
    return keep


def _entropy_buffer(take: _Take, shape: tuple[int, int, int]) -> Tensor | None:
    """Where a compiled pass writes each row's entropy (B, H, T) float32 — a workspace's buffer, when its
    caller asked for them — or None."""
    workspace = take.workspace
    if workspace is None or not workspace.wants_entropy:
        return None
    return take("entropy", shape, torch.float32, map_shaped=False)  # (B, H, T)


def _tiles_apply(q: Tensor, k: Tensor, v: Tensor, mask: Mask | None, softcap: float | None, sinks: Tensor | None,
                 dropout_p: float) -> bool:
    """Whether the whole attention may take the AMX tiles (:func:`~.fused.attend`): bfloat16 operands
    on a CPU with the tiles whose head dimensions fill them, no derivative, and nothing between the
    scores and the softmax but a mask that only hides keys."""
    return (runs_as_cpu(q.device) and q.shape[2] > 0 and k.shape[2] > 0
            and not any(differentiated(t) for t in (q, k, v)) and _only_hides_keys(mask, softcap, sinks, dropout_p)
            and fused.tiles_fit(q, k, v)
            and precision.half_units(q.dtype))  # as the products' path takes them: in bfloat16's own units


def _tiles_attention(q: Tensor, k: Tensor, v: Tensor, mask: Mask | None, scale: float, take: _Take,
                     shape: tuple[int, int, int, int]) -> tuple[Tensor, Tensor]:
    """:func:`_math_attention` on the AMX tiles, 16 query rows at a time (:func:`~.fused.attend`):
    the same scores, float32 weights and output as the oneDNN products and the compiled softmax give
    (up to the order of the products' float32 sums), without the chunk's scores and half weights in
    memory. (out (B, H, T, Dv), float32 weights (B, H, T, S))."""
    B, H, T, S = shape
    Hkv, Dk, Dv = k.shape[1], q.shape[-1], v.shape[-1]
    G = H // Hkv
    exact = _power_of_two(scale)  # q scaled exactly, as the products' path does
    q3 = q.reshape(B * Hkv, G * T, Dk)  # (B·Hkv, G·T, Dk): the G query heads of a key head stacked
    # contiguous, as the tiles read it: where each key head has one query head (G = 1) the reshape of a
    # model's (B, T, H, Dk).transpose(1, 2) is a strided view, and a product keeps its operand's strides
    q3 = torch.mul(q3, scale, out=torch.empty(q3.shape, dtype=q3.dtype, device=q3.device)) if exact else \
        q3.contiguous()
    keep = _kept(mask, shape, q.device)  # (..., T, S) bool or None
    weights = take("weights", (B, H, T, S), torch.float32)  # (B, H, T, S)
    out = torch.empty(B * Hkv, G * T, Dv, dtype=v.dtype, device=q.device)  # (B·Hkv, G·T, Dv): the caller's
    layer = _whole_layer(take.workspace, k, v)  # a streamed layer's whole (key, value): packed once for its chunks
    packed = 0 if layer is None else layer[0].shape[2]
    sizes = fused.packed_sizes(B * Hkv, max(S, packed), Dk, Dv)
    packed_keys = take("packed keys", sizes[:1], k.dtype, map_shaped=False)
    packed_values = take("packed values", sizes[1:], v.dtype, map_shaped=False)
    if layer is None:
        k3 = k.reshape(B * Hkv, S, Dk).contiguous()  # (B·Hkv, S, Dk)
        v3 = v.reshape(B * Hkv, S, Dv).contiguous()  # (B·Hkv, S, Dv)
        if take.workspace is not None:  # this call packs its own operands into the buffers: no layer's any more
            take.workspace.packed = None
    else:
        k3, v3 = k, v  # not read: the packs hold them
        if take.workspace.packed is not layer:  # the layer's first chunk
            whole_k = layer[0].reshape(B * Hkv, packed, Dk).contiguous()  # (B·Hkv, S_layer, Dk)
            whole_v = layer[1].reshape(B * Hkv, packed, Dv).contiguous()  # (B·Hkv, S_layer, Dv)
            if q.device.type != "meta":
                fused.pack(whole_k, whole_v, packed_keys, packed_values)
            del whole_k, whole_v
            take.workspace.packed = layer
    parts = fused.attend_parts(G * T, S, B * Hkv)
    scratch = take("tiles", (parts * fused.tile_buffers(S, Dk),), torch.bfloat16, map_shaped=False)  # the threads'
    entropy = _entropy_buffer(take, (B, H, T))  # (B, H, T) or None
    if q.device.type != "meta":  # a memory plan's trace: the buffers only
        fused.attend(q3, k3, v3, 1.0 if exact else scale, S, weights, out, packed_keys, packed_values, scratch, keep,
                     entropy, packed)
    if entropy is not None:
        take.workspace.entropy = entropy
    return out.view(B, H, T, Dv), weights


def _whole_layer(workspace: Workspace | None, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor] | None:
    """The streamed layer's whole (key, value) a workspace names (:attr:`~.workspace.Workspace.layer`)
    where k and v (B, Hkv, S, D) are their first S keys — views of the same memory — else None."""
    layer = None if workspace is None else workspace.layer
    if layer is None:
        return None

    def first_keys(part: Tensor, whole: Tensor) -> bool:  # one storage (on meta too, where every address is 0)
        return (part.untyped_storage()._cdata == whole.untyped_storage()._cdata
                and part.storage_offset() == whole.storage_offset()
                and part.dtype == whole.dtype and part.device == whole.device
                and part.stride() == whole.stride() and part.shape[:2] == whole.shape[:2]
                and part.shape[3] == whole.shape[3] and part.shape[2] <= whole.shape[2])

    return layer if first_keys(k, layer[0]) and first_keys(v, layer[1]) else None


def _compiled_softmax_attention(product: Tensor, v: Tensor, mask: Mask | None, take: _Take,
                                shape: tuple[int, int, int, int]) -> tuple[Tensor, Tensor]:
    """The rest of :func:`_math_attention` for the scores ``product`` (B·Hkv, G·T, grid) through
    the compiled softmax, which reads the mask itself (rows that may see no key: zeros): (out,
    float32 weights). Float32 scores are soft-maxed in place, as the eager path does; P·V takes the
    weights rounded to a half model's dtype, or the float32 ones themselves."""
    B, H, T, S = shape
    Hkv = v.shape[1]
    keep = _kept(mask, shape, product.device)  # (..., T, S) bool or None
    if product.dtype == torch.float32:
        weights = product.view(B, H, T, S)  # (B, H, T, S): in place
    else:
        weights = take("weights", (B, H, T, S), torch.float32)  # (B, H, T, S)
    values, grid = _values_on_grid(v, take)  # (B·Hkv, grid, Dv)
    half = None  # a float32 model's P·V takes the float32 weights (q, k, v share a dtype; no grid for float32)
    if v.dtype in HALF:
        half = take("half weights", (B * Hkv, (H // Hkv) * T, grid), v.dtype)  # (B·Hkv, G·T, grid)
    entropy = _entropy_buffer(take, (B, H, T))  # (B, H, T) or None
    if product.device.type != "meta":  # a memory plan's trace: the buffers only
        fused.softmax(product, S, weights, half, keep, entropy)
    if entropy is not None:
        take.workspace.entropy = entropy
    taken = weights.view(B * Hkv, (H // Hkv) * T, S) if half is None else half  # (B·Hkv, G·T, grid)
    return half_matmul(taken, values).view(B, H, T, -1), weights  # (B, H, T, Dv), (B, H, T, S)


def _values_on_grid(v: Tensor, take: _Take) -> tuple[Tensor, int]:
    """v (B, Hkv, S, Dv) as P·V takes it, (B·Hkv, grid, Dv) — zero values for the keys the half
    product was padded with (:func:`~.precision.key_grid`) — and that grid."""
    B, Hkv, S, Dv = v.shape
    values = v.reshape(B * Hkv, S, Dv)  # a view when contiguous
    grid = key_grid(v, S)
    return (values if grid == S else take.padded("values", values, grid)), grid


class _Take:
    """The math kernel's large tensors made fresh, or — with a :class:`Workspace`, which
    :func:`_math_attention` only keeps when no gradient is wanted — in its buffers."""

    def __init__(self, workspace: Workspace | None, device: torch.device) -> None:
        self.workspace, self.device = workspace, device

    def __call__(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, map_shaped: bool = True) -> Tensor:
        if self.workspace is None:
            return torch.empty(shape, dtype=dtype, device=self.device)
        return self.workspace.take(name, shape, dtype, self.device, map_shaped=map_shaped)

    def bmm(self, name: str, a: Tensor, b: Tensor) -> Tensor:
        """a @ b (N, n, m) — into a buffer when there is a workspace."""
        if self.workspace is None:
            return gemm.bmm(a, b)
        return gemm.bmm(a, b, out=self(name, (a.shape[0], a.shape[1], b.shape[2]), a.dtype))

    def cast(self, name: str, t: Tensor, dtype: torch.dtype) -> Tensor:
        """``t.to(dtype)`` — into a buffer when there is a workspace."""
        if t.dtype == dtype or self.workspace is None:
            return t.to(dtype)
        return self(name, tuple(t.shape), dtype).copy_(t)

    def padded(self, name: str, t: Tensor, n: int) -> Tensor:
        """t (N, S, D) with zero rows after its S: (N, n, D)."""
        if self.workspace is None:
            return F.pad(t, (0, 0, 0, n - t.shape[1]))
        out = self(name, (t.shape[0], n, t.shape[2]), t.dtype, map_shaped=False)
        out[:, :t.shape[1]].copy_(t)
        out[:, t.shape[1]:].zero_()
        return out


def _seen_by_every_row(keep: Tensor) -> int:
    """How many leading key columns of ``keep`` (..., T, S) no row masks: a causal chunk's
    past, which a fill need not touch."""
    blocked = ~keep.reshape(-1, keep.shape[-1]).all(0)  # (S,)
    return int(blocked.float().argmax()) if bool(blocked.any()) else keep.shape[-1]


def _sdpa_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Mask | None, scale: float, dropout_p: float,
    half: torch.dtype | None = None,
) -> Tensor:
    """``half``: the half dtype float32 operands stand for (their mask's bias is rounded to it)."""
    slow = raised_dtype(q)
    if slow is not None and half is None and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        # PyTorch's CPU flash backward in half precision without the units (the model's own dtype, or
        # autocast's) is its slow path: on an AVX2 AMD EPYC (B 1, 9 heads of 3 key/value heads, causal)
        # 0.30 s at 1,024 tokens and 3.5 s at 4,096 against 0.055 s and 0.61 s in float32. The operands
        # are exact in float32, a mask's bias is rounded as the half kernel rounds it, and the output is
        # rounded once to the half dtype, within a unit of the half kernel's own (whose softmax is
        # float32 too); autocast is off inside, or it would cast them back.
        with torch.autocast(q.device.type, enabled=False):
            wide = (t.to(slow).float() for t in (q, k, v))  # under autocast: its casts, then raised
            out = _sdpa_attention(*wide, mask, scale, dropout_p, half=slow)
        return out.to(slow)
    T, S = q.shape[2], k.shape[2]
    gqa = k.shape[1] != q.shape[1]
    if gqa and not _SDPA_HAS_GQA:  # torch < 2.5
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, H, S, Dk)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)  # (B, H, S, Dv)
        gqa = False
    kwargs = {"enable_gqa": True} if gqa else {}
    if mask is None or (isinstance(mask, Causal) and T == S):
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=mask is not None, scale=scale, **kwargs
        )
    bias_dtype = torch.float32 if q.dtype in HALF else q.dtype
    keep, visible, bias = _dense_mask(mask, q.shape[0], q.shape[1], T, S, q.device, bias_dtype)
    attn_mask: Tensor = keep
    if bias is not None:
        rounding = q.dtype if q.dtype in HALF else half
        if rounding is not None:  # a float32 bias such as -1e9 would overflow to -inf in half precision
            bias = bias.clamp(min=torch.finfo(rounding).min).to(rounding).to(q.dtype)
        attn_mask = bias.masked_fill(~keep, float("-inf"))
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale, **kwargs
    )  # (B, H, T, Dv)
    return out.masked_fill(~visible, 0.0)


def _dense_mask(
    mask: Mask, B: int, H: int, T: int, S: int, device: torch.device, bias_dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Dense (keep, visible, bias) for the dense kernels, validated against (B, H, T, S).

    ``visible`` (..., T, 1) is False for query rows that may attend to no key at all; in
    ``keep`` those rows are unmasked, so every kernel's softmax stays finite, and the caller
    zeroes them afterwards. That is how fully masked rows give zeros rather than NaN.
    """
    keep = mask.materialize(T, S, device=device)  # (..., T, S) bool
    _check_broadcast("mask", keep.shape, (B, H, T, S))
    visible = keep.any(dim=-1, keepdim=True)  # (..., T, 1)
    if keep.device.type != "cpu" or not bool(visible.all()):  # a CPU asks (a GPU computes faster than it syncs)
        keep = keep | ~visible
    bias = mask.bias(T, S, dtype=bias_dtype, device=device)
    if bias is not None:
        _check_broadcast("mask", bias.shape, (B, H, T, S))
    return keep, visible, bias


def _check_broadcast(name: str, shape: torch.Size, target: tuple[int, ...]) -> None:
    ok = len(shape) <= len(target) and all(
        s in (1, t) for s, t in zip(reversed(shape), reversed(target), strict=False)
    )
    if not ok:
        raise ValueError(
            f"{name} of shape {tuple(shape)} does not broadcast to (B, H, T, S) = {target}"
        )


# --------------------------------------------------------------------------- validation


def _nothing_to_attend(q: Tensor, k: Tensor, v: Tensor, need_weights: bool, weights_dtype: torch.dtype | None
                       ) -> tuple[Tensor, Tensor | None]:
    """An empty batch, no heads, no queries (T = 0) or no keys (S = 0): out (B, H, T, Dv) zeros —
    a row with no key attends to nothing, as a fully masked row does — and weights (B, H, T, S)
    zeros; tied to q, k and v so that a backward gives each its zero gradient (the kernels'
    reshapes of an empty tensor fail: "cannot reshape tensor of 0 elements")."""
    B, H, T, _ = q.shape
    S, Dv = k.shape[2], v.shape[3]
    tied = (q.sum() + k.sum() + v.sum()) * 0  # () zero, with q, k and v in its graph
    out = q.new_zeros(B, H, T, Dv) + tied  # (B, H, T, Dv)
    weights = q.new_zeros(B, H, T, S, dtype=weights_dtype or q.dtype) if need_weights else None  # (B, H, T, S)
    return out, weights


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, scale: float | None, dropout_p: float
                  ) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} must be 4-D (B, heads, length, head_dim); got shape {tuple(t.shape)}"
            )
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor; got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
    B, H, _, Dk = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {B}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v must have the same number of heads; got {k.shape[1]} and {v.shape[1]}")
    Hkv = k.shape[1]
    if Hkv == 0 or H % Hkv != 0:
        raise ValueError(
            f"query heads H={H} must be a multiple of key/value heads Hkv={Hkv} (grouped-query attention)"
        )
    if k.shape[3] != Dk:
        raise ValueError(f"q and k must share head_dim; got q (..., {Dk}) and k (..., {k.shape[3]})")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same length S; got {k.shape[2]} and {v.shape[2]}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1); got {dropout_p}")
    if scale is not None and not (isinstance(scale, (int, float)) and 0 < scale < math.inf):
        raise ValueError(f"scale must be a positive finite number or None; got {scale!r}")
