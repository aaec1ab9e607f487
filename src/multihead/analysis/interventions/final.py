"""The final norm of a decoder, and that norm as the linear map it is at one residual stream
(what direct logit attribution freezes)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...hf.model import HFModel
from ...hf.placement import NotFiniteError, weights_of
from ...hf.sites import UnsupportedModelError
from .ablation import blocks_of

__all__ = ["final_norm", "frozen_norm"]


def final_norm(model: HFModel) -> nn.Module:
    """The norm between the last block and the LM head (``norm``, ``ln_f``, OPT's
    ``decoder.final_layer_norm``...): the last module of the base model, outside its blocks, that
    is a norm by class or by name."""
    inside = {id(m) for block in blocks_of(model) or [] for m in block.modules()}
    norms = [m for name, m in model.body.named_modules() if id(m) not in inside and name and
             ("norm" in type(m).__name__.lower() or "norm" in name.rsplit(".", 1)[-1] or name.endswith("ln_f"))]
    if not norms:
        raise UnsupportedModelError(f"{type(model.body).__name__} has no final norm module (norm, ln_f, "
                                    "final_layer_norm...) before its LM head")
    return norms[-1]


def frozen_norm(norm: nn.Module, x: Tensor) -> tuple[Tensor, bool, float]:
    """The final norm as a linear map at ``x`` (D,): (gain (D,), centred, scale) such that
    norm(v) ≈ gain ⊙ P(v) / scale + bias for the actual residual stream — checked against the
    module's own output, within what its dtype rounds away, so a norm of another form is refused
    rather than misread."""
    with weights_of(norm):  # an offloaded norm's weights are read here, not only run
        param = next(norm.parameters(), x)
        device, dtype = param.device, param.dtype
        weight, bias = getattr(norm, "weight", None), getattr(norm, "bias", None)
        weight = weight.detach().float().cpu() if isinstance(weight, Tensor) else None
        bias = bias.detach().float().cpu() if isinstance(bias, Tensor) else None
    stream = x.dtype  # the model's: a float16 model may keep its norm in float32
    x = x.float().cpu()
    if not bool(x.isfinite().all()):  # no form fits a stream of NaN: say what is wrong, not that the norm is unknown
        raise NotFiniteError.of("the residual stream at the final norm", stream if stream.is_floating_point else dtype)
    if dtype.is_floating_point:
        x = x.to(dtype).float()  # (D,) what the norm itself is given: in bfloat16 already rounded
    # a centring norm ignores a constant added to every element, a scaling one does not: asked of the
    # module, since in bfloat16 a small stream mean can hide the centring within the rounding
    offset = float(x.abs().mean()) or 1.0
    with torch.no_grad():  # run after the read: an offloading hook puts the weights away after each forward
        want = norm(x[None].to(device, dtype)).float()[0].cpu()  # (D,)
        moved = norm((x + offset)[None].to(device, dtype)).float()[0].cpu()  # (D,)
    D = x.shape[0]
    eps = next((float(getattr(norm, n)) for n in ("eps", "variance_epsilon", "epsilon") if hasattr(norm, n)), 1e-6)
    ones = torch.ones(D)
    gains = [ones] if weight is None else [weight, 1 + weight]  # Gemma: 1 + w
    shift = bias if bias is not None else torch.zeros(D)
    # A norm in bfloat16 rounds its output (and HF's RMSNorm its normalised input as well) to 8
    # significant bits, so the checks allow a few of the dtype's steps; float32 keeps 1e-4. The
    # gains differ by O(1) (w or 1 + w), so the closest form is taken.
    step = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    tolerance = max(1e-4, 4 * step) * (1 + float(want.abs().max()))
    centred = float((moved - want).abs().max()) <= tolerance
    v = x - x.mean() if centred else x
    scale = float(torch.sqrt((v * v).mean() + eps))
    candidates = [(gain, centred, scale, gain * v / scale + shift) for gain in gains]
    candidates.append((ones, False, 1.0, x))  # no norm at all (last: a tie goes to the norm's own form)
    gain, centred, scale, error = min(((g, c, s, float((y - want).abs().max())) for g, c, s, y in candidates),
                                      key=lambda candidate: candidate[3])
    if error <= tolerance:
        return gain, centred, scale
    raise UnsupportedModelError(f"the final norm {type(norm).__name__} is neither a LayerNorm nor an RMSNorm as "
                                "multihead knows them; its direct logit attribution cannot be read exactly")
