"""A model's linear layers in half precision on a CPU without units for it: their products formed
in float32 and rounded once (:func:`~multihead.attn.precision.raised_linear`), as a
float32-accumulating half GEMM gives them, at float32's speed instead of PyTorch's scalar half loop
(SmolLM2 in bfloat16 on an AVX2 CPU: a pruning step 342 → 22.6 s, float32's 20 s)."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor, nn

from ..attn.autodiff import transformed
from ..attn.precision import HALF, half_units, raised_linear, slow_half_product
from .placement import model_devices

__all__ = ["RaisedHalfLinear", "raise_half_linears"]


class RaisedHalfLinear(nn.Linear):
    """An ``nn.Linear`` (the same parameters, state dict and hooks) whose product, when its input and
    weight are of one half dtype on a CPU without units for it, is :func:`raised_linear`'s;
    anywhere else (float32, a GPU, a CPU with AVX-512 BF16 or AMX) it is ``nn.Linear``'s own."""

    def forward(self, input: Tensor) -> Tensor:
        # a forward-mode tangent or a torch.func transform takes nn.Linear's own product: the raised one is a
        # custom autograd Function with a backward only
        if slow_half_product(input) and self.weight.dtype == input.dtype and not transformed(input):
            return raised_linear(input, self.weight, self.bias)  # (..., out_features)
        return super().forward(input)


def raise_half_linears(model: Any) -> int:
    """Make every plain ``nn.Linear`` of a half-precision ``model`` that computes on a CPU without
    units for its dtype a :class:`RaisedHalfLinear` (in place — the module objects, their weights
    and their accelerate hooks stay, and so does the new class, also on a model given to
    :func:`~multihead.hf.load.wrap`); returns how many. Subclasses of ``nn.Linear`` (quantised or
    adapter layers) are left as they are, and so is a model anywhere else."""
    dtypes = {p.dtype for p in model.parameters()} & set(HALF)
    on_cpu = any(torch.device(d).type == "cpu" for d in model_devices(model))
    if not dtypes or all(half_units(d) for d in dtypes) or not on_cpu:
        return 0
    raised = 0
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.dtype in HALF and not half_units(module.weight.dtype):
            module.__class__ = RaisedHalfLinear
            # accelerate's hook runs the forward it saw at dispatch: nn.Linear's own is rebound, another
            # wrapper kept
            if getattr(getattr(module, "_old_forward", None), "__func__", None) is nn.Linear.forward:
                module._old_forward = functools.partial(RaisedHalfLinear.forward, module)
            raised += 1
    return raised

