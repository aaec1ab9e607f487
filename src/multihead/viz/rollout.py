"""Attention rollout and flow of one text through a real model (see :mod:`multihead.analysis.rollout`)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ..analysis.rollout import FLOW_TOKENS, attention_flow, attention_rollout
from ..hf.load import HFModel
from .maps import attention_maps

__all__ = ["Rollout", "rollout"]


@dataclass
class Rollout:
    """One text's tokens, its rollout (L, T, T) and — for texts of at most FLOW_TOKENS — its flow
    (L, T, T), NaN at the layers it was not solved for."""

    tokens: list[str]
    rollout: Tensor
    flow: Tensor | None
    residual: float

    def figure(self, layers: list[int] | None = None):
        """The rollout (and flow) at a few layers, as a matplotlib figure."""
        from .figures import rollout_grid

        return rollout_grid(self.tokens, self.rollout, self.flow, layers=layers)


def rollout(model: HFModel, text: str, *, flow: bool | None = None, flow_layers: list[int] | None = None,
            residual: float = 0.5) -> Rollout:
    """Capture every head's attention on ``text`` and roll it out through the layers. ``flow``:
    also solve attention flow (None: when the text has at most FLOW_TOKENS tokens) at
    ``flow_layers`` (default: the last layer — every layer costs about L/2 times more)."""
    tokens, maps = attention_maps(model, text)  # (L, H, T, T)
    if flow is None:
        flow = len(tokens) <= FLOW_TOKENS
    layers = flow_layers if flow_layers is not None else [maps.shape[0] - 1]
    return Rollout(tokens, attention_rollout(maps, residual=residual),
                   attention_flow(maps, residual=residual, layers=layers) if flow else None, residual)
