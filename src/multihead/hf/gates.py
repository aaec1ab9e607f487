"""Per-head gates ξ on Hugging Face models (transformers v5 removed ``head_mask``).

``HeadGates(model)`` routes every self-attention layer of a BERT-family encoder or a
Llama/GPT-style decoder through our attention function, which multiplies head ``h``'s output
(before W^O) by ``ξ[layer, h]``: ξ = 0 removes the head's contribution exactly, ξ = 1 changes
nothing, and ξ is differentiable. With grouped-query attention each *query* head has its own
gate. ``values`` may also hold one gate per example, (L, B, H), which is how
:func:`multihead.heads.head_importance` gets per-example gradients from one backward pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from .capture import GATE_ATTRIBUTE, REPLACEMENT_ATTRIBUTE, UNIFORM_ATTRIBUTE, restore, route_through_capture
from .load import ModelLike, as_module
from .sites import AttentionSite, UnsupportedModelError, find_sites, main_stack

__all__ = ["HeadGates", "gate_gradients_only", "replica_gates", "self_attention_sites"]


def self_attention_sites(model: ModelLike, stack: str | None = None) -> list[AttentionSite]:
    """The sites of one self-attention stack (default: the model's only one), in layer order."""
    sites = find_sites(model)
    stack = stack if stack is not None else main_stack(sites)
    return [s for s in sites if s.stack == stack]


def replica_gates(num_layers: int, num_heads: int, groups: list[list[tuple[int, int]]], batch: int) -> Tensor:
    """Per-example gates (L, R·B, H) for a batch of B repeated R = len(groups) times: replica r has
    the heads of ``groups[r]`` removed (ξ = 0), every other head intact."""
    gates = torch.ones(num_layers, len(groups) * batch, num_heads)
    for r, group in enumerate(groups):
        for layer, h in group:
            gates[layer, r * batch:(r + 1) * batch, h] = 0
    return gates


@contextlib.contextmanager
def gate_gradients_only(model: ModelLike) -> Iterator[None]:
    """While inside, the model's weights take no gradient: a backward pass then computes only what
    the gates (or other inputs) need, not the weights' gradients too (half the backward)."""
    params = [p for p in as_module(model).parameters() if p.requires_grad]
    try:
        for p in params:
            p.requires_grad_(False)
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


class HeadGates:
    """Gates ξ (L, H) — or (L, B, H) per example — on a transformers model; use as a context
    manager or call :meth:`remove`. ``stack``: which stack's heads (default: the model's only
    self-attention stack)."""

    def __init__(self, model: ModelLike, values: Tensor | None = None, *, stack: str | None = None,
                 replacement: Tensor | None = None) -> None:
        """``replacement``: the outputs a gated-off head is replaced by — ``out = ξ·out +
        (1 − ξ)·replacement`` — (L, H, Dv), e.g. each head's mean output (mean ablation), or
        (L, B, H, T, Dv) per example and position, e.g. another run's outputs (activation
        patching); default zeros."""
        model = as_module(model)
        self.model = model
        #: (layer, head) pairs whose attention is replaced by uniform attention over visible keys
        self.uniform: set[tuple[int, int]] = set()
        self._saved: list[tuple[Any, str]] = []
        self.sites = self_attention_sites(model, stack)
        shared = [s for s in self.sites if s.repeats > 1]
        if shared:
            raise UnsupportedModelError(
                f"{type(model).__name__} runs one attention module for {shared[0].repeats} layers (shared weights, as "
                "ALBERT does), so a head cannot be gated in one layer alone; its maps can be captured")
        self.modules = [s.module for s in self.sites]
        self.num_layers, self.num_heads = len(self.sites), max(s.num_heads for s in self.sites)
        self.values = values if values is not None else torch.ones(self.num_layers, self.num_heads)
        if all(s.ours for s in self.sites):  # our own layers take the gates directly
            if replacement is not None:
                raise ValueError("replacement outputs (mean ablation) are for transformers models; "
                                 "our own layers take gates only")
            for index, layer in enumerate(self.modules):
                layer._gate_override = self._gate_of(index)
            return
        if replacement is not None and not (
                (replacement.dim() == 3 and replacement.shape[:2] == (self.num_layers, self.num_heads))
                or (replacement.dim() == 5 and replacement.shape[0] == self.num_layers
                    and replacement.shape[2] == self.num_heads)):
            raise ValueError(f"replacement must be (L, H, Dv) or (L, B, H, T, Dv) with L, H = {self.num_layers}, "
                             f"{self.num_heads}; got {tuple(replacement.shape)}")
        for index, module in enumerate(self.modules):
            setattr(module, GATE_ATTRIBUTE, self._gate_of(index))
            setattr(module, UNIFORM_ATTRIBUTE, self._uniform_of(index))
            if replacement is not None:
                setattr(module, REPLACEMENT_ATTRIBUTE, lambda r=replacement[index]: r)
        self._saved = route_through_capture(model)

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
        for site in self.sites:
            if site.ours:
                site.module._gate_override = None
                continue
            for name in (GATE_ATTRIBUTE, UNIFORM_ATTRIBUTE, REPLACEMENT_ATTRIBUTE):
                if hasattr(site.module, name):
                    delattr(site.module, name)
        restore(self._saved)
        self._saved = []

    def __enter__(self) -> HeadGates:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
