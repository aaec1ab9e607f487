"""Per-head gates ξ on Hugging Face models (transformers v5 removed ``head_mask``).

``HeadGates(model)`` routes every self-attention layer of a BERT-family encoder or a
Llama/GPT-style decoder through our attention function, which multiplies head ``h``'s output
(before W^O) by ``ξ[layer, h]``: ξ = 0 removes the head's contribution exactly, ξ = 1 changes
nothing, and ξ is differentiable. With grouped-query attention each *query* head has its own
gate. ``values`` may also hold one gate per example, (L, B, H), which is how
:func:`multihead.heads.head_importance` gets per-example gradients from one backward pass.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..attn.layer import MultiHeadAttention
from .capture import GATE_ATTRIBUTE, IMPLEMENTATION, UNIFORM_ATTRIBUTE, _is_cross_attention, register
from .load import ModelLike, as_module

__all__ = ["HeadGates", "self_attention_modules"]


def self_attention_modules(model: ModelLike) -> list[nn.Module]:
    """The model's self-attention modules (those transformers numbers with ``layer_idx``), in layer order."""
    model = as_module(model)
    found: dict[int, nn.Module] = {}
    for module in model.modules():
        layer = getattr(module, "layer_idx", None)
        if layer is not None and not _is_cross_attention(module) and int(layer) not in found \
                and hasattr(module, "config"):
            found[int(layer)] = module
    if not found:
        raise ValueError(f"{type(model).__name__} has no transformers self-attention layer (none has layer_idx)")
    return [found[k] for k in sorted(found)]


class HeadGates:
    """Gates ξ (L, H) — or (L, B, H) per example — on a transformers model; use as a context
    manager or call :meth:`remove`."""

    def __init__(self, model: ModelLike, values: Tensor | None = None) -> None:
        model = as_module(model)
        self.model = model
        #: (layer, head) pairs whose attention is replaced by uniform attention over visible keys
        self.uniform: set[tuple[int, int]] = set()
        self._saved: list[tuple[Any, str]] = []
        ours = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
        if ours:  # our own layers take the gates directly
            self.modules = ours
            self.num_layers, self.num_heads = len(ours), max(m.num_heads for m in ours)
            self.values = values if values is not None else torch.ones(self.num_layers, self.num_heads)
            for index, layer in enumerate(ours):
                layer._gate_override = self._gate_of(index)
            return
        self.modules = self_attention_modules(model)
        heads = {_num_heads(m) for m in self.modules}
        self.num_layers, self.num_heads = len(self.modules), max(heads)
        self.values = values if values is not None else torch.ones(self.num_layers, self.num_heads)
        register()
        for index, module in enumerate(self.modules):
            setattr(module, GATE_ATTRIBUTE, self._gate_of(index))
            setattr(module, UNIFORM_ATTRIBUTE, self._uniform_of(index))
        for module in model.modules():
            config = getattr(module, "config", None)
            if config is not None and hasattr(config, "_attn_implementation") and \
                    all(c is not config for c, _ in self._saved):
                self._saved.append((config, config._attn_implementation))
                config._attn_implementation = IMPLEMENTATION

    def _gate_of(self, index: int):
        def gate() -> Tensor:
            v = self.values
            if v.shape[0] != self.num_layers or v.shape[-1] != self.num_heads or v.dim() not in (2, 3):
                raise ValueError(f"gates must be (L, H) = ({self.num_layers}, {self.num_heads}) or (L, B, H); "
                                 f"got {tuple(v.shape)}")
            return v[index]

        return gate

    def _uniform_of(self, index: int):
        return lambda: sorted(h for layer, h in self.uniform if layer == index)

    def remove(self) -> None:
        """Take the gates off and restore the model's own attention implementation."""
        for module in self.modules:
            if isinstance(module, MultiHeadAttention):
                module._gate_override = None
                continue
            for name in (GATE_ATTRIBUTE, UNIFORM_ATTRIBUTE):
                if hasattr(module, name):
                    delattr(module, name)
        for config, impl in self._saved:
            config._attn_implementation = impl
        self._saved.clear()

    def __enter__(self) -> HeadGates:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _num_heads(module: nn.Module) -> int:
    config = module.config
    for name in ("num_attention_heads", "num_heads"):
        value = getattr(module, name, None)
        if isinstance(value, int):
            return value
    q = getattr(module, "q_proj", None) or getattr(module, "query", None)
    head_dim = getattr(module, "head_dim", None) or getattr(module, "attention_head_size", None)
    if isinstance(q, nn.Linear) and head_dim:
        return q.out_features // int(head_dim)
    return int(config.num_attention_heads)
