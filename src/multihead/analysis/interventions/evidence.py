"""Labels with evidence: does the behaviour a head's label names depend on that head?

A label says where a head *looks*. For three labels there is a test of what the head *does*,
each removing the head (its output multiplied by 0 before W^O, every other head intact):

* ``induction`` — the next-token loss on the induction probe (repeated random tokens). Confirmed
  when removing the head raises the loss on the probe's repeated half at least
  :data:`INDUCTION_MARGIN` nats per token more than on its first half.
* ``previous`` — the mean induction score of the model's induction heads in later layers
  (K-composition: an induction head finds the earlier copy through a previous-token head's output,
  Elhage et al. 2021). Confirmed when removing the head lowers it by at least :data:`PREVIOUS_DROP`
  of its value.
* ``syntactic:REL`` — the model's fit to the relation's tokens (its dependents; for ``REL>`` its
  governors): a causal model's loss on predicting them, an encoder's change of their last hidden
  states (1 − cos). Confirmed when removing the head changes it more than removing a random other
  head of its layer does (the mean over :data:`BASELINE_HEADS` of them, drawn with a seed).

A label that passes its test is ``confirmed``; one that fails it is ``attention-only``: the head
looks that way, but the behaviour does not need it (others may do the same job). The other labels,
and labels whose test cannot run (no induction heads above a previous-token head; an encoder's
induction probe; fewer than :data:`MIN_TOKENS` tokens of a relation), get no mark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ...hf.capture import AttentionCapture
from ...hf.interventions import HeadGates, replica_gates
from ...hf.model import HFModel, right_padding
from ...hf.route import AttentionChunk
from ..probes.induction import repeated_sequences
from ..probes.syntax import Parse, parse_with_spacy, word_of_tokens
from ..sections import HeadEvidence
from .ablation import blocks_of, passes, recorded, replayed

__all__ = ["BASELINE_HEADS", "INDUCTION_MARGIN", "MIN_TOKENS", "PREVIOUS_DROP", "PROBE", "SYNTAX_TEXTS", "TESTS",
           "LabelEvidence", "label_evidence"]

#: Nats per token the repeated half must lose beyond the first half for an induction head to be confirmed.
INDUCTION_MARGIN = 0.01
#: Share of the later induction heads' score a previous-token head must take away to be confirmed.
PREVIOUS_DROP = 0.1
#: Fewest tokens of a relation in the measured texts for its syntax test to run.
MIN_TOKENS = 10
#: Texts the syntax tests read (the first of the analysed ones).
SYNTAX_TEXTS = 32
#: Other heads of a layer, drawn at random (seeded by the layer), whose mean is the syntax tests' baseline.
BASELINE_HEADS = 3
#: The induction probe the tests read (smaller than the scoring probe: every tested head runs it).
PROBE = {"count": 8, "length": 40, "seed": 1}
#: Tokens one pass holds (replicas x batch x length).
PASS_TOKENS = 4096

TESTS = {
    "induction": "zero-ablating the head raises the next-token loss on the repeated half of the induction probe "
                 f"at least {INDUCTION_MARGIN} nats/token more than on its first half",
    "previous": "zero-ablating the head lowers the mean induction score of the induction heads in later layers "
                f"by at least {PREVIOUS_DROP:.0%} (K-composition)",
    "syntactic": "zero-ablating the head changes the model's fit to the relation's tokens (dependents; governors "
                 f"for REL>) more than zero-ablating a random other head of its layer (mean of {BASELINE_HEADS})",
}


@dataclass
class LabelEvidence:
    """The test of one head's label: its measured value against what confirms it."""

    layer: int
    head: int
    label: str
    value: float
    threshold: float
    confirmed: bool

    @property
    def mark(self) -> str:
        return "confirmed" if self.confirmed else "attention-only"

    def record(self) -> HeadEvidence:
        """As the report's evidence section holds it."""
        return HeadEvidence(self.layer, self.head, self.label, round(self.value, 6), round(self.threshold, 6),
                            self.mark)


def label_evidence(model: HFModel, labels: dict[tuple[int, int], str], texts: Sequence[str], *,
                   parses: Sequence[Parse | None] | str | None = None, batch_size: int = 16) -> list[LabelEvidence]:
    """Test every head whose label has a test (see the module). ``labels``: {(layer, head): label}
    (the previous-token test watches the heads labelled ``induction``); ``texts`` (and their
    ``parses``, or ``"spacy"``) for the syntax test. Returns one :class:`LabelEvidence` per tested
    head, in layer order."""
    found: list[LabelEvidence] = []
    if model.is_causal:
        inductive = sorted(cell for cell, label in labels.items() if label == "induction")
        found += _induction_tests(model, inductive)
        previous = sorted(cell for cell, label in labels.items() if label == "previous")
        found += _previous_tests(model, previous, inductive)
    syntactic = {cell: label for cell, label in labels.items() if label.startswith("syntactic:")}
    if syntactic and parses is not None and texts:
        found += _syntax_tests(model, syntactic, list(texts), parses, batch_size)
    return sorted(found, key=lambda e: (e.layer, e.head))


