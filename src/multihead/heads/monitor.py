"""Per-head gradient norms during training, and the heads whose gradients stay near zero.

For head ``h`` of a layer, the Q slice is the ``Dk`` rows of W^Q (and bias) that make its
queries, the O slice the ``Dv`` columns of W^O that read its output; K and V slices belong to
key/value heads (with grouped-query attention, ``H / Hkv`` query heads share one).

| key | shape | value |
|---|---|---|
| ``q`` / ``o`` | (L, H) | ‖∂L/∂W^Q_h‖ / ‖∂L/∂W^O_h‖ (Frobenius, bias rows included for Q) |
| ``k`` / ``v`` | (L, Hkv) | the same for each key/value head |
| ``total`` | (L, H) | ``sqrt(q² + o²)``: the slices head ``h`` owns alone (with grouped-query |
|  |  | attention K/V are shared, so a gated-off query head would still show its group's K/V) |

A head is reported *dead* when its mean ``total`` over the recorded steps is below
``threshold`` × the median of every head's mean (default 1%).

Works on our :class:`~multihead.MultiHeadAttention`, Hugging Face BERT-family attention blocks
and Llama/GPT-style attention modules (``q_proj``/``k_proj``/``v_proj``/``o_proj``). Each step
appends one JSON line; with ``tensorboard=DIR`` and TensorBoard installed, scalars too.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..hf.model import ModelLike
from ..jsonable import json_matrix

__all__ = ["AttentionProjections", "GradientMonitor", "find_attention_projections"]


@dataclass
class AttentionProjections:
    """Where one self-attention layer keeps its per-head weights."""

    name: str
    q: nn.Linear
    k: nn.Linear
    v: nn.Linear
    o: nn.Linear
    num_heads: int
    num_kv_heads: int


def find_attention_projections(model: ModelLike) -> list[AttentionProjections]:
    """Every self-attention layer of ``model`` with separate Q/K/V/O projections, in module order
    (read from :func:`multihead.hf.sites.find_sites`; cross-attention skipped)."""
    from ..hf.sites import find_sites

    found = []
    for site in find_sites(model):
        if site.kind == "self" and all(isinstance(p, nn.Linear) for p in (site.q, site.k, site.v, site.o)):
            found.append(AttentionProjections(site.name, site.q, site.k, site.v, site.o, site.num_heads,
                                              site.num_kv_heads))
    return found


def _row_norms(linear: nn.Linear, groups: int) -> Tensor:
    """(groups,) norm of the gradient of each group of output rows (weight and bias)."""
    if linear.weight.grad is None:
        return torch.zeros(groups, dtype=torch.float64)
    g = linear.weight.grad.detach().to(torch.float64).reshape(groups, -1)  # (groups, rows·in)
    sq = g.square().sum(-1)
    if linear.bias is not None and linear.bias.grad is not None:
        sq += linear.bias.grad.detach().to(torch.float64).reshape(groups, -1).square().sum(-1)
    return sq.sqrt().cpu()


def _column_norms(linear: nn.Linear, groups: int) -> Tensor:
    if linear.weight.grad is None:
        return torch.zeros(groups, dtype=torch.float64)
    g = linear.weight.grad.detach().to(torch.float64)  # (D, groups·Dv)
    return g.reshape(g.shape[0], groups, -1).square().sum(dim=(0, 2)).sqrt().cpu()


class GradientMonitor:
    """Record per-head gradient norms after each backward (call :meth:`step`, or :meth:`attach`
    to an optimizer so every ``optimizer.step()`` records first)."""

    def __init__(self, model: ModelLike, path: str | Path | None = None, *, tensorboard: str | Path | None = None,
                 every: int = 1) -> None:
        self.layers = find_attention_projections(model)
        if not self.layers:
            raise ValueError(f"{type(model).__name__} has no attention layer with per-head projections to monitor")
        if every < 1:
            raise ValueError(f"every must be a positive integer; got {every}")
        self.every = every
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = None
        if tensorboard is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # TensorBoard is optional; JSONL always works
                self._writer = None
            else:
                self._writer = SummaryWriter(str(tensorboard))
        self._calls = 0
        self.steps = 0
        self._sum_total: Tensor | None = None
        self._hook = None

    def norms(self) -> dict[str, Tensor]:
        """The current gradients' per-head norms (see the module table)."""
        q, k, v, o, total = [], [], [], [], []
        H = max(p.num_heads for p in self.layers)
        Hkv = max(p.num_kv_heads for p in self.layers)
        for p in self.layers:
            nq, no = _row_norms(p.q, p.num_heads), _column_norms(p.o, p.num_heads)
            nk, nv = _row_norms(p.k, p.num_kv_heads), _row_norms(p.v, p.num_kv_heads)
            q.append(_pad(nq, H))
            o.append(_pad(no, H))
            k.append(_pad(nk, Hkv))
            v.append(_pad(nv, Hkv))
            total.append(_pad((nq.square() + no.square()).sqrt(), H))
        return {"q": torch.stack(q), "k": torch.stack(k), "v": torch.stack(v), "o": torch.stack(o),
                "total": torch.stack(total)}

    def step(self, step: int | None = None) -> dict[str, Tensor] | None:
        """Record the gradients now held by the model (every ``every``-th call); returns the norms."""
        self._calls += 1
        if (self._calls - 1) % self.every:
            return None
        step = self._calls - 1 if step is None else step
        norms = self.norms()
        self._sum_total = norms["total"] if self._sum_total is None else self._sum_total + norms["total"]
        self.steps += 1
        if self.path is not None:
            record = {"step": step, **{key: json_matrix(value, 6, significant=True) for key, value in norms.items()}}
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        if self._writer is not None:
            for layer, row in enumerate(norms["total"].tolist()):
                for head, value in enumerate(row):
                    self._writer.add_scalar(f"head_grad_norm/L{layer}.H{head}", value, step)
        return norms

    def attach(self, optimizer: torch.optim.Optimizer) -> GradientMonitor:
        """Record before every ``optimizer.step()``."""
        def record(*_: object) -> None:  # a pre-hook must return None
            self.step()

        self._hook = optimizer.register_step_pre_hook(record)
        return self

    def mean_total(self) -> Tensor:
        """(L, H) mean ``total`` over the recorded steps."""
        if self._sum_total is None:
            raise ValueError("no gradient recorded yet: call step() after a backward pass")
        return self._sum_total / self.steps

    def dead_heads(self, threshold: float = 0.01) -> list[tuple[int, int, float]]:
        """(layer, head, mean total norm) of heads below ``threshold`` × the median head."""
        mean = self.mean_total()
        median = float(mean[~mean.isnan()].median())
        return [(layer, head, float(mean[layer, head])) for layer, head in
                (mean < threshold * median).nonzero().tolist()]

    def close(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._writer is not None:
            self._writer.close()


def _pad(x: Tensor, n: int) -> Tensor:
    return torch.cat([x, torch.full((n - len(x),), math.nan, dtype=x.dtype)]) if len(x) < n else x
