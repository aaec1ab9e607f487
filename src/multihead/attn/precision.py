"""The dtypes attention computes in: half-precision inputs give float32 scores and softmax.

One rule for every kernel that forms scores itself (the math kernel, the chunked ones), so a
fast path and the reference round the same way.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["HALF", "as_half_product", "compute_dtype", "score_operands"]

HALF = (torch.float16, torch.bfloat16)


def compute_dtype(q: Tensor) -> torch.dtype:
    """The dtype of the scores and the softmax: float32 for half-precision queries, else theirs."""
    return torch.float32 if q.dtype in HALF else q.dtype


def score_operands(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """q (…, T, Dk) and k (…, S, Dk) as the scores' product takes them.

    Half-precision on a CPU: raised to float32. A product of two half numbers is exact in float32,
    so q·kᵀ is then what a float32-accumulating half GEMM holds before it rounds its output
    (:func:`as_half_product` rounds it), formed by MKL's float32 GEMM instead of a oneDNN half GEMM
    primitive per chunk shape, whose cache held ~80 MB at 4k tokens of SmolLM2 in bfloat16. On an
    Intel Xeon with AMX the analysis of 1k tokens of SmolLM2 in bfloat16 went 3.0 → 2.3 s (the
    attention 0.5 → 0.4 s, and the float32 cosine after it 0.93 → 0.58 s). Elsewhere (CUDA's
    tensor cores, full precision) unchanged.
    """
    if q.dtype in HALF and q.device.type == "cpu":
        return q.float(), k.float()  # small beside the (T, S) scores
    return q, k


def as_half_product(scores: Tensor, dtype: torch.dtype, scale: float | None = None) -> Tensor:
    """Float32 scores made from half operands (:func:`score_operands`), rounded to ``dtype`` as a
    half GEMM rounds its output — and, with ``scale``, then multiplied by it in ``dtype``: eager's
    ``(q @ kᵀ) * scale``, two roundings — and back to float32 for the softmax; in place when no
    gradient is wanted (one half-size temporary either way). Others are returned as they are."""
    if dtype not in HALF or scores.dtype == dtype:
        return scores
    half = scores.to(dtype)
    if scale is not None:
        half = half.mul_(scale) if not scores.requires_grad else half * scale
    return half.to(scores.dtype) if scores.requires_grad else scores.copy_(half)
