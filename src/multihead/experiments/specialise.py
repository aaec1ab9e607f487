"""``specialise``: train a small BERT-style encoder on real text and label its heads with the
analysis module's patterns at checkpoints through training — when do local, previous-token,
next-token, broad and [CLS]/[SEP] heads appear?

The encoder learns masked characters of Hamlet (first 90%; the labels are measured on 64
held-out windows of the last 10%): each window is ``[CLS]`` + 62 characters + ``[SEP]``; 15% of
the characters are chosen, of which 80% become ``[MASK]``, 10% a random character and 10% stay.
Every checkpoint's report is written to ``OUT/specialise/reports/step-NNNNN``, so two checkpoints
can be compared: ``multihead compare OUT/specialise/reports/step-00000 OUT/specialise/reports/step-03000``.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..analysis.labels import flags_for, label_for
from ..analysis.report import Report, head_records
from ..analysis.sections import Corpus, Sections
from ..hf.placement import placement_words
from ..io import write_report_folder
from ..models import Encoder, ModelConfig
from ..train import CharData, step_generator
from .common import Setting, fit, head_metrics, log, pick_device, write_result

__all__ = ["MaskedChars", "run_specialise"]

SPECIALISE_SETTINGS = {
    "full": {"dim": 128, "heads": 8, "layers": 4, "steps": 3000, "lr": 1e-3,
             "checkpoints": (0, 50, 100, 200, 400, 800, 1200, 1600, 2000, 2500, 3000)},
    "quick": {"dim": 32, "heads": 4, "layers": 2, "steps": 8, "lr": 1e-3, "checkpoints": (0, 4, 8)},
}


class MaskedChars:
    """Masked-character batches of Hamlet, a pure function of (seed, step)."""

    def __init__(self, seq_len: int = 64, batch_size: int = 32) -> None:
        self.PAD, self.CLS, self.SEP, self.MASK = 0, 1, 2, 3
        chars = CharData("hamlet", seq_len, seed=0)  # the text as character ids (its own batches unused)
        self.vocab = chars.vocab + 4
        self.ids = chars.ids + 4  # (N,) after the four special ids
        self.split = int(len(self.ids) * 0.9)
        self.seq_len, self.batch_size = seq_len, batch_size

    def _windows(self, starts: Tensor) -> Tensor:
        n = self.seq_len - 2
        body = torch.stack([self.ids[s:s + n] for s in starts.tolist()])  # (B, T-2)
        B = len(starts)
        return torch.cat([torch.full((B, 1), self.CLS), body, torch.full((B, 1), self.SEP)], 1)  # (B, T)

    def train_batch(self, step: int, seed: int) -> dict[str, Tensor]:
        g = step_generator(seed, step)
        ids = self._windows(torch.randint(0, self.split - self.seq_len, (self.batch_size,), generator=g))
        chosen = torch.rand(ids.shape, generator=g) < 0.15
        chosen[:, 0] = chosen[:, -1] = False
        roll = torch.rand(ids.shape, generator=g)
        inputs = ids.clone()
        inputs[chosen & (roll < 0.8)] = self.MASK
        swap = chosen & (roll >= 0.8) & (roll < 0.9)
        inputs[swap] = torch.randint(4, self.vocab, (int(swap.sum()),), generator=g)
        labels = ids.masked_fill(~chosen, -100)
        return {"input_ids": inputs, "labels": labels}

    def held_out(self, n: int = 64) -> list[dict[str, Tensor]]:
        starts = self.split + torch.linspace(0, len(self.ids) - self.split - self.seq_len - 1, n).long()
        return [{"input_ids": self._windows(starts[i:i + 32])} for i in range(0, n, 32)]


class _MaskedLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.encoder = Encoder(config)
        self.head = nn.Linear(config.dim, config.vocab)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return self.head(self.encoder(input_ids, attention_mask))  # (B, T, V)


def _labels(model: nn.Module, data: MaskedChars, step: int,
            reports: Path) -> tuple[list[list[str]], dict[str, list[list[float]]]]:
    """The heads' labels and main metrics at a checkpoint; the whole report is written to
    ``reports/step-NNNNN`` so any two checkpoints can be set side by side (``multihead compare``)."""
    held_out = data.held_out()
    means = head_metrics(model, held_out, first_is_special=True, separator=data.SEP)
    L, H = means["entropy"].shape
    labels = [[label_for({k: float(v[layer, h]) for k, v in means.items()}) for h in range(H)] for layer in range(L)]
    ids = torch.cat([b["input_ids"] for b in held_out])
    corpus = {"texts": ids.shape[0], "sha256": hashlib.sha256(ids.numpy().tobytes()).hexdigest()}
    report = Report(model=f"specialise encoder, step {step}", causal=False, num_layers=L, num_heads=H,
                    sentences=ids.shape[0], tokens=ids.numel(), heads=head_records(means, label_for, flags_for),
                    sections=Sections(corpus=Corpus(**corpus)), stack="encoder")
    report.placement = placement_words(model)  # as a loaded model's says
    write_report_folder(report, reports / f"step-{step:05d}", force=True)
    keep = ("entropy_norm", "previous_token", "next_token", "self", "local", "cls", "sep", "distance")
    return labels, {k: means[k].tolist() for k in keep}


def run_specialise(setting: Setting, out: Path, device: str = "auto") -> Path:
    start = time.perf_counter()
    dev = pick_device(device)
    cfg = SPECIALISE_SETTINGS[setting.name]
    data = MaskedChars()
    torch.manual_seed(0)
    config = ModelConfig("encoder", cfg["layers"], cfg["heads"], cfg["dim"], 4 * cfg["dim"], vocab=data.vocab,
                         max_len=data.seq_len, norm_first=True, dropout=0.0, eps=1e-5)
    model = _MaskedLM(config).to(dev)
    checkpoints = []

    def checkpoint(step: int, model: nn.Module) -> None:
        if step not in cfg["checkpoints"]:
            return
        labels, metrics = _labels(model, data, step, out / "specialise" / "reports")
        counts = Counter(label for row in labels for label in row)
        checkpoints.append({"step": step, "labels": labels, "counts": dict(counts), "metrics": metrics})
        log(f"  step {step}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))

    losses = fit(model, lambda step: data.train_batch(step, 0),
                 lambda m, b: F.cross_entropy(m(b["input_ids"]).transpose(1, 2), b["labels"], ignore_index=-100),
                 steps=cfg["steps"], lr=cfg["lr"], cosine=False, device=dev, every=25, on_step=checkpoint)
    for c in checkpoints:  # the last training loss logged before the checkpoint
        c["train_loss"] = next((loss for step, loss in reversed(losses) if step < c["step"]), None)
    md = _markdown(cfg, checkpoints, losses)
    payload = {"config": {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()},
               "checkpoints": checkpoints, "train_loss": losses, "_device": dev}
    return write_result(out / "specialise", "specialise", setting, payload, md,
                        {"specialise": _figure(checkpoints)}, time.perf_counter() - start)


ORDER = ("previous", "next", "self", "local", "special-token", "broad", "mixed")
SHORT = {"previous": "PREV", "next": "NEXT", "self": "SELF", "local": "LOCL", "special-token": "SPEC",
         "broad": "BRD", "mixed": "·", "induction": "IND"}


def _markdown(cfg: dict, checkpoints: list[dict], losses: list) -> str:
    seen = [k for k in ORDER if any(k in c["counts"] for c in checkpoints)]
    seen += sorted({k for c in checkpoints for k in c["counts"]} - set(seen))
    lines = [f"A {cfg['layers']}-layer encoder (d_model {cfg['dim']}, {cfg['heads']} heads per layer, pre-norm) "
             f"learning masked characters of Hamlet for {cfg['steps']} AdamW steps (batch 32 × 64, lr {cfg['lr']:g}); "
             "every head labelled with the analysis module's rules on 64 held-out windows at each checkpoint.", "",
             "| step | train loss | " + " | ".join(seen) + " |", "|---|---|" + "---|" * len(seen)]
    for c in checkpoints:
        loss = "—" if c["train_loss"] is None else f"{c['train_loss']:.3f}"
        lines.append(f"| {c['step']} | {loss} | " + " | ".join(str(c["counts"].get(k, 0)) for k in seen) + " |")
    first = {}
    for c in checkpoints:
        for k in c["counts"]:
            first.setdefault(k, c["step"])
    lines += ["", "First checkpoint at which each label appears: "
              + ", ".join(f"{k} {first[k]}" for k in seen if k != "mixed") + ".", "",
              f"Head map at step {checkpoints[-1]['step']} (PREV previous, NEXT next, SELF self, LOCL local, "
              "SPEC [CLS]/[SEP], BRD broad, · mixed):", "", "```",
              "layer | " + " ".join(f"h{h:<4d}" for h in range(len(checkpoints[-1]["labels"][0])))]
    for layer, row in enumerate(checkpoints[-1]["labels"]):
        lines.append(f"{layer:5d} | " + " ".join(f"{SHORT.get(x, x[:4]):5s}" for x in row))
    lines.append("```")
    return "\n".join(lines)


def _figure(checkpoints: list[dict]):
    from ..plotting import new_figure

    fig, axes = new_figure(1, 2, figsize=(11, 3.6))
    steps = [c["step"] for c in checkpoints]
    xs = [max(s, 1) for s in steps]  # log axis: step 0 drawn at 1
    for label in [k for k in ORDER if any(k in c["counts"] for c in checkpoints)]:
        axes[0].plot(xs, [c["counts"].get(label, 0) for c in checkpoints], marker="o", label=label)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("training step (step 0 drawn at 1)")
    axes[0].set_ylabel("heads with the label")
    axes[0].legend(fontsize=7)
    for key, style in (("previous_token", "-"), ("next_token", "--"), ("entropy_norm", ":")):
        best = [max(max(row) for row in c["metrics"][key]) for c in checkpoints]
        axes[1].plot(xs, best, style, marker=".", label=f"max over heads: {key}")
    axes[1].set_xscale("log")
    axes[1].set_xlabel("training step")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig
