"""Which kernel serves an attention request, and why each other kernel does not: :func:`choose`.

Read by the kernel itself (:func:`multihead.attention`), by :func:`multihead.explain_backend`
and by the memory estimate (:func:`multihead.estimate_memory` estimates the kernel auto would
choose) — one selection for all three.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..masks import FULL, Mask, split_topk
from .plans import keys_per_query
from .precision import HALF

__all__ = ["BACKENDS", "MIN_CHUNKED_KEYS", "SPARSE_SHARE", "BackendChoice", "choose"]

BACKENDS = ("auto", "math", "sdpa", "local", "sparse", "topk")


@dataclass(frozen=True)
class BackendChoice:
    """Which kernel serves a request, and why each other kernel does not."""

    backend: str
    reason: str
    rejected: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"backend: {self.backend} ({self.reason})"]
        lines += [f"  not {name}: {why}" for name, why in self.rejected.items()]
        return "\n".join(lines)


#: auto takes a chunked kernel when the mask leaves at most this share of the keys per query
#: and there are at least MIN_CHUNKED_KEYS keys. Measured on the CPU (H=8, Dk=64, two-sided
#: window): at n = 1k a 513-key band is 1.4x (forward) / 1.2x (forward+backward) faster
#: chunked than dense SDPA, a 769-key band 1.2x / 0.94x; at n = 512 dense SDPA wins
#: forward+backward even at a quarter of the keys (0.8x), the per-chunk overhead dominating.
SPARSE_SHARE = 0.55
MIN_CHUNKED_KEYS = 1024


def _count(keys: float) -> str:
    """A number of keys for a reason. While torch.compile traces, the shapes may be symbols (a
    ``SymFloat``, which no format spec takes) and the reason is read by nobody: a placeholder."""
    return "W" if torch.compiler.is_compiling() else f"{keys:.0f}"


def choose(q: Tensor, k: Tensor, mask: Mask | None, need_weights: bool, backend: str) -> BackendChoice:
    """The backend ``backend`` ("auto": the fastest exact one) that serves the request, with the
    reasons the others were not taken; ValueError when a named backend cannot serve it."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    T, S = q.shape[2], k.shape[2]
    top, rest = split_topk(mask)
    cover = FULL if rest is None else rest.cover(T, S)
    width = keys_per_query(cover, T, S)
    structure = "layout blocks" if cover.layouts else "band/global tokens"

    problems: dict[str, str] = {}
    if need_weights:
        problems["sdpa"] = "scaled_dot_product_attention does not return attention weights"
        for name in ("local", "sparse", "topk"):
            problems[name] = "computes chunk by chunk and never holds the (B, H, T, S) weights"
    else:
        if top is not None:
            problems["sdpa"] = "scaled_dot_product_attention cannot keep only the top-k scores"
        if top is None:
            problems["topk"] = "the mask has no topk(k)"
    if mask is not None and mask.bias_needs_grad and torch.is_grad_enabled():
        for name in ("local", "sparse", "topk"):  # their autograd Function takes q, k, v: a bias would get None
            problems.setdefault(name, "the mask's additive bias takes a gradient (requires_grad), which the chunked "
                                      "kernels do not compute; backend='sdpa' or 'math' does")
    if backend != "auto":
        if backend in problems:
            raise ValueError(f"backend={backend!r} cannot serve this request: {problems[backend]}")
        return BackendChoice(backend, "requested", {})
    if "sdpa" not in problems and q.dtype in HALF and mask is not None and mask.has_bias:
        # Served, but less precisely: auto prefers the math path.
        problems["sdpa"] = (f"an additive float mask with {q.dtype} inputs is added in {q.dtype} inside "
                            "SDPA; the math path adds it in float32")

    math_why = "materialises the (B, H, T, S) scores: O(T·S) memory"
    if need_weights:
        return BackendChoice("math", "the only path that returns per-head weights",
                             {n: w for n, w in problems.items() if n != "topk"})
    if top is not None and "topk" not in problems:
        return BackendChoice("topk", f"chunked top-{top} selection over at most {_count(width)} keys per query; "
                             "keeps only q, k, v for backward", {"sdpa": problems["sdpa"], "math": math_why})
    dense_why = (f"the mask's {structure} leave {_count(width)} of S={S} keys per query; a chunked kernel "
                 "computes only those")
    sparse_enough = not cover.is_full and width <= SPARSE_SHARE * S and S >= MIN_CHUNKED_KEYS
    if sparse_enough and "local" not in problems:
        name = "sparse" if cover.layouts else "local"
        other = "local" if name == "sparse" else "sparse"
        return BackendChoice(
            name, f"{structure}: {_count(width)} of S={S} keys per query, time and memory O(T·{_count(width)})",
            {"sdpa": dense_why, "math": math_why, other: f"the mask has {structure}", "topk": problems["topk"]},
        )
    if "local" in problems:
        chunk_why = problems["local"]
    elif cover.is_full:
        chunk_why = "the mask is dense"
    elif S < MIN_CHUNKED_KEYS:
        chunk_why = f"S={S} < {MIN_CHUNKED_KEYS}: per-chunk overhead outweighs the keys saved; dense fused kernels win"
    else:
        chunk_why = f"{_count(width)} of S={S} keys per query is more than {SPARSE_SHARE:.0%}; dense fused kernels win"
    if "sdpa" not in problems:
        return BackendChoice("sdpa", "fused kernel, exact for this request",
                             {"math": math_why, "local/sparse": chunk_why, "topk": problems["topk"]})
    return BackendChoice("math", "the only dense path that serves this request",
                         {"sdpa": problems["sdpa"], "local/sparse": chunk_why})
