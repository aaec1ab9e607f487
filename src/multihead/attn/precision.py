"""The dtypes attention computes in: half-precision inputs give float32 scores and softmax.

One rule for every kernel that forms scores itself (the math kernel, the chunked ones), so a
fast path and the reference round the same way.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import gemm
from .autodiff import transformed
from .cpu_trace import runs_as_cpu

__all__ = ["HALF", "KEY_GRID", "RAISED_BYTES", "RAISED_WEIGHT_BYTES", "Linear", "as_half_product", "autocast_half",
           "compute_dtype", "half_matmul", "half_units", "key_grid", "linear", "raised_dtype", "raised_linear",
           "score_operands", "slow_half_product"]

HALF = (torch.float16, torch.bfloat16)
#: Key counts a half-precision product on a CPU is padded up to a multiple of (see :func:`key_grid`).
KEY_GRID = 256
#: The most bytes of float32 rows :func:`half_matmul` raises a half operand to at once (so a map's
#: product never holds a float32 copy of the whole map).
RAISED_BYTES = 4 << 20
#: The fewest rows :func:`half_matmul` multiplies at once (fewer make MKL's GEMM a slow GEMV).
RAISED_ROWS = 64
#: The most bytes of a weight's rows :func:`raised_linear` holds raised to float32 at once (an 8B
#: model's LM head would be 2.1 GB in one piece).
RAISED_WEIGHT_BYTES = 32 << 20


def compute_dtype(q: Tensor) -> torch.dtype:
    """The dtype of the scores and the softmax: float32 for half-precision queries, else theirs."""
    return torch.float32 if q.dtype in HALF else q.dtype


@functools.cache
def half_units(dtype: torch.dtype) -> bool:
    """Whether this CPU multiplies ``dtype`` (bfloat16 or float16) in units of its own through
    oneDNN: bfloat16 with AVX-512 BF16 or AMX, float16 with AVX-512 FP16 or AMX-FP16 (PyTorch's
    checks). Elsewhere — AVX2, an AVX-512 CPU without BF16 instructions, where oneDNN emulates it,
    or another architecture — a half product is slower than a float32 one."""
    try:
        if dtype == torch.bfloat16:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()) and bool(
                torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
        if dtype == torch.float16:
            return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN or without these checks: none
        pass
    return False


def score_operands(q: Tensor, k: Tensor, *, half_product: bool = True) -> tuple[Tensor, Tensor]:
    """q (…, T, Dk) and k (…, S, Dk) as the scores' product takes them.

    Half precision on a CPU without units for it (:func:`half_units`), or with ``half_product``
    False: raised to float32. A product of two half numbers is exact in float32, so q·kᵀ is then
    what a float32-accumulating half GEMM holds before it rounds its output (:func:`as_half_product`
    rounds it), at MKL's float32 speed. A CPU with the units multiplies in the half dtype itself, as
    the model's eager attention does there: on an Intel Xeon with AMX 6x the float32 product's speed
    (the capture of 4k tokens of a Qwen2-1.5B shape 18.3 → 15.1 s), its keys padded to
    :data:`KEY_GRID` (:func:`key_grid`). ``half_product=False`` is for kernels whose products take
    a new key count every chunk, not padded (the chunked long kernels). float16 is raised on every
    CPU: its product rounded in :func:`as_half_product` keeps a score past float16's range in float32
    (as the model's SDPA holds it), where a float16 GEMM's output would be inf. Elsewhere (CUDA's
    tensor cores, full precision) unchanged.
    """
    if q.dtype in HALF and runs_as_cpu(q.device) and not (
            half_product and _half_product_on_cpu(q) and q.dtype != torch.float16):
        return q.float(), k.float()  # small beside the (T, S) scores
    return q, k


def slow_half_product(t: Tensor) -> bool:
    """Whether ``t`` is a half tensor on a CPU without units for its dtype (:func:`half_units`), where
    PyTorch's own half GEMM is a scalar loop and a product is better formed in float32."""
    return t.dtype in HALF and runs_as_cpu(t.device) and not half_units(t.dtype)


def autocast_half(t: Tensor) -> torch.dtype | None:
    """The half dtype autocast would multiply ``t`` in, where that is slow: autocast on for a half
    dtype on a CPU without units for it (mixed-precision training on an AVX2 CPU), and ``t`` of a
    floating dtype it casts (any but float64); else None."""
    if t.device.type != "cpu" or t.dtype not in (torch.float32, *HALF) or not torch.is_autocast_enabled("cpu"):
        return None
    dtype = torch.get_autocast_dtype("cpu")
    return dtype if dtype in HALF and not half_units(dtype) else None


def raised_dtype(t: Tensor) -> torch.dtype | None:
    """The half dtype a product of ``t`` is formed for in float32 here: ``t``'s own on a CPU without
    units for it (:func:`slow_half_product`), or autocast's such dtype (:func:`autocast_half`); else None."""
    return t.dtype if slow_half_product(t) else autocast_half(t)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``: x (..., K), weight (N, K), bias (N,) → (..., N) — the one
    linear product of our layers and of a half model's raised ones (``hf.halflinear``).

    Where PyTorch's half product is its scalar loop — half operands on a CPU without units for them
    (:func:`slow_half_product`), or float32 operands under autocast to such a half dtype
    (:func:`autocast_half`: ``multihead train --dtype bfloat16`` on an AVX2 CPU, whose step was 23x
    float32's) — it is :func:`raised_linear`'s on the operands in that dtype: what autocast's half
    GEMM computes, a float32-accumulated product rounded once, at float32's speed; the gradient
    reaches float32 weights through the casts, as autocast's does. A forward-mode tangent or a
    torch.func transform on any operand takes F.linear (the raised product is a Function with a
    backward only)."""
    # the common cases first: a GPU, or full precision without autocast
    if x.device.type != "cpu" or (x.dtype not in HALF and not torch.is_autocast_enabled("cpu")):
        return F.linear(x, weight, bias)
    if any(t is not None and transformed(t) for t in (x, weight, bias)):
        return F.linear(x, weight, bias)
    dtype = autocast_half(x)
    if dtype is not None:
        with torch.autocast("cpu", enabled=False):  # the casts and the product, as autocast's own
            return raised_linear(x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype))
    if slow_half_product(x) and weight.dtype == x.dtype:
        return raised_linear(x, weight, bias)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """An ``nn.Linear`` (the same parameters, state dict and hooks) whose product is :func:`linear`'s:
    raised where a half product would be PyTorch's scalar loop, ``nn.Linear``'s own anywhere else."""

    def forward(self, input: Tensor) -> Tensor:
        return linear(input, self.weight, self.bias)  # (..., out_features)


def _half_product_on_cpu(t: Tensor) -> bool:
    """Whether ``t`` is a half tensor on a CPU that multiplies it in its own units."""
    return t.dtype in HALF and runs_as_cpu(t.device) and half_units(t.dtype)


def key_grid(t: Tensor, keys: int) -> int:
    """How many keys a product over ``keys`` keys of ``t``'s dtype is formed over: on a CPU in half
    precision, the next multiple of :data:`KEY_GRID` — oneDNN builds and caches a primitive per
    product shape, and the chunks of a causal layer each have their own key count (one per chunk,
    ~100 at 8k tokens: their cache held hundreds of MB and their builds took seconds); with the
    keys padded (zero keys, zero weights) a few shapes serve every chunk. The scores are the
    unpadded ones bit for bit; P·V sums over more (zero) terms, which can move a bfloat16 output by
    a unit in its last place — as a chunk's product over its K keys already differs from eager's
    over all S. Otherwise ``keys``."""
    if keys % KEY_GRID and _half_product_on_cpu(t):
        return keys + KEY_GRID - keys % KEY_GRID
    return keys


def as_half_product(scores: Tensor, dtype: torch.dtype, scale: float | None = None) -> Tensor:
    """Float32 scores made from half operands (:func:`score_operands`), rounded to ``dtype`` as a
    half GEMM rounds its output — and, with ``scale``, then multiplied by it in ``dtype``: eager's
    ``(q @ kᵀ) * scale``, two roundings — and back to float32 for the softmax; in place when no
    gradient is wanted (one half-size temporary either way). Others are returned as they are.

    A float16 score past the dtype's range (|q·k| > 65,504) keeps its float32 value (scaled): eager's
    product is inf there and its softmax NaN, while the model's own SDPA kernels hold their scores
    in float32 and stay finite — the capture takes the finite one (bfloat16 has float32's range)."""
    if dtype not in HALF or scores.dtype == dtype:
        return scores
    half = scores.to(dtype)
    if scale is not None:
        half = half.mul_(scale) if not scores.requires_grad else half * scale
    over = _past_range(half)  # (...,) bool where the half score is ±inf, or None
    if scores.requires_grad:
        rounded = half.to(scores.dtype)
        return rounded if over is None else torch.where(over, scores if scale is None else scores * scale, rounded)
    kept = None if over is None else scores[over] * (1.0 if scale is None else scale)  # (n,) the few past the range
    scores.copy_(half)
    if kept is not None:
        scores[over] = kept
    return scores


def _past_range(half: Tensor) -> Tensor | None:
    """Where a float16 tensor on a CPU is ±inf — bool, same shape — or None where none is (or for
    any other dtype or device: bfloat16 shares float32's range, and a GPU would have to wait for
    the answer)."""
    if half.dtype != torch.float16 or not runs_as_cpu(half.device) or half.device.type == "meta" or not half.numel():
        return None
    lowest, highest = torch.aminmax(half)  # one read, no temporary the map's size (as a memory plan traces it)
    return half.isinf() if bool(highest == torch.inf) or bool(lowest == -torch.inf) else None


def half_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` for half-precision a (..., n, k) and b (..., k, m) of one dtype: (..., n, m) in it.

    On a CPU without units for the dtype (:func:`half_units`: an AVX2 CPU, or AVX-512 without BF16)
    PyTorch's own half GEMM is a scalar loop — on an AVX2 AMD EPYC 20x slower than a float32 one
    (P·V of SmolLM2's 1,024 tokens, 30 layers: 16 s, as long as the model's whole forward) — so the
    product is formed in float32 on the raised operands, whose products are exact there, and
    rounded once to the dtype: what a float32-accumulating half GEMM gives (within its summation
    order), at MKL's float32 speed. Without a gradient a's rows are raised a few MiB at a time
    (:data:`RAISED_BYTES`), never a float32 copy of a whole map. Anywhere else (CUDA, a CPU with
    the units, full precision) it is ``a @ b``. A float32 product of batches (n, ., .) goes through
    :func:`~.gemm.bmm`, which keeps every thread busy where the batch would not."""
    if not slow_half_product(a) or b.dtype != a.dtype:
        return _product(a, b)
    wide = b.float()  # (..., k, m), small beside a map
    if a.requires_grad or b.requires_grad:
        return (a.float() @ wide).to(a.dtype)
    n, m = a.shape[-2], b.shape[-1]
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    out = torch.empty(*batch, n, m, dtype=a.dtype, device=a.device)  # (..., n, m)
    row_bytes = max(a[..., :1, :].numel(), 1) * 4
    step = max(RAISED_BYTES // row_bytes, RAISED_ROWS)
    for start in range(0, n, step):
        rows = slice(start, start + step)
        out[..., rows, :] = _product(a[..., rows, :].float(), wide)  # (..., step, m), rounded to the dtype as stored
    return out


def _product(a: Tensor, b: Tensor) -> Tensor:
    """a @ b — through :func:`~.gemm.bmm` where both are batches of matrices, (n, r, k) and (n, k, m)."""
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] == b.shape[0]:
        return gemm.bmm(a, b)
    return a @ b


def raised_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``: x (..., K), weight (N, K), bias (N,) → (..., N) in x's dtype,
    each product formed on operands raised to float32 (or kept, from float32 up) and rounded once.

    For half precision on a CPU without units for it (:func:`slow_half_product`), where PyTorch's
    half GEMM is a scalar loop in some layouts: on an AVX2 AMD EPYC the product ``grad @ W`` of
    SmolLM2's LM head over 432 rows took 50 s in bfloat16 against float32's 0.22 s, and one step of
    ``multihead prune --dtype bfloat16`` 342 s (22.6 s raised; float32 20 s). A product of two half
    numbers is exact in float32, so this is what a float32-accumulating half GEMM gives, within its
    summation order (and bias, as addmm adds it, before the one rounding).
    The weight is raised :data:`RAISED_WEIGHT_BYTES` of rows at a time, each block once, and x and
    each block's product :data:`RAISED_BYTES` at a time, so no float32 copy of a whole weight is
    held; the backward keeps the half tensors (not raised copies) and raises them again block by
    block, summing the input's gradient in one float32 (rows, K) buffer. A layer with no inputs or
    no outputs (every head of it pruned) is ``F.linear``'s."""
    if x.numel() == 0 or 0 in weight.shape:
        return F.linear(x, weight, bias)
    return _RaisedLinear.apply(x, weight, bias)


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _weight_rows(K: int) -> int:
    """How many rows of a weight of K columns are raised at once (:data:`RAISED_WEIGHT_BYTES`)."""
    return max(RAISED_WEIGHT_BYTES // (K * 4), 1)


def _rows(*widths: int) -> int:
    """How many rows of the given widths go into one raised block: each block of float32 rows at most
    :data:`RAISED_BYTES`, and never fewer than :data:`RAISED_ROWS` rows."""
    return max(min(RAISED_BYTES // (4 * w) for w in widths), RAISED_ROWS)


class _RaisedLinear(torch.autograd.Function):
    # Forward and backward run with autocast off: their float32 products are the point (autocast
    # would send them back to the half GEMM this avoids), whatever context the model runs in.
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return _raised_forward(ctx, x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        with torch.autocast(grad.device.type, enabled=False):
            return _raised_backward(ctx, grad)


def _raised_forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    ctx.save_for_backward(x, weight, bias)
    N, K = weight.shape
    wide = _wide(x.dtype)
    flat = x.reshape(-1, K)  # (M, K)
    M = flat.shape[0]
    out = torch.empty(*x.shape[:-1], N, dtype=x.dtype, device=x.device)  # (..., N): not a view of ours
    rows = out.view(M, N)
    w_step = _weight_rows(K)
    for j in range(0, N, w_step):
        w_rows = weight[j:j + w_step].to(wide)  # (n, K), raised once
        n = w_rows.shape[0]
        b_rows = None if bias is None else bias[j:j + w_step].to(wide)  # (n,)
        step = _rows(K, n)
        for i in range(0, M, step):
            x_rows = flat[i:i + step].to(wide)  # (m, K)
            product = x_rows @ w_rows.T if b_rows is None else torch.addmm(b_rows, x_rows, w_rows.T)  # (m, n)
            rows[i:i + step, j:j + n] = product  # rounded to x's dtype as stored
    return out


def _raised_backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    x, weight, bias = ctx.saved_tensors
    N, K = weight.shape
    wide = _wide(x.dtype)
    g = grad.reshape(-1, N)  # (M, N)
    flat = x.reshape(-1, K)  # (M, K)
    M = g.shape[0]
    w_step = _weight_rows(K)
    grad_x = grad_w = grad_b = None
    if ctx.needs_input_grad[0]:  # dL/dx = g @ W: each weight block raised once, summed in float32
        total = torch.zeros(M, K, dtype=wide, device=x.device)  # (M, K)
        for j in range(0, N, w_step):
            w_rows = weight[j:j + w_step].to(wide)  # (n, K)
            n = w_rows.shape[0]
            step = _rows(n)
            for i in range(0, M, step):
                total[i:i + step].addmm_(g[i:i + step, j:j + n].to(wide), w_rows)  # (m, K)
        grad_x = total.to(x.dtype).view(x.shape)
    if ctx.needs_input_grad[1]:  # dL/dW = gᵀ @ x: a block of the weight's rows, summed over row blocks
        grad_w = torch.empty(N, K, dtype=weight.dtype, device=weight.device)  # (N, K)
        for j in range(0, N, w_step):
            n = min(w_step, N - j)
            block = torch.zeros(n, K, dtype=wide, device=weight.device)  # (n, K)
            step = _rows(n, K)
            for i in range(0, M, step):
                block.addmm_(g[i:i + step, j:j + n].T.to(wide), flat[i:i + step].to(wide))
            grad_w[j:j + n] = block
    if bias is not None and ctx.needs_input_grad[2]:
        step = _rows(N)
        grad_b = sum(g[i:i + step].to(wide).sum(0) for i in range(0, M, step)).to(bias.dtype)  # (N,)
    return grad_x, grad_w, grad_b