def _induction_tests(model: HFModel, cells: list[tuple[int, int]]) -> list[LabelEvidence]:
    if not cells:
        return []
    ids, prefix = repeated_sequences(model.tokenizer, **PROBE)  # (N, prefix + 2·length)
    n = PROBE["length"]
    changes = _token_changes(model, [(ids, torch.ones_like(ids))], cells)  # {cell: [(N, T)]}
    # predicted tokens: the first half's after its first, the repeated half's after its first
    first = slice(prefix + 1, prefix + n)
    repeated = slice(prefix + n + 1, prefix + 2 * n)
    out = []
    for cell in cells:
        change = changes[cell][0]
        value = float(change[:, repeated].mean() - change[:, first].mean())
        out.append(LabelEvidence(*cell, "induction", value, INDUCTION_MARGIN, value >= INDUCTION_MARGIN))
    return out


def _previous_tests(model: HFModel, cells: list[tuple[int, int]],
                    inductive: list[tuple[int, int]]) -> list[LabelEvidence]:
    tested = [(cell, [c for c in inductive if c[0] > cell[0]]) for cell in cells]
    tested = [(cell, fed) for cell, fed in tested if fed]  # no induction head above: no test
    if not tested:
        return []
    ids, prefix = repeated_sequences(model.tokenizer, **PROBE)
    groups = [[]] + [[cell] for cell, _ in tested]  # the intact run first
    scores = _induction_under_ablation(model, ids, prefix, PROBE["length"], groups)  # (G, L, H)
    out = []
    for g, (cell, fed) in enumerate(tested, start=1):
        index = tuple(zip(*fed, strict=True))
        intact, ablated = float(scores[0][index].mean()), float(scores[g][index].mean())
        drop = 1 - ablated / intact if intact > 0 else 0.0
        out.append(LabelEvidence(*cell, "previous", drop, PREVIOUS_DROP, drop >= PREVIOUS_DROP))
    return out


def _syntax_tests(model: HFModel, labels: dict[tuple[int, int], str], texts: list[str],
                  parses: Sequence[Parse | None] | str, batch_size: int) -> list[LabelEvidence]:
    if isinstance(parses, str):
        parses = parse_with_spacy(texts)
    batches, where = _syntax_batches(model, texts, list(parses)[:len(texts)], batch_size)
    H = model.num_heads
    baseline = {layer: _baseline_heads(layer, H) for layer in sorted({layer for layer, _ in labels})}
    cells = sorted({*labels, *((layer, h) for layer, heads in baseline.items() for h in heads)})
    changes = _token_changes(model, batches, cells)
    out = []
    for (layer, h), label in sorted(labels.items()):
        key = label.removeprefix("syntactic:")
        positions = where.get(key, [])  # [(batch, row, token)]
        if len(positions) < MIN_TOKENS:
            continue

        def fit(cell: tuple[int, int], positions=positions) -> float:
            return float(torch.stack([changes[cell][b][r, t] for b, r, t in positions]).nanmean())

        value = fit((layer, h))
        others = [fit((layer, o)) for o in [o for o in baseline[layer] if o != h][:BASELINE_HEADS]]
        threshold = sum(others) / len(others)
        out.append(LabelEvidence(layer, h, label, value, threshold, value > threshold))
    return out


def _baseline_heads(layer: int, H: int) -> list[int]:
    """BASELINE_HEADS + 1 heads of ``layer`` in a seeded random order (one spare: a tested head drawn
    among them is replaced by the next), the same in every run."""
    order = torch.randperm(H, generator=torch.Generator().manual_seed(layer)).tolist()
    return order[:BASELINE_HEADS + 1]


