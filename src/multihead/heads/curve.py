"""Iterative pruning (Michel et al. 2019, §4): remove the least important heads step by step and
record the task metric against the fraction of heads pruned.

Each step gates off ``per_step`` of the *remaining* heads (at least one), those with the lowest
gradient importance — re-estimated under the current gates when ``reestimate`` (the default),
or ranked once at the start — then evaluates the task on its held-out split. It stops after
``steps`` steps, when every head is gone, or when the metric falls below ``stop_below`` × the
unpruned metric. Gating is exact (a gated head contributes nothing), so the curve is the one
physical pruning gives (see :mod:`.prune`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..files import write_atomically
from ..hf.interventions import HeadGates
from ..progress import counted, note
from .importance import head_importance
from .tasks import Task

__all__ = ["SCHEMA", "PruningCurve", "PruningStep", "pruning_curve"]

SCHEMA = "multihead.pruning/1"


@dataclass
class PruningStep:
    step: int
    fraction_pruned: float
    heads_pruned: int
    metric: float
    pruned: list[tuple[int, int]]  # every head pruned so far, (layer, head)


@dataclass
class PruningCurve:
    task: str
    metric_name: str
    model: str
    total_heads: int
    baseline: float
    steps: list[PruningStep] = field(default_factory=list)
    #: where and in what precision the model ran (``bfloat16 on cpu``): a bfloat16 curve and a
    #: float32 one differ in their last digits and sometimes in the heads pruned
    placement: str | None = None

    def prunable_within(self, tolerance: float = 0.01) -> PruningStep | None:
        """The step with the largest fraction pruned whose metric is ≥ (1 - tolerance) × baseline."""
        ok = [s for s in self.steps if s.metric >= (1 - tolerance) * self.baseline]
        return max(ok, key=lambda s: s.fraction_pruned, default=None)

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps({"schema": SCHEMA, **asdict(self)}, indent=1)
        if path is not None:
            write_atomically(path, text)
        return text

    def table(self) -> str:
        lines = [f"| step | heads pruned | fraction | {self.metric_name} | vs unpruned |", "|---|---|---|---|---|",
                 f"| 0 | 0 | 0.00 | {self.baseline:.4f} | 1.000 |"]
        lines += [f"| {s.step} | {s.heads_pruned} | {s.fraction_pruned:.2f} | {s.metric:.4f} | "
                  + (f"{s.metric / self.baseline:.3f} |" if self.baseline else "– |") for s in self.steps]
        return "\n".join(lines)

    def plot(self, path: str | Path) -> None:
        """The curve as a PNG (or SVG, by the suffix)."""
        from ..plotting import save_figure

        save_figure(self.figure(), path)

    def figure(self):
        """The curve as a matplotlib figure (metric against the fraction of heads pruned)."""
        from ..plotting import new_figure

        xs = [0.0] + [s.fraction_pruned for s in self.steps]
        ys = [self.baseline] + [s.metric for s in self.steps]
        fig, ax = new_figure(figsize=(5, 3.5), dpi=120)
        ax.plot(xs, ys, marker="o")
        ax.axhline(0.99 * self.baseline, color="grey", linestyle="--", linewidth=1, label="99% of unpruned")
        ax.set_xlabel("fraction of heads pruned")
        ax.set_ylabel(self.metric_name)
        ax.set_title(f"{self.model}: {self.task}")
        ax.legend(loc="lower left")
        fig.tight_layout()
        return fig


def _pruned_at(remaining: int, per_step: float) -> int:
    """How many heads a step prunes: ``per_step`` of those left, one at least."""
    return max(1, round(per_step * remaining))


def _steps_run(heads: int, per_step: float, steps: int) -> int:
    """How many of ``steps`` run before ``heads`` run out (:func:`_pruned_at` a step)."""
    run = 0
    while run < steps and heads > 0:
        heads -= _pruned_at(heads, per_step)
        run += 1
    return run


def pruning_curve(task: Task, *, steps: int = 10, per_step: float = 0.1, reestimate: bool = True,
                  stop_below: float | None = None, progress: bool | None = None) -> PruningCurve:
    """Prune ``task.model`` iteratively by gradient importance; the model is left unchanged."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer; got {steps!r}")
    if not 0 < per_step <= 1:
        raise ValueError(f"per_step must be in (0, 1]; got {per_step!r}")
    if stop_below is not None and not 0 < stop_below <= 1:
        raise ValueError(f"stop_below must be in (0, 1]; got {stop_below!r}")
    model = task.model.model
    with HeadGates(model) as gates:
        L, H = gates.num_layers, gates.num_heads
        mask = torch.ones(L, H)
        curve = PruningCurve(task.name, task.metric_name, task.model.name, L * H, task.evaluate(),
                             placement=getattr(task.model, "placement", None))
    if not curve.baseline > 0:  # every step is read as a share of it: of nothing, nothing is kept
        raise ValueError(f"the unpruned {task.model.name} scores {curve.baseline:.4f} {task.metric_name} on the "
                         f"{task.name} task's held-out texts, so no pruning fraction keeps a share of it (an "
                         "untrained or random-weight model?); prune a trained model or choose another --task")
    ranking = None
    runs = _steps_run(L * H, per_step, steps)  # fewer than asked where the heads run out first
    for step in range(1, steps + 1):
        remaining = int(mask.sum())
        if remaining == 0:
            break
        if ranking is None or reestimate:
            scores = head_importance(model, task.batches("train"), task.loss, gates=mask).scores
            ranking = [(int(n) // H, int(n) % H) for n in scores.flatten().argsort()]
        alive = [(layer, h) for layer, h in ranking if mask[layer, h] > 0]
        for layer, h in alive[:_pruned_at(remaining, per_step)]:
            mask[layer, h] = 0
        with HeadGates(model, values=mask.clone()):
            metric = task.evaluate()
        pruned = [(layer, h) for layer in range(L) for h in range(H) if mask[layer, h] == 0]
        curve.steps.append(PruningStep(step, len(pruned) / (L * H), len(pruned), metric, pruned))
        # a progress line like the load's before it (held with them in a quick run off a terminal: in order)
        of = f"{step} of at most {runs}" if stop_below is not None else f"{step}/{runs}"
        note(f"pruning step {of}: {counted(len(pruned), 'head')} pruned, {task.metric_name} {metric:.4f}",
             progress=progress)
        if stop_below is not None and metric < stop_below * curve.baseline:
            break
    return curve
