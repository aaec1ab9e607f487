"""Labels with evidence: does the behaviour a head's label names depend on that head?

A label says where a head *looks*. For three labels there is a test of what the head *does*,
each removing the head (its output multiplied by 0 before W^O, every other head intact), and
each against a random-head baseline: the same measurement with each of up to
:data:`BASELINE_HEADS` other heads (drawn with a seed, none carrying the label) removed instead.
A label is confirmed only when the head's effect lies above the baseline's upper bound
``mean + Z · sd`` (:data:`Z`: one-sided, at level :data:`LEVEL`) and above the test's floor:

* ``induction`` — the next-token loss on the induction probe (repeated random tokens), in
  nats/token: removing the head raises the loss on the probe's repeated half more than on its first
  half (floor :data:`INDUCTION_MARGIN`); baseline heads from the whole model.
* ``previous`` — the mean induction score of the model's induction heads in later layers
  (K-composition: an induction head finds the earlier copy through a previous-token head's output,
  Elhage et al. 2021), as a relative drop (floor :data:`PREVIOUS_DROP`); baseline heads of its layer.
* ``syntactic:REL`` — the model's fit to the relation's tokens (its dependents; for ``REL>`` its
  governors): a causal model's loss on predicting them (nats/token), an encoder's change of their
  last hidden states (1 − cos); baseline heads of its layer.

A label that passes its test is ``confirmed``; one that fails it is ``attention-only``: the head
looks that way, but the behaviour does not need it (others may do the same job). The other labels,
and labels whose test cannot run (no induction heads above a previous-token head; an encoder's
induction probe; fewer than :data:`MIN_TOKENS` tokens of a relation), get no mark.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...hf.capture import AttentionCapture
from ...hf.interventions import HeadGates, replica_gates
from ...hf.logits import on_rows, token_losses
from ...hf.model import HFModel, right_padding
from ...hf.route import AttentionChunk
from ...hf.sites import find_sites, main_stack
from ..probes.induction import repeated_sequences
from ..probes.syntax import Parse, parse_with_spacy, word_of_tokens
from ..sections import HeadEvidence
from .ablation import blocks_of, passes, recorded, replayed

__all__ = [
    "BASELINE_HEADS",
    "INDUCTION_MARGIN",
    "LEVEL",
    "MIN_TOKENS",
    "PREVIOUS_DROP",
    "PROBE",
    "SYNTAX_TEXTS",
    "TESTS",
    "LabelEvidence",
    "Z",
    "label_evidence",
    "upper_bound",
]

#: Nats per token the repeated half must lose beyond the first half for an induction head to be confirmed.
INDUCTION_MARGIN = 0.01
#: Share of the later induction heads' score a previous-token head must take away to be confirmed.
PREVIOUS_DROP = 0.1
#: Fewest tokens of a relation in the measured texts for its syntax test to run.
MIN_TOKENS = 10
#: Texts the syntax tests read (the first of the analysed ones).
SYNTAX_TEXTS = 32
#: Other heads, drawn at random (seeded), whose effects are a test's baseline (fewer where fewer exist).
BASELINE_HEADS = 8
#: A label is confirmed above mean + Z·sd of its baseline heads' effects: one-sided, level LEVEL.
LEVEL, Z = 0.95, 1.645
#: The induction probe the tests read (smaller than the scoring probe: every tested head runs it).
PROBE = {"count": 8, "length": 40, "seed": 1}
#: Tokens one pass holds (replicas x batch x length).
PASS_TOKENS = 4096

_ABOVE = (f"and more than the upper bound (mean + {Z}·sd, one-sided {LEVEL:.0%}) of the same effect with each of "
          f"up to {BASELINE_HEADS} random other heads removed instead")
TESTS = {
    "induction": "zero-ablating the head raises the next-token loss on the repeated half of the induction probe "
                 f"more than on its first half (nats/token): at least {INDUCTION_MARGIN}, {_ABOVE} (any layer)",
    "previous": "zero-ablating the head lowers the mean induction score of the induction heads in later layers "
                f"(relative drop, K-composition): at least {PREVIOUS_DROP:.0%}, {_ABOVE} (its layer)",
    "syntactic": "zero-ablating the head changes the model's fit to the relation's tokens (dependents; governors "
                 f"for REL>; nats/token for a causal model, 1 - cos of the hidden states for an encoder) {_ABOVE} "
                 "(its layer)",
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
    unit: str = ""
    baseline: tuple[float, ...] = ()

    @property
    def mark(self) -> str:
        return "confirmed" if self.confirmed else "attention-only"

    def record(self) -> HeadEvidence:
        """As the report's evidence section holds it."""
        mean, sd = _spread(self.baseline)
        return HeadEvidence(self.layer, self.head, self.label, round(self.value, 6), round(self.threshold, 6),
                            self.mark, self.unit, len(self.baseline), mean, sd)


