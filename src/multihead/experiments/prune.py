"""``prune-trained``: the pruning curve (gradient importance, Michel et al. 2019) of the models the
``heads`` sweep trained, at h = 8 and h = 16 — how many heads can go before the task suffers?

The models come from the sweep's cache (``OUT/runs``; trained here if the sweep has not run).
Importance is estimated on training batches; each step gates off 10% of the remaining heads and
evaluates the task's held-out accuracy (next-character accuracy for the language model).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from ..attn.layer import MultiHeadAttention
from ..heads.curve import PruningCurve, pruning_curve
from ..heads.tasks import Task
from ..hf.model import HFModel
from .common import Setting, log, pick_device, trained_run, write_result
from .tasks import ExperimentTask, make_task

__all__ = ["run_prune_trained"]

PRUNE_HEADS = (8, 16)
IMPORTANCE_BATCHES = 8


@dataclass
class _TrainedTask(Task):
    """A sweep task seen through the pruning API: importance batches, per-example loss, accuracy."""

    task: ExperimentTask | None = None

    def batches(self, split: str = "train"):
        assert self.task is not None
        device = next(self.model.model.parameters()).device
        if split == "train":
            return [{k: v.to(device) for k, v in self.task.train_batch(10_000_000 + i, 0).items()}
                    for i in range(IMPORTANCE_BATCHES)]
        return self.task.eval_batches()

    def loss(self, outputs, batch):
        assert self.task is not None
        return self.task.example_loss(outputs, batch)

    def evaluate(self, split: str = "test") -> float:
        assert self.task is not None
        return self.task.evaluate(self.model.model)[self.task.accuracy_key]


def _as_model(model: nn.Module, name: str, heads: int, layers: int) -> HFModel:
    return HFModel(model, None, name, Path("."), False, layers, heads, heads, None)


def run_prune_trained(setting: Setting, out: Path, device: str = "auto") -> Path:
    start = time.perf_counter()
    dev = pick_device(device)
    counts = [h for h in PRUNE_HEADS if h in setting.heads] or [max(setting.heads)]
    curves: dict[str, dict[int, PruningCurve]] = {}
    figures = {}
    for name in setting.tasks:
        task = make_task(name)
        curves[name] = {}
        for h in counts:
            _, model = trained_run(task, setting, h, 0, out / "runs", dev)
            layers = sum(isinstance(m, MultiHeadAttention) for m in model.modules())
            adapter = _TrainedTask(model=_as_model(model, f"{h}-head model", h, layers), name=name,
                                   metric_name=task.accuracy_key, task=task)
            curve = pruning_curve(adapter, steps=12, per_step=0.1)
            curves[name][h] = curve
            best = curve.prunable_within(0.01)
            log(f"  {name} h={h}: unpruned {curve.baseline:.4f}; within 1%: "
                f"{best.fraction_pruned if best else 0:.2f} of {curve.total_heads} heads")
            figures[f"prune-{name}-h{h}"] = curve.figure()
    md = _markdown(curves)
    data = {"curves": {n: {h: c.__dict__ | {"steps": [s.__dict__ for s in c.steps]} for h, c in by_h.items()}
                       for n, by_h in curves.items()}, "_device": dev}
    return write_result(out / "prune-trained", "prune-trained", setting, data, md, figures,
                        time.perf_counter() - start)


def _markdown(curves: dict[str, dict[int, PruningCurve]]) -> str:
    lines = ["Iterative pruning by gradient importance (10% of the remaining heads per step, re-estimated on "
             f"{IMPORTANCE_BATCHES} training batches), seed-0 models of the `heads` sweep; the metric is held-out "
             "accuracy (next-character accuracy for the language model).", "",
             "| task | h | heads in all | unpruned | largest fraction pruned within 1% | within 5% | "
             "metric at ~50% pruned |",
             "|---|---|---|---|---|---|---|"]
    for name, by_h in curves.items():
        for h, c in by_h.items():
            within = [c.prunable_within(t) for t in (0.01, 0.05)]
            half = min(c.steps, key=lambda s: abs(s.fraction_pruned - 0.5), default=None)
            cells = [f"{w.fraction_pruned:.2f} ({w.heads_pruned})" if w else "0.00 (0)" for w in within]
            half_txt = f"{half.metric:.4f} at {half.fraction_pruned:.2f}" if half else "—"
            lines.append(f"| {name} | {h} | {c.total_heads} | {c.baseline:.4f} | {cells[0]} | {cells[1]} | "
                         f"{half_txt} |")
    for name, by_h in curves.items():
        for h, c in by_h.items():
            lines += ["", f"{name}, h = {h}:", "", c.table()]
    return "\n".join(lines)
