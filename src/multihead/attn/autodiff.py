"""Whether a tensor carries a derivative: the one test the fast paths that write in place, into
``out=`` or through ctypes ask before they take a tensor (they would drop the derivative, or refuse)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["differentiated", "transformed"]

#: functorch's test for a tensor wrapped by a transform (vmap, grad, jvp); absent from a build without it
_WRAPPED = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda t: False)


def differentiated(t: Tensor) -> bool:
    """Whether ``t`` carries a derivative: a graph (reverse mode), a tangent (``torch.autograd.forward_ad``,
    whose dual tensors do not require grad), or a functorch transform's wrapper (``torch.func``'s
    vmap, grad, jvp) — which an in-place softmax, an ``out=`` product or a ctypes call would drop or
    refuse."""
    return t.requires_grad or transformed(t)


def transformed(t: Tensor) -> bool:
    """Whether ``t`` carries a derivative other than reverse mode's graph: a forward-mode tangent or
    a functorch transform's wrapper — which a custom ``autograd.Function`` without a ``jvp`` or
    ``vmap`` rule refuses."""
    return torch.autograd.forward_ad.unpack_dual(t).tangent is not None or bool(_WRAPPED(t))
