"""Which heads matter: gradient importance (Michel et al. 2019) and ablation importance.

Gradient importance of head h: ``I_h = E_x |∂L(x)/∂ξ_h|`` with ξ the head gates at 1. The
absolute value is taken **per example**: each example of a batch gets its own copy of the gates,
(L, B, H), so one backward pass of the summed loss yields every example's own gradient. (The
bertology script behind the paper takes ``|·|`` of the gradient of a whole batch's loss, so
examples whose gradients disagree in sign cancel before the absolute value; its numbers depend
on the batch size, ours do not — tested.) Optionally each layer's scores are divided by their ℓ2
norm, as the paper does before comparing heads across layers.

Ablation importance of head h: the drop of a task metric when h alone is gated off (or, with
``mode="uniform"``, when its attention is replaced by uniform attention over the keys it may
see, as in Kovaleva et al. 2019). L·H evaluations instead of one backward per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..hf.interventions import HeadGates, gate_gradients_only
from ..hf.model import ModelLike, as_module
from ..hf.placement import input_device
from ..progress import bar

__all__ = ["HeadImportance", "ablation_importance", "head_importance", "spearman"]

LossFn = Callable[[Any, dict[str, Tensor]], Tensor]  # (model outputs, batch) -> (B,) per-example losses


@dataclass
class HeadImportance:
    scores: Tensor  # (L, H), normalised per layer if asked
    raw: Tensor  # (L, H) E_x |∂L/∂ξ|
    examples: int

    def ranking(self) -> list[tuple[int, int, float]]:
        """(layer, head, score) from least to most important."""
        H = self.scores.shape[1]
        order = self.scores.flatten().argsort()
        return [(int(n) // H, int(n) % H, float(self.scores.flatten()[n])) for n in order]

    def table(self) -> str:
        L, H = self.scores.shape
        lines = ["layer | " + " ".join(f"h{h:<5d}" for h in range(H))]
        lines += [f"{layer:5d} | " + " ".join(f"{float(v):<6.3f}" for v in self.scores[layer]) for layer in range(L)]
        return "\n".join(lines)


#: What a batch may hand the model (the rest is the loss's): text ids and masks, a vision model's
#: pixels, a speech model's samples or features, an encoder-decoder's decoder side.
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "pixel_values", "input_values", "input_features",
                "decoder_input_ids", "decoder_attention_mask")


def _model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in batch.items() if k in MODEL_INPUTS}


def _examples(batch: dict[str, Any]) -> int:
    """How many examples the batch holds: its first model input's leading size."""
    for key in MODEL_INPUTS:
        if isinstance(batch.get(key), Tensor):
            return int(batch[key].shape[0])
    raise ValueError(f"a batch holds none of the model's inputs ({', '.join(MODEL_INPUTS[:5])}, …); "
                     f"got {', '.join(map(repr, batch)) or 'nothing'}")


def head_importance(model: ModelLike, batches: Iterable[dict[str, Tensor]], loss_fn: LossFn, *,
                    normalize: bool = True, gates: Tensor | None = None) -> HeadImportance:
    """Gradient importance of every head of a transformers ``model`` over ``batches``.

    ``batches`` yield dicts with the model's inputs (``input_ids``, ``attention_mask``; a vision
    model's ``pixel_values``: :data:`MODEL_INPUTS`) and whatever ``loss_fn`` needs;
    ``loss_fn(outputs, batch)`` returns per-example losses (B,).
    ``gates`` (L, H): the gate values to take gradients at (default all ones; pruned heads 0).
    The model's parameters get no gradient (only the gates do). ``model``: what
    :func:`multihead.hf.load` returns, or a bare module.
    """
    model = as_module(model)
    device = input_device(model)  # where the inputs (and the loss's targets) go
    was_training = model.training
    model.eval()
    total: Tensor | None = None
    examples = 0
    try:
        # the weights take no gradient (an offloaded model's too: their flags are set by name on leaving,
        # and what an offload hook swaps in is saved for the backward by name, not held)
        with gate_gradients_only(model), HeadGates(model) as installed:
            start = gates if gates is not None else torch.ones(installed.num_layers, installed.num_heads)
            if start.shape != (installed.num_layers, installed.num_heads):
                raise ValueError(f"gates must be (L, H) = ({installed.num_layers}, {installed.num_heads}); "
                                 f"got {tuple(start.shape)}")
            for batch in batches:
                batch = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}
                B = _examples(batch)
                values = start[:, None, :].expand(-1, B, -1).clone().requires_grad_(True)  # (L, B, H)
                installed.values = values
                losses = loss_fn(model(**_model_inputs(batch)), batch)
                if losses.shape != (B,):
                    raise ValueError(f"loss_fn must return one loss per example, shape ({B},); "
                                     f"got {tuple(losses.shape)}")
                losses.sum().backward()
                assert values.grad is not None
                part = values.grad.abs().sum(1).to(torch.float64)  # (L, H)
                total = part if total is None else total + part
                examples += B
    finally:
        model.train(was_training)
    if total is None or examples == 0:
        raise ValueError("no batch to estimate head importance on")
    raw = total / examples
    scores = raw / raw.norm(dim=-1, keepdim=True).clamp_min(1e-20) if normalize else raw.clone()
    return HeadImportance(scores, raw, examples)


def ablation_importance(model: ModelLike, evaluate: Callable[[], float], *, mode: str = "zero",
                        heads: Iterable[tuple[int, int]] | None = None, progress: bool = False
                        ) -> tuple[Tensor, float]:
    """(L, H) drop of ``evaluate()`` when each head alone is removed, and the unablated value.

    ``heads``: only these (layer, head) pairs (the others' drop is NaN); default every head.

    ``mode="zero"`` gates the head off; ``mode="uniform"`` replaces its attention by uniform
    attention over its visible keys.
    """
    if mode not in ("zero", "uniform"):
        raise ValueError(f"mode must be 'zero' or 'uniform'; got {mode!r}")
    model = as_module(model)
    with HeadGates(model) as gates:
        base = float(evaluate())
        drop = torch.full((gates.num_layers, gates.num_heads), float("nan"), dtype=torch.float64)
        cells = list(heads) if heads is not None else \
            [(layer, h) for layer in range(gates.num_layers) for h in range(gates.num_heads)]
        for layer, h in bar(cells, desc="ablation", unit="head", progress=progress):
            values = torch.ones(gates.num_layers, gates.num_heads)
            if mode == "zero":
                values[layer, h] = 0
                gates.values = values
            else:
                gates.values = values
                gates.uniform_heads = {(layer, h)}
            drop[layer, h] = base - float(evaluate())
            gates.uniform_heads = set()
        gates.values = torch.ones(gates.num_layers, gates.num_heads)
    return drop, base


def _ranks(x: Tensor) -> Tensor:
    """Average ranks (ties share the mean of their positions), as Spearman's rho needs."""
    x = x.flatten().to(torch.float64)
    order = x.argsort()
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(len(x), dtype=torch.float64)
    for value in x.unique():
        tied = x == value
        if int(tied.sum()) > 1:
            ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman rank correlation of two same-shaped tensors."""
    if a.shape != b.shape:
        raise ValueError(f"spearman needs equal shapes; got {tuple(a.shape)} and {tuple(b.shape)}")
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()).clamp_min(1e-20))
