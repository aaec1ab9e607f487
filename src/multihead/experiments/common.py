"""What every experiment shares: the settings, one training loop, a cache of trained runs, the
redundancy of a trained model's heads, and the files an experiment writes.

Runs are cached under ``OUT/runs/`` by everything that determines them (task, d_model, depth, h,
seed, steps, learning rate): a sweep that is interrupted resumes where it stopped, and a later
experiment that needs a model an earlier one trained (``one-vs-many`` and ``prune-trained``
reuse the ``heads`` sweep) loads it instead of training it again.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..analysis.pipelines.analyze import CLUSTER_JS
from ..analysis.stats import HeadStatistics, RedundancyStatistics, dispatch
from ..attn.layer import MultiHeadAttention
from ..files import StagedFiles, atomic_path, write_atomically
from ..hf.capture import AttentionCapture
from ..hf.placement import PlacementError, resolve_device
from ..inputs import Batch, TokenInfo
from ..plotting import figure_png
from ..train import warmup_cosine
from .tasks import ExperimentTask

__all__ = ["SCHEMA", "SETTINGS", "RunRecord", "Setting", "fit", "head_metrics", "mean_std", "pick_device",
           "redundancy_summary", "trained_run", "welch_t", "write_result"]

SCHEMA = "multihead.experiment/1"


@dataclass(frozen=True)
class Setting:
    """The size of an experiment: ``quick`` checks the pipeline in < 2 minutes, ``full`` is the one reported."""

    name: str
    dim: int  # d_model, fixed across h: d_k = dim / h
    layers: int
    heads: tuple[int, ...]
    seeds: int
    tasks: tuple[str, ...]
    steps: dict[str, int] = field(hash=False)  # per task: the same steps x batch for every h (same compute)
    lr: float = 1e-3


SETTINGS = {
    "full": Setting("full", 128, 2, (1, 2, 4, 8, 16, 32), 3, ("lm-hamlet", "multi-relation", "sentiment"),
                    {"lm-hamlet": 250, "lm-treebank": 250, "multi-relation": 500, "sentiment": 300}, 2e-3),
    "quick": Setting("quick", 32, 2, (1, 4), 2, ("lm-hamlet", "multi-relation", "sentiment"),
                     {"lm-hamlet": 4, "lm-treebank": 4, "multi-relation": 4, "sentiment": 4}, 2e-3),
}


def pick_device(name: str = "auto") -> torch.device:
    """``auto``: the first CUDA GPU, else the CPU; else the device named, where it is there.
    ValueError naming ``--device`` for a name that is no device (``gpu``, ``meta``) or one not here."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = resolve_device(name)
    except PlacementError as err:
        raise ValueError(f"--device {err.detail}") from err
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {name!r}: the experiments train on cpu or cuda[:N] (or auto)")
    return device


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _to(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def fit(model: nn.Module, batch: Callable[[int], dict], loss: Callable[[nn.Module, dict], Tensor], *, steps: int,
        lr: float = 1e-3, cosine: bool = True, device: torch.device | None = None, every: int | None = None,
        on_step: Callable[[int, nn.Module], None] | None = None) -> list[tuple[int, float]]:
    """Train ``model`` for ``steps`` AdamW steps on ``batch(step)`` (moved to ``device``), minimising
    ``loss(model, batch)``; gradients clipped to norm 1.0; the learning rate ``lr`` with 10% warm-up
    and cosine decay (``cosine``) or constant.

    Returns the training loss every ``every`` steps and at the last; ``on_step(step, model)`` is
    called before step 0 and after every step, with the number of steps taken (the experiments
    that track heads over training use it). The model is left in eval mode.
    """
    device = device or next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, max(1, steps // 10), steps)) \
        if cosine else None
    every = every or max(1, steps // 50)
    history = []
    model.train()
    if on_step is not None:
        on_step(0, model)
    for step in range(steps):
        value = loss(model, _to(batch(step), device))
        opt.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if sched is not None:
            sched.step()
        if step % every == 0 or step == steps - 1:
            history.append((step, round(value.item(), 5)))
        if on_step is not None:
            on_step(step + 1, model)
    model.eval()
    return history


@dataclass
class RunRecord:
    task: str
    heads: int
    seed: int
    dim: int
    layers: int
    steps: int
    lr: float
    parameters: int
    seconds: float
    metrics: dict[str, float]
    history: list[tuple[int, float]]
    redundancy: dict[str, float] | None = None
    extra: dict = field(default_factory=dict)


def _key(task: ExperimentTask, setting: Setting, heads: int, seed: int) -> str:
    return f"{task.key}-d{setting.dim}-L{setting.layers}-h{heads}-s{seed}-n{setting.steps[task.name]}-lr{setting.lr:g}"


def trained_run(task: ExperimentTask, setting: Setting, heads: int, seed: int, runs: Path,
                device: torch.device) -> tuple[RunRecord, nn.Module]:
    """Train (or load from ``runs``) one model of the sweep; returns its record and the model (eval mode)."""
    from safetensors.torch import load_file, save_file

    key = _key(task, setting, heads, seed)
    record_path, weights_path = runs / f"{key}.json", runs / f"{key}.safetensors"
    torch.manual_seed(seed)
    model = task.build(heads, setting.dim, setting.layers).to(device)
    if record_path.is_file() and weights_path.is_file():
        try:
            record = RunRecord(**json.loads(record_path.read_text(encoding="utf-8")))
            model.load_state_dict(load_file(str(weights_path), device=str(device)))
            return record, model.eval()
        except (ValueError, TypeError, KeyError, RuntimeError) as err:
            log(f"  cached run {record_path.name} is unreadable ({err}); training it again")
    start = time.perf_counter()
    history = fit(model, lambda step: task.train_batch(step, seed),
                  lambda m, b: task.example_loss(m(**task.inputs(b)), b).mean(),
                  steps=setting.steps[task.name], lr=setting.lr, device=device)
    seconds = time.perf_counter() - start
    metrics = task.evaluate(model)
    extra = {"per_relation": task.per_relation(model)} if hasattr(task, "per_relation") else {}
    record = RunRecord(task.name, heads, seed, setting.dim, setting.layers, setting.steps[task.name], setting.lr,
                       sum(p.numel() for p in model.parameters()), round(seconds, 2), metrics, history,
                       redundancy_summary(model, task) if heads > 1 else None, extra)
    runs.mkdir(parents=True, exist_ok=True)
    with atomic_path(weights_path) as tmp:  # a kill mid-write leaves no torn weights beside a record
        save_file({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}, str(tmp))
    write_atomically(record_path, json.dumps(asdict(record), indent=1))  # last: a run with a record is complete
    log(f"  {task.name} h={heads} seed {seed}: {task.metric} {metrics[task.metric]:.4f} ({seconds:.1f} s)")
    return record, model


@torch.no_grad()
def redundancy_summary(model: nn.Module, task: ExperimentTask, batches: int = 2) -> dict[str, float]:
    """How alike the heads of each layer are, on held-out batches (the analysis module's measures).

    ``js_mean`` / ``js_min``: mean / smallest Jensen–Shannon distance between the attention of two
    heads of the same layer (0 = identical); ``cos_mean``: mean cosine of two same-layer heads'
    contributions to the residual stream; ``near_duplicate``: share of heads with a same-layer
    partner closer than the clustering threshold (JS < 0.2).
    """
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    L, H = len(layers), layers[0].num_heads
    red = RedundancyStatistics(L, H)
    device = next(model.parameters()).device
    model.eval()
    with AttentionCapture(model, dispatch([red])):
        for batch in task.eval_batches()[:batches]:
            batch = _to(batch, device)
            ids = batch["input_ids"]
            valid = batch.get("attention_mask", torch.ones_like(ids)).bool()
            none = torch.zeros_like(valid)
            red.begin_batch(Batch(TokenInfo(valid, none, none, none), list(range(ids.shape[0]))))
            model(**task.inputs(batch))
            red.end_batch()
    red.result()
    js, cos = red.js(), red.cosine()
    same = torch.zeros(L * H, L * H, dtype=torch.bool)
    for layer in range(L):
        same[layer * H:(layer + 1) * H, layer * H:(layer + 1) * H] = True
    same.fill_diagonal_(False)
    pair_js = js[same]
    nearest = js.masked_fill(~same, math.inf).min(-1).values
    return {"js_mean": float(pair_js.mean()), "js_min": float(pair_js.min()), "cos_mean": float(cos[same].mean()),
            "near_duplicate": float((nearest < CLUSTER_JS).double().mean())}


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    m = sum(values) / n
    return m, (math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0)


def welch_t(a: list[float], b: list[float]) -> float:
    """Welch's t statistic of mean(a) - mean(b) (NaN when it is undefined)."""
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    se = math.sqrt(sa**2 / len(a) + sb**2 / len(b)) if len(a) > 1 and len(b) > 1 else math.nan
    if not se:
        return math.inf if ma != mb else 0.0
    return (ma - mb) / se


def _finite(value: Any) -> Any:
    """``value`` with every number that is not finite as None (JSON has no NaN or Infinity), numbers
    of other types (NumPy's, a 0-d tensor) as floats, any nesting of dicts and lists."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, bool | int | str) or value is None:
        return value
    number = float(value)
    return number if math.isfinite(number) else None


def write_result(folder: Path, name: str, setting: Setting, data: dict, markdown: str, figures: dict,
                 seconds: float) -> Path:
    """result.json, result.md and one PNG per figure in ``folder``, replacing an earlier result
    together (:class:`~multihead.files.StagedFiles`); returns the folder."""
    payload = {"schema": SCHEMA, "experiment": name, "setting": asdict(setting), "seconds": round(seconds, 1),
               "device": str(data.pop("_device", "cpu")), "torch": torch.__version__, **data}
    header = (f"# Experiment `{name}` ({setting.name} setting)\n\n"
              f"Produced by `multihead experiment {name}{' --quick' if setting.name == 'quick' else ''}` "
              f"in {seconds / 60:.1f} min on {payload['device']} (torch {torch.__version__}).\n\n")
    with StagedFiles() as staged:
        staged.folder(folder)
        for stem, fig in figures.items():
            staged.stage(folder / f"{stem}.png", figure_png(fig, dpi=120))
        staged.stage(folder / "result.md", header + markdown.rstrip() + "\n")
        # strict JSON: a statistic that is undefined (Welch's t of one seed) or unbounded is null, not NaN
        staged.stage(folder / "result.json", json.dumps(_finite(payload), indent=1, allow_nan=False) + "\n")
        staged.commit()
    return folder


@torch.no_grad()
def head_metrics(model: nn.Module, batches: list[dict], *, first_is_special: bool = False, separator: int | None = None
                 ) -> dict[str, torch.Tensor]:
    """The analysis module's per-head means, (L, H) each, over ``batches`` of ``input_ids``
    (and ``attention_mask``): ``first_is_special`` makes position 0 the [CLS]/BOS token,
    ``separator`` is the [SEP]/EOS id."""
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    stats = HeadStatistics(len(layers), layers[0].num_heads)
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    with AttentionCapture(model, dispatch([stats])):
        for batch in batches:
            ids = batch["input_ids"].to(device)
            valid = batch.get("attention_mask", torch.ones_like(ids)).to(device).bool()
            first = torch.zeros_like(valid)
            if first_is_special:
                first[:, 0] = True
            sep = (ids == separator) & valid if separator is not None else torch.zeros_like(valid)
            info = TokenInfo(valid=valid, first=first, separator=sep, punctuation=torch.zeros_like(valid))
            stats.begin_batch(Batch(info, list(range(ids.shape[0]))))
            inputs = {"input_ids": ids}
            if "attention_mask" in batch:
                inputs["attention_mask"] = batch["attention_mask"].to(device)
            model(**inputs)
            stats.end_batch()
    model.train(was)
    return stats.result()
