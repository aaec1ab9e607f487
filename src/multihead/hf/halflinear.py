"""A model's linear layers in half precision on a CPU without units for it: their products formed
in float32 and rounded once (:func:`~multihead.attn.precision.raised_linear`), as a
float32-accumulating half GEMM gives them, at float32's speed instead of PyTorch's scalar half loop
(SmolLM2 in bfloat16 on an AVX2 CPU: a pruning step 342 → 22.6 s, float32's 20 s; a GPT-2-small
shape's forward over 1,024 tokens, whose ``Conv1D`` products are ``addmm`` on an (in, out) weight,
129 s → 3.0 s, float32's 2.7 s)."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor, nn

from ..attn.precision import HALF, Linear, half_units, linear
from .model import is_conv1d
from .placement import model_devices

__all__ = ["RaisedHalfLinear", "raise_half_linears", "raised_conv1d"]


class RaisedHalfLinear(Linear):
    """A model's ``nn.Linear`` made :class:`~multihead.attn.precision.Linear` (the same parameters,
    state dict and hooks): its product raised where its input and weight are of one half dtype on a
    CPU without units for it, or where autocast would run it in such a dtype; anywhere else
    (float32, a GPU, a CPU with AVX-512 BF16 or AMX) ``nn.Linear``'s own."""


@functools.cache
def raised_conv1d(conv1d: type[nn.Module]) -> type[nn.Module]:
    """The class of transformers' ``Conv1D`` (given, so that transformers is not imported here) whose
    product, as :class:`RaisedHalfLinear`'s, is :func:`raised_linear`'s where PyTorch's half product
    is slow: x (..., nx) @ W (nx, nf) + b is ``F.linear`` with Wᵀ."""

    def forward(self: nn.Module, input: Tensor) -> Tensor:
        # Conv1D's own addmm(b, x, W) is F.linear(x, Wᵀ, b): linear takes it wherever nothing is raised
        return linear(input, self.weight.T, self.bias)  # (..., nf): Wᵀ is (nf, nx), a view

    raised = type("RaisedHalfConv1D", (conv1d,), {"forward": forward, "__module__": __name__,
                                                   "__doc__": raised_conv1d.__doc__})
    globals()["RaisedHalfConv1D"] = raised  # where pickle looks a class up (transformers has one Conv1D)
    return raised


def _raisable(module: nn.Module) -> type[nn.Module] | None:
    """The raised class for a plain ``nn.Linear`` or transformers' own ``Conv1D``, else None."""
    if type(module) is nn.Linear:
        return RaisedHalfLinear
    if is_conv1d(module) and type(module).__name__ == "Conv1D":  # not a subclass of it
        return raised_conv1d(type(module))
    return None


def raise_half_linears(model: Any) -> int:
    """Make every plain ``nn.Linear`` (and transformers' ``Conv1D``, GPT-2's) of a half-precision
    ``model`` that computes on a CPU without units for its dtype a :class:`RaisedHalfLinear` (or
    :func:`raised_conv1d`'s class) in place — the module objects, their weights and their
    accelerate hooks stay, and so does the new class, also on a model given to
    :func:`~multihead.hf.load.wrap`; returns how many. Subclasses (quantised or adapter layers) are
    left as they are, and so is a model anywhere else."""
    dtypes = {p.dtype for p in model.parameters()} & set(HALF)
    on_cpu = any(torch.device(d).type == "cpu" for d in model_devices(model))
    if not dtypes or all(half_units(d) for d in dtypes) or not on_cpu:
        return 0
    raised = 0
    for module in model.modules():
        kind = _raisable(module)
        if kind is None or module.weight.dtype not in HALF or half_units(module.weight.dtype):
            continue
        plain = type(module)
        module.__class__ = kind
        # accelerate's hook runs the forward it saw at dispatch: the plain class's own is rebound, another
        # wrapper kept
        if getattr(getattr(module, "_old_forward", None), "__func__", None) is plain.forward:
            module._old_forward = functools.partial(kind.forward, module)
        raised += 1
    return raised

