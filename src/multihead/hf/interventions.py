"""Interventions at named layers: head gates, uniform heads, replacement outputs, extra masks.

``HeadGates(model)`` multiplies head ``h``'s output (before W^O) of every layer of one stack by
``ξ[layer, h]``: ξ = 0 removes the head's contribution exactly, ξ = 1 changes nothing, and ξ is
differentiable (transformers v5 removed ``head_mask``). With grouped-query attention each *query*
head has its own gate. ``values`` may also hold one gate per example, (L, B, H), which is how
:func:`multihead.heads.head_importance` gets per-example gradients from one backward pass. A
module that computes several layers (ALBERT's shared weights) is gated call by call: each of its
layers has its own gates.

``replace_attention(model, mask)`` makes the chosen layers attend only where their own mask *and*
``mask`` allow: ``mh.masks.window(256) | mh.masks.global_tokens(range(4))`` is StreamingLLM's
recipe (a ±256 window and four sinks); the local and sparse kernels then compute only the band.

Both are :class:`~multihead.hf.route.Attachment` objects: they act through the one routed call of
:mod:`multihead.hf.route`, for transformers models and our own layers alike.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import Tensor

from ..masks import Mask
from .model import ModelLike, as_module
from .placement import GATES_ACTING, swapped_weights_saved_by_name
from .route import Attachment
from .sites import AttentionSite, find_sites, main_stack, select

__all__ = ["HeadGates", "gate_gradients_only", "replace_attention", "replica_gates", "self_attention_sites"]


def self_attention_sites(model: ModelLike, stack: str | None = None, *,
                         sites: list[AttentionSite] | None = None) -> list[AttentionSite]:
    """The sites of one self-attention stack (default: the model's only one), in layer order;
    ``sites``: the model's (:func:`~multihead.hf.sites.find_sites`), where already found."""
    sites = find_sites(model) if sites is None else sites
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
    the gates (or other inputs) need, not the weights' gradients too (half the backward). The
    weights an offload hook swaps in are saved for the backward by name, not held
    (:func:`~multihead.hf.placement.swapped_weights_saved_by_name`).

    On leaving, the weights that took one take one again, found by name among the module's
    parameters *then*: accelerate's offload hooks replace an offloaded module's parameters on every
    pass (new ones, with the old ones' ``requires_grad``, made under inference mode when the pass
    was), so the objects seen on entry may be gone."""
    module = as_module(model)
    # every name of a tied weight: the hooks may untie it, each module getting a parameter of its own
    wanted = {name for name, p in module.named_parameters(remove_duplicate=False) if p.requires_grad}
    try:
        for p in module.parameters():
            p.requires_grad_(False)
        with swapped_weights_saved_by_name(module):
            yield
    finally:
        for name, p in module.named_parameters(remove_duplicate=False):
            if name in wanted and not p.requires_grad:
                # an inference tensor (a weight an offload hook made during an inference-mode pass)
                # may be flagged only inside inference mode
                with torch.inference_mode(p.is_inference()):
                    p.requires_grad_(True)


class HeadGates(Attachment):
    """Gates ξ (L, H) — or (L, B, H) per example — on every layer of one stack; use as a context
    manager or call :meth:`remove`. ``stack``: which stack's heads (default: the model's only
    self-attention stack)."""

    def __init__(self, model: ModelLike, values: Tensor | None = None, *, stack: str | None = None,
                 replacement: Tensor | None = None) -> None:
        """``replacement``: the outputs a gated-off head is replaced by — ``out = ξ·out +
        (1 − ξ)·replacement`` — (L, H, Dv), e.g. each head's mean output (mean ablation), or
        (L, B, H, T, Dv) per example and position, e.g. another run's outputs (activation
        patching); default zeros."""
        self.model = as_module(model)
        #: (layer, head) pairs whose attention is replaced by uniform attention over visible keys
        self.uniform_heads: set[tuple[int, int]] = set()
        self.sites = self_attention_sites(self.model, stack)
        self.modules = [s.module for s in self.sites]
        self.num_layers = sum(len(s.layers) for s in self.sites)
        self.num_heads = max(s.num_heads for s in self.sites)
        self.values = values if values is not None else torch.ones(self.num_layers, self.num_heads)
        if replacement is not None and not (
                (replacement.dim() == 3 and replacement.shape[:2] == (self.num_layers, self.num_heads))
                or (replacement.dim() == 5 and replacement.shape[0] == self.num_layers
                    and replacement.shape[2] == self.num_heads)):
            raise ValueError(f"replacement must be (L, H, Dv) or (L, B, H, T, Dv) with L, H = {self.num_layers}, "
                             f"{self.num_heads}; got {tuple(replacement.shape)}")
        self.fill = replacement
        self.where = [(s, layer) for s in self.sites for layer in s.layers]
        self.__enter__()  # the gates act from here on (also without a with block) until removed

    def __enter__(self) -> HeadGates:
        super().__enter__()
        acting = getattr(self.model, GATES_ACTING, None)
        if acting is None:  # the model's placement says which heads its gates turn down (a report records it)
            acting = weakref.WeakSet()
            object.__setattr__(self.model, GATES_ACTING, acting)
        acting.add(self)
        return self

    def remove(self) -> None:
        super().remove()
        acting = getattr(self.model, GATES_ACTING, None)
        if acting is not None:
            acting.discard(self)

    def gates(self, site: AttentionSite, layer: int) -> Tensor:
        v = self.values
        if v.shape[0] != self.num_layers or v.shape[-1] != self.num_heads or v.dim() not in (2, 3):
            raise ValueError(f"gates must be (L, H) = ({self.num_layers}, {self.num_heads}) or (L, B, H); "
                             f"got {tuple(v.shape)}")
        return v[layer]

    def uniform(self, site: AttentionSite, layer: int) -> Sequence[int]:
        return sorted(h for at, h in self.uniform_heads if at == layer)

    def replacement(self, site: AttentionSite, layer: int) -> Tensor | None:
        return None if self.fill is None else self.fill[layer]


class replace_attention(Attachment):  # noqa: N801 - used as a context manager, like torch.no_grad
    """Context manager: the chosen ``layers`` attend only where ``mask`` (True = may attend) and the
    model's own mask both allow. ``layers``: layer numbers of the model's self-attention stack, or
    layer names (``"decoder.3"``); default every layer of that stack."""

    def __init__(self, model: ModelLike, mask: Mask, *, layers: Iterable[int | str] | None = None) -> None:
        if not isinstance(mask, Mask):
            raise TypeError(f"replace_attention takes a multihead Mask (e.g. masks.window(256)); got "
                            f"{type(mask).__name__}")
        self.model = as_module(model)
        sites = find_sites(self.model)
        stack = main_stack(sites)
        every = select(self.model, stack, sites=sites)
        if layers is None:
            self.where = every
        else:
            chosen = list(layers)
            bad = [x for x in chosen if isinstance(x, int) and not 0 <= x < len(every)]
            if bad:
                raise ValueError(f"layers {bad} out of range; the model has {len(every)} attention layers")
            names = [f"{stack}.{x}" if isinstance(x, int) else str(x) for x in chosen]
            self.where = select(self.model, names, sites=sites)
        self.extra = mask

    def mask(self, site: AttentionSite, layer: int) -> Mask:
        return self.extra
