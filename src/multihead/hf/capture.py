"""See every head of a Hugging Face model: a registered transformers attention function.

While :class:`AttentionCapture` is active, every attention layer of the model (BERT-family
encoders, Llama/GPT-style decoders, grouped-query included, and models built from our own
:class:`~multihead.MultiHeadAttention`, numbered by their order among the model's
``MultiHeadAttention`` modules; cross-attention calls are not reported) computes its attention
with our math kernel and hands ``(layer, weights, head_outputs, visible)`` to a callback — one
layer at a time, so nothing holds L·H·n² maps at once. This is not ``output_attentions=True``: the model
never returns the maps; the callback reduces them and lets them go.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..attn import attention
from ..attn.layer import MultiHeadAttention, scale_heads
from ..masks import Mask, as_mask, causal, from_tensor
from .load import ModelLike, as_module

__all__ = ["IMPLEMENTATION", "AttentionCapture", "LayerCallback"]

IMPLEMENTATION = "multihead_capture"
#: attribute of an attention module holding a callable that returns its gates (see .gates)
GATE_ATTRIBUTE = "_multihead_gate"
#: attribute holding a callable that returns the heads to replace by uniform attention
UNIFORM_ATTRIBUTE = "_multihead_uniform"

#: callback(layer, weights (B, H, T, S), head_outputs (B, H, T, Dv) before W^O, visible (B|1, 1, T, S) bool)
LayerCallback = Callable[[int, Tensor, Tensor, Tensor], None]

_ACTIVE: list[AttentionCapture] = []
_REGISTERED = False


class AttentionCapture:
    """Context manager routing a model's attention through the capture function."""

    def __init__(self, model: ModelLike, callback: LayerCallback) -> None:
        self.model = as_module(model)
        self.callback = callback
        self._saved: list[tuple[Any, str]] = []
        self._w_o: dict[int, Tensor] = {}
        self._ours: list[MultiHeadAttention] = []

    def output_projection(self, layer: int) -> Tensor | None:
        """W^O of a layer's self-attention, (D, H·Dv), or None when it cannot be found."""
        return self._w_o.get(layer)

    def __enter__(self) -> AttentionCapture:
        ours = [m for m in self.model.modules() if isinstance(m, MultiHeadAttention)]
        if ours:  # models built from our layer (or HF models with it swapped in): observe each layer
            self._ours = ours
            for index, layer in enumerate(ours):
                layer._observers.append(self._observer(index))
            self._w_o = {i: layer.out_proj.weight * layer.head_gates.repeat_interleave(layer.head_dim)
                         for i, layer in enumerate(ours)}
            return self
        register()
        self._w_o = _output_projections(self.model)
        for module in self.model.modules():
            config = getattr(module, "config", None)
            if config is not None and hasattr(config, "_attn_implementation") and \
                    all(c is not config for c, _ in self._saved):
                self._saved.append((config, config._attn_implementation))
                config._attn_implementation = IMPLEMENTATION
        if not self._saved:
            raise ValueError(f"{type(self.model).__name__} has no transformers config to route attention through")
        _ACTIVE.append(self)
        return self

    def _observer(self, index: int):
        def observe(layer: MultiHeadAttention, weights: Tensor, out: Tensor, mask: object) -> None:
            T, S = weights.shape[-2:]
            try:
                visible = _visible(as_mask(mask), T, S, weights.device)
            except (TypeError, ValueError):  # data-dependent (top-k): every key was a candidate
                visible = _visible(None, T, S, weights.device)
            self.callback(index, weights, out, visible)

        observe.capture = self  # type: ignore[attr-defined]
        return observe

    def __exit__(self, *exc: object) -> None:
        if self._ours:
            for layer in self._ours:
                layer._observers[:] = [o for o in layer._observers if getattr(o, "capture", None) is not self]
            self._ours = []
            return
        _ACTIVE.remove(self)
        for config, impl in self._saved:
            config._attn_implementation = impl
        self._saved.clear()


def _capture_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                       attention_mask: Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                       **kwargs: Any) -> tuple[Tensor, Tensor | None]:
    """The one attention function both the capture and the head gates route through."""
    T, S = query.shape[2], key.shape[2]
    if attention_mask is not None:
        mask = from_tensor(attention_mask[..., :S])
    elif getattr(module, "is_causal", False) and T > 1:
        mask = causal()  # transformers leaves a plain causal mask implicit
    else:
        mask = None
    watched = bool(_ACTIVE) and not _is_cross_attention(module)
    out, weights = attention(query, key, value, mask, scale=scaling, need_weights=watched,
                             dropout_p=dropout if module.training else 0.0, backend="math" if watched else "auto")
    uniform = getattr(module, UNIFORM_ATTRIBUTE, None)
    heads = uniform() if uniform is not None else ()
    if heads:  # Kovaleva et al.'s ablation: these heads attend uniformly to the keys they may see
        visible = _visible(mask, T, S, query.device).to(value.dtype)
        flat = visible / visible.sum(-1, keepdim=True).clamp_min(1)  # (B|1, 1, T, S)
        group = query.shape[1] // value.shape[1]
        out = out.clone()
        for h in heads:
            out[:, h] = flat[:, 0] @ value[:, h // group]  # (B, T, Dv)
    gate = getattr(module, GATE_ATTRIBUTE, None)
    if gate is not None:
        out = scale_heads(out, gate())
    if watched:
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            raise ValueError(f"{type(module).__name__} has no layer_idx; cannot tell which layer it is")
        _ACTIVE[-1].callback(int(layer), weights, out, _visible(mask, T, S, query.device))
    return out.transpose(1, 2).contiguous(), weights  # (B, T, H, Dv) as transformers expects


def _visible(mask: Mask | None, T: int, S: int, device: torch.device) -> Tensor:
    """Which keys each query may see, (B|1, 1|H, T, S) bool (all of them without a mask)."""
    if mask is None:
        return torch.ones(1, 1, T, S, dtype=torch.bool, device=device)
    visible = mask.materialize(T, S, device=device)
    return visible if visible.dim() == 4 else visible.view(1, 1, T, S)


def _is_cross_attention(module: nn.Module) -> bool:
    return bool(getattr(module, "is_cross_attention", False)) or "Cross" in type(module).__name__


def _output_projections(model: nn.Module) -> dict[int, Tensor]:
    """layer -> W^O weight: the attention's own ``o_proj``/``out_proj``, or BERT's ``output.dense``
    on the parent block."""
    found: dict[int, Tensor] = {}
    for name, module in model.named_modules():
        layer = getattr(module, "layer_idx", None)
        if layer is None or _is_cross_attention(module) or int(layer) in found:
            continue
        proj = getattr(module, "o_proj", None) or getattr(module, "out_proj", None)
        if proj is None and "." in name:
            parent = model.get_submodule(name.rpartition(".")[0])
            proj = getattr(getattr(parent, "output", None), "dense", None)
        if isinstance(proj, nn.Linear):
            found[int(layer)] = proj.weight
    return found


def register() -> None:
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, _capture_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    _REGISTERED = True