def _syntax_batches(model: HFModel, texts: list[str], parses: list[Parse | None], batch_size: int):
    """Batches of the texts and, per relation key (``rel`` / ``rel>``), the (batch, row, token)
    positions of its tokens: each dependent's (``rel>``: each governor's) first token."""
    tok = model.tokenizer
    limit = model.max_positions
    enc = tok(texts, truncation=bool(limit), max_length=limit, return_offsets_mapping=True, verbose=False)
    batches, where = [], {}
    with right_padding(tok):
        for s in range(0, len(texts), batch_size):
            rows = list(range(s, min(s + batch_size, len(texts))))
            padded = tok.pad({"input_ids": [enc["input_ids"][i] for i in rows]}, return_tensors="pt")
            batches.append((padded["input_ids"], padded["attention_mask"]))
            for r, i in enumerate(rows):
                if parses[i] is None:
                    continue
                owner = word_of_tokens(parses[i].words, [tuple(o) for o in enc["offset_mapping"][i]])
                first = {}
                for t, w in enumerate(owner):
                    if w >= 0 and w not in first:
                        first[w] = t
                for src, _targets, key in parses[i].groups():
                    if src in first and first[src] > 0:  # the first token has nothing before it to predict from
                        where.setdefault(key, []).append((len(batches) - 1, r, first[src]))
    return batches, where


def _terms(model: HFModel, ids: Tensor, attention: Tensor) -> Tensor:
    """Per token: a causal model's loss on predicting it (B, T), NaN where nothing predicts it; an
    encoder's last hidden state (B, T, D)."""
    ids, attention = ids.to(model.device), attention.to(model.device)
    if not model.is_causal:
        return model.body(input_ids=ids, attention_mask=attention).last_hidden_state.float()  # (B, T, D)
    logits = model.model(input_ids=ids, attention_mask=attention, use_cache=False).logits.float()  # (B, T, V)
    B, T, V = logits.shape
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1), reduction="none").view(B, T - 1)
    out = torch.full((B, T), float("nan"))
    out[:, 1:] = loss.masked_fill(~attention[:, 1:].bool(), float("nan"))
    return out  # (B, T)


def _token_changes(model: HFModel, batches: list[tuple[Tensor, Tensor]],
                   cells: list[tuple[int, int]]) -> dict[tuple[int, int], list[Tensor]]:
    """For each head removed alone, per batch, the change at every token (B, T): loss ablated minus
    intact (causal), or 1 − cos of the last hidden state to the intact one (encoders)."""
    L, H = model.num_layers, model.num_heads
    blocks = blocks_of(model)
    found: dict[tuple[int, int], list[Tensor]] = {cell: [] for cell in cells}
    with torch.inference_mode():
        for ids, attention in batches:
            B, T = ids.shape
            R = max(1, PASS_TOKENS // (B * T))
            with recorded(blocks) as outputs:
                intact = _terms(model, ids, attention)
            for group in passes(cells, R):
                heads = [cell for _, cell in group]
                gates = replica_gates(L, H, [[cell] for cell in heads], B)
                lowest = min(layer for layer, _ in heads)
                with HeadGates(model.model, gates), replayed(blocks[:lowest] if blocks else [], outputs, len(heads)):
                    ablated = _terms(model, ids.repeat(len(heads), 1), attention.repeat(len(heads), 1))
                for r, cell in enumerate(heads):
                    part = ablated[r * B:(r + 1) * B]
                    if intact.dim() == 3:  # hidden states
                        change = 1 - F.cosine_similarity(part.double(), intact.double(), dim=-1)
                        change = change.masked_fill(~attention.bool(), float("nan"))
                    else:
                        change = part.double() - intact.double()
                    found[cell].append(change.float())
            del outputs
    return found


def _induction_under_ablation(model: HFModel, ids: Tensor, prefix: int, length: int,
                              groups: list[list[tuple[int, int]]]) -> Tensor:
    """(G, L, H) every head's induction score on the probe with each group of heads removed."""
    L, H = model.num_layers, model.num_heads
    N = ids.shape[0]
    queries = torch.arange(prefix + length, prefix + 2 * length)  # the repeated half
    out = torch.zeros(len(groups), L, H, dtype=torch.float64)
    R = max(1, PASS_TOKENS // ids.numel())
    for s in range(0, len(groups), R):
        part = groups[s:s + R]
        gates = replica_gates(L, H, part, N)

        def on_layer(chunk: AttentionChunk, part=part, s=s) -> None:
            layer, weights = chunk.layer, chunk.weights
            rows = weights[:, :, queries]  # (R·N, H, Q, S)
            target = (queries - length + 1).view(1, 1, -1, 1).expand(*rows.shape[:3], 1)
            score = rows.gather(-1, target).double().mean(dim=(2, 3))  # (R·N, H)
            out[s:s + len(part), layer] = score.view(len(part), N, H).mean(1)

        batch = ids.repeat(len(part), 1).to(model.device)
        with torch.inference_mode(), HeadGates(model.model, gates), AttentionCapture(model.model, on_layer):
            model.body(input_ids=batch, attention_mask=torch.ones_like(batch), **model.no_cache)
    return out