def _spread(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and (sample) standard deviation; None where there are too few values."""
    if not values:
        return None, None
    t = torch.tensor(list(values), dtype=torch.float64)
    return float(t.mean()), float(t.std()) if len(values) > 1 else 0.0


def upper_bound(baseline: Sequence[float], floor: float = -math.inf) -> float:
    """What a head's effect must pass: the baseline's mean + Z·sd, and at least ``floor``."""
    mean, sd = _spread(baseline)
    return floor if mean is None else max(floor, mean + Z * (sd or 0.0))


def _test(cell: tuple[int, int], label: str, value: float, baseline: list[float], unit: str,
          floor: float = -math.inf) -> LabelEvidence:
    threshold = upper_bound(baseline, floor)
    return LabelEvidence(*cell, label, value, threshold, value > threshold, unit, tuple(baseline))


def _draw(candidates: list[tuple[int, int]], seed: int, k: int = BASELINE_HEADS) -> list[tuple[int, int]]:
    """``k`` of ``candidates`` in a seeded random order (the same in every run)."""
    order = torch.randperm(len(candidates), generator=torch.Generator().manual_seed(seed)).tolist()
    return [candidates[i] for i in order[:k]]


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
    L, H = model.num_layers, model.num_heads
    others = _draw([(layer, h) for layer in range(L) for h in range(H) if (layer, h) not in set(cells)], seed=L)
    changes = _token_changes(model, [(ids, torch.ones_like(ids))], sorted({*cells, *others}))  # {cell: [(N, T)]}
    # predicted tokens: the first half's after its first, the repeated half's after its first
    first = slice(prefix + 1, prefix + n)
    repeated = slice(prefix + n + 1, prefix + 2 * n)

    def effect(cell: tuple[int, int]) -> float:
        change = changes[cell][0]
        return float(change[:, repeated].mean() - change[:, first].mean())

    baseline = [effect(c) for c in others]
    return [_test(cell, "induction", effect(cell), baseline, "nats/token", INDUCTION_MARGIN) for cell in cells]


def _previous_tests(model: HFModel, cells: list[tuple[int, int]],
                    inductive: list[tuple[int, int]]) -> list[LabelEvidence]:
    tested = [(cell, [c for c in inductive if c[0] > cell[0]]) for cell in cells]
    tested = [(cell, fed) for cell, fed in tested if fed]  # no induction head above: no test
    if not tested:
        return []
    ids, prefix = repeated_sequences(model.tokenizer, **PROBE)
    H = model.num_heads
    labelled = {cell for cell, _ in tested}
    baseline = {layer: _draw([(layer, h) for h in range(H) if (layer, h) not in labelled], seed=layer)
                for layer in sorted({cell[0] for cell in labelled})}
    removed = sorted(labelled | {c for heads in baseline.values() for c in heads})
    read = sorted({layer for _, fed in tested for layer, _ in fed})  # the induction heads' layers
    scores = _induction_under_ablation(model, ids, prefix, PROBE["length"], removed, read)  # (1 + n, L, H)
    row = {cell: g for g, cell in enumerate(removed, start=1)}
    out = []
    for cell, fed in tested:
        index = tuple(zip(*fed, strict=True))
        intact = float(scores[0][index].mean())

        def drop(c: tuple[int, int], index=index, intact=intact) -> float:
            return 1 - float(scores[row[c]][index].mean()) / intact if intact > 0 else 0.0

        out.append(_test(cell, "previous", drop(cell), [drop(c) for c in baseline[cell[0]]], "relative drop",
                         PREVIOUS_DROP))
    return out


def _syntax_tests(model: HFModel, labels: dict[tuple[int, int], str], texts: list[str],
                  parses: Sequence[Parse | None] | str, batch_size: int) -> list[LabelEvidence]:
    if isinstance(parses, str):
        parses = parse_with_spacy(texts)
    ids, where = _relation_tokens(model, texts, list(parses)[:len(texts)])
    H = model.num_heads
    unit = "nats/token" if model.is_causal else "1 - cos"
    tested = {cell: label for cell, label in labels.items()
              if len(where.get(label.removeprefix("syntactic:"), ())) >= MIN_TOKENS}  # else no test: not run
    # per layer, the random heads of the baseline: one spare (a tested head drawn among them is skipped)
    baseline = {layer: _draw([(layer, h) for h in range(H)], seed=layer, k=BASELINE_HEADS + 1)
                for layer in sorted({layer for layer, _ in tested})}
    # A causal model's passes one layer at a time, each over the texts that hold its relations' tokens, each
    # text cut after the last of them: under causal attention a later token changes no earlier loss (nor, on
    # texts within the model's original context, anything that depends on the length, such as dynamic rope
    # scaling). SmolLM2's syntax tests of 100 sentences, 7 heads in 5 layers, one thread on an AMD EPYC: 167 ->
    # 105 s, each value within the report's rounding, though each layer now has its own intact run. An
    # encoder's tokens see the whole text: one group, whole texts.
    groups = [[layer] for layer in baseline] if model.is_causal else [list(baseline)] if baseline else []
    out = []
    for layers in groups:
        labelled = {cell: label for cell, label in tested.items() if cell[0] in layers}
        keys = {label.removeprefix("syntactic:") for label in labelled.values()}
        needed: dict[int, int] = {}  # text -> its tokens the passes run
        for key in keys:
            for i, t in where[key]:
                needed[i] = max(needed.get(i, 0), t + 1) if model.is_causal else len(ids[i])
        batches, place = _prefix_batches(model, ids, needed, batch_size)
        located = {key: [place[i] + (t,) for i, t in where[key]] for key in keys}  # (batch, row, token)
        wanted = None  # a causal model's, per batch: the tested relations' tokens, the only losses read
        if model.is_causal:
            every = sorted({p for found in located.values() for p in found})
            wanted = [tuple(torch.tensor([p[k] for p in every if p[0] == n], dtype=torch.long) for k in (1, 2))
                      for n in range(len(batches))]
        cells = sorted({*labelled, *(c for layer in layers for c in baseline[layer])})
        changes = _token_changes(model, batches, cells, wanted)
        for (layer, h), label in sorted(labelled.items()):
            positions = located[label.removeprefix("syntactic:")]

            def fit(cell: tuple[int, int], positions=positions, changes=changes) -> float:
                return float(torch.stack([changes[cell][b][r, t] for b, r, t in positions]).nanmean())

            others = [c for c in baseline[layer] if c != (layer, h) and labels.get(c) != label][:BASELINE_HEADS]
            out.append(_test((layer, h), label, fit((layer, h)), [fit(c) for c in others], unit))
    return out


def _relation_tokens(model: HFModel, texts: list[str], parses: list[Parse | None]
                     ) -> tuple[list[list[int]], dict[str, list[tuple[int, int]]]]:
    """Each text's token ids and, per relation key (``rel`` / ``rel>``), the (text, token) places
    of its tokens: each dependent's (``rel>``: each governor's) first token."""
    tok = model.tokenizer
    limit = model.max_positions
    enc = tok(texts, truncation=bool(limit), max_length=limit, return_offsets_mapping=True, verbose=False)
    where: dict[str, list[tuple[int, int]]] = {}
    for i, parse in enumerate(parses):
        if parse is None:
            continue
        owner = word_of_tokens(parse.words, [tuple(o) for o in enc["offset_mapping"][i]])
        first = {}
        for t, w in enumerate(owner):
            if w >= 0 and w not in first:
                first[w] = t
        for src, _targets, key in parse.groups():
            if src in first and first[src] > 0:  # the first token has nothing before it to predict from
                where.setdefault(key, []).append((i, first[src]))
    return enc["input_ids"], where


def _prefix_batches(model: HFModel, ids: list[list[int]], needed: dict[int, int], batch_size: int
                    ) -> tuple[list[tuple[Tensor, Tensor]], dict[int, tuple[int, int]]]:
    """Right-padded batches (ids, attention) of the texts in ``needed``, each cut to its first
    ``needed[i]`` tokens, and each text's (batch, row).

    The texts are batched in order of length, each batch within :data:`PASS_TOKENS` over
    ``BASELINE_HEADS + 1`` padded tokens (and ``batch_size`` texts), so that one pass takes every
    head of a layer as a replica: 32 sentences of 6-51 tokens padded into one batch were 55 %
    padding, run again for every head removed."""
    order = sorted(needed)
    batches, place = [], {}
    with right_padding(model.tokenizer):
        for rows in _by_length([needed[i] for i in order], batch_size, PASS_TOKENS // (BASELINE_HEADS + 1)):
            chosen = [order[r] for r in rows]
            padded = model.tokenizer.pad({"input_ids": [ids[i][:needed[i]] for i in chosen]}, return_tensors="pt")
            batches.append((padded["input_ids"], padded["attention_mask"]))
            place.update({i: (len(batches) - 1, r) for r, i in enumerate(chosen)})
    return batches, place


def _by_length(lengths: list[int], most: int, tokens: int) -> list[list[int]]:
    """The indices of ``lengths`` in batches of similar length: shortest first, a batch closed when
    one more would pass ``most`` items or ``tokens`` padded tokens (a longer item alone)."""
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if batches and len(batches[-1]) < most and (len(batches[-1]) + 1) * lengths[i] <= tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


#: Tokens whose loss a pass wants: (rows, positions) (n,) each, the predicted tokens' places.
Wanted = tuple[Tensor, Tensor]


def _terms(model: HFModel, ids: Tensor, attention: Tensor, wanted: Wanted | None = None) -> Tensor:
    """Per token: a causal model's loss on predicting it (B, T), NaN where nothing predicts it
    (and, with ``wanted``, everywhere but there); an encoder's last hidden state (B, T, D).

    Only the predicted tokens' logits are made (:func:`~multihead.hf.logits.on_rows`), a part at a
    time, and whatever the model does to logits after its output embedding (Gemma's soft-cap) still
    happens: the logits of SmolLM2's 49k words and their log-sum-exp were a third of a pass's time."""
    ids, attention = ids.to(model.device), attention.to(model.device)
    if not model.is_causal:
        return model.body(input_ids=ids, attention_mask=attention).last_hidden_state.float()  # (B, T, D)
    B, T = ids.shape
    predicting = torch.zeros(B, T, dtype=torch.bool, device=ids.device)  # (B, T): the positions before them
    if wanted is None:
        predicting[:, :-1] = attention[:, 1:].bool()
    else:
        rows, at = wanted  # the tokens predicted
        if len(at) and int(at.min()) < 1:
            raise ValueError("a text's first token is predicted by no position")
        predicting[rows.to(ids.device), (at - 1).to(ids.device)] = True
    targets = ids[:, 1:][predicting[:, :-1]]  # (N,) the tokens predicted, in the positions' order
    loss = on_rows(model, dict(input_ids=ids, attention_mask=attention, use_cache=False), predicting,
                   lambda logits, part: token_losses(logits, targets[part]))  # (N,)
    out = torch.full((B, T), float("nan"))
    out[:, 1:][predicting[:, :-1].cpu()] = loss.cpu()
    return out  # (B, T)


def _token_changes(model: HFModel, batches: list[tuple[Tensor, Tensor]], cells: list[tuple[int, int]],
                   wanted: Sequence[Wanted | None] | None = None) -> dict[tuple[int, int], list[Tensor]]:
    """For each head removed alone, per batch, the change at every token (B, T): loss ablated minus
    intact (causal), or 1 − cos of the last hidden state to the intact one (encoders). ``wanted``:
    per batch, the only tokens whose loss is needed (None: all)."""
    L, H = model.num_layers, model.num_heads
    blocks = blocks_of(model)
    found: dict[tuple[int, int], list[Tensor]] = {cell: [] for cell in cells}
    with torch.inference_mode():
        for n, (ids, attention) in enumerate(batches):
            B, T = ids.shape
            R = max(1, PASS_TOKENS // (B * T))
            want = wanted[n] if wanted is not None else None
            with recorded(blocks) as outputs:
                intact = _terms(model, ids, attention, want)
            for group in passes(cells, R):
                heads = [cell for _, cell in group]
                gates = replica_gates(L, H, [[cell] for cell in heads], B)
                lowest = min(layer for layer, _ in heads)
                replicas = None if want is None else (
                    torch.cat([want[0] + r * B for r in range(len(heads))]), want[1].repeat(len(heads)))
                with HeadGates(model.model, gates), replayed(blocks[:lowest] if blocks else [], outputs, len(heads)):
                    ablated = _terms(model, ids.repeat(len(heads), 1), attention.repeat(len(heads), 1), replicas)
                for r, cell in enumerate(heads):
                    part = ablated[r * B:(r + 1) * B]
                    if intact.dim() == 3:  # hidden states
                        change = 1 - F.cosine_similarity(part.double(), intact.double(), dim=-1)
                        change = change.masked_fill(~attention.bool().to(change.device), float("nan"))
                    else:
                        change = part.double() - intact.double()
                    found[cell].append(change.float())
            del outputs
    return found


def _induction_under_ablation(model: HFModel, ids: Tensor, prefix: int, length: int, cells: list[tuple[int, int]],
                              layers: list[int]) -> Tensor:
    """(1 + len(cells), L, H): every head's induction score on the probe at ``layers`` (NaN at the
    others) in the intact model (row 0) and with each of ``cells`` removed alone (row 1 + i).

    Only ``layers`` are read (math attention there, the model's own elsewhere); a pass removes
    heads of one layer and replays the intact run's blocks below it, where nothing changed — the
    scores there are the intact ones."""
    L, H = model.num_layers, model.num_heads
    N = ids.shape[0]
    queries = torch.arange(prefix + length, prefix + 2 * length)  # the repeated half
    out = torch.full((1 + len(cells), L, H), math.nan, dtype=torch.float64)
    blocks = blocks_of(model)
    stack = main_stack(find_sites(model.model))
    at = [f"{stack}.{layer}" for layer in layers]

    def run(group: list[tuple[int, int]], rows: list[int], replay: list, recorded_outputs: list) -> None:
        R = len(rows)
        gates = replica_gates(L, H, [[cell] for cell in group] or [[]], N)

        def on_layer(chunk: AttentionChunk) -> None:
            weights = chunk.weights  # (R·N, H, T, S)
            repeated = queries.to(weights.device)  # gather's index lives where the map does (a GPU's)
            picked = weights[:, :, repeated]  # (R·N, H, Q, S)
            target = (repeated - length + 1).view(1, 1, -1, 1).expand(*picked.shape[:3], 1)
            score = picked.gather(-1, target).double().mean(dim=(2, 3))  # (R·N, H)
            out[rows, chunk.layer] = score.view(R, N, H).mean(1).cpu()

        batch = ids.repeat(R, 1).to(model.device)
        with torch.inference_mode(), HeadGates(model.model, gates), AttentionCapture(model.model, on_layer, at=at), \
                replayed(replay, recorded_outputs, R), _stopped_after(last):
            model.body(input_ids=batch, attention_mask=torch.ones_like(batch), **model.no_cache)

    # the blocks above the last layer read change no score: the pass stops there (recording the
    # intact run needs only the blocks a later pass replays, all below it)
    last = blocks[max(layers)] if blocks and layers else None
    with recorded(blocks) as outputs:
        run([], [0], [], [])
    R = max(1, PASS_TOKENS // ids.numel())
    for group in passes(cells, R):
        lowest = min(layer for _, (layer, _) in group)
        rows = [1 + n for n, _ in group]
        run([cell for _, cell in group], rows, blocks[:lowest] if blocks else [], outputs)
        below = [layer for layer in layers if blocks and layer < lowest]  # replayed: as in the intact run
        out[[r for r in rows for _ in below], below * len(rows)] = out[0, below].repeat(len(rows), 1)
    return out


class _EnoughError(Exception):
    """Raised after the last block a pass needs: nothing after it is read."""


@contextlib.contextmanager
def _stopped_after(block: nn.Module | None):
    """Within the block, a forward pass ends (quietly) once ``block`` has run (None: it runs to the end)."""
    if block is None:
        yield
        return

    def enough(*_args: object) -> None:
        raise _EnoughError

    hook = block.register_forward_hook(enough)
    try:
        yield
    except _EnoughError:
        pass
    finally:
        hook.remove()
