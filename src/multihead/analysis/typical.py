"""The corpus texts on which each head is most typical of its label.

:func:`~multihead.analysis.analyze` keeps, for every head and every measure below, the
:data:`TOP` texts of the whole corpus that score highest on it — a running top-k per head, so
memory does not grow with the corpus — and the report's ``typical`` section names, for each
head, the texts of the measure its label calls for:

| label | the per-text measure that ranks its texts |
|---|---|
| ``previous`` / ``next`` / ``self`` | mean ``previous_token`` / ``next_token`` / ``self`` over its real queries |
| ``local`` | mean ``local`` (mass within ±2 tokens) |
| ``special-token`` | mean ``cls + sep`` |
| ``broad`` | mean ``entropy_norm`` |
| ``syntactic:REL`` | how many of the text's REL dependents attend most to their governor (ties: the larger share) |
| ``induction`` | ``repeat_successor``: over the text's tokens that occurred earlier in it, the mean mass on |
|  | the tokens right after those earlier occurrences (the induction pattern, on the text itself) |
| any other (``coreference``, ``mixed``) | mean ``max_weight``: how sharply its rows point |

Texts with fewer than :data:`MIN_TOKENS` real tokens rank after all longer ones: on a
three-token text any head looks like anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

__all__ = ["FALLBACK", "MEASURES", "MIN_TOKENS", "TOP", "TypicalTexts", "measure_of"]

#: Texts kept per head and measure.
TOP = 3
#: Texts shorter than this (real tokens) rank after every longer one.
MIN_TOKENS = 8
#: label -> the metric (``+``: a sum of metrics) whose per-text mean ranks its texts.
MEASURES = {"previous": "previous_token", "next": "next_token", "self": "self", "local": "local",
            "special-token": "cls+sep", "broad": "entropy_norm", "induction": "repeat_successor"}
#: The measure of every other label that has no syntax relation.
FALLBACK = "max_weight"
#: Characters of each named text kept in the report.
TEXT_CHARS = 300


def measure_of(label: str) -> str:
    """The measure ranking the texts of a head with this label (``syntax:REL`` for syntax heads)."""
    if label.startswith("syntactic:"):
        return "syntax:" + label.split(":", 1)[1]
    return MEASURES.get(label, FALLBACK)


class _Top:
    """A running top-k of (rank key, value, count, text index) per (L, H) cell."""

    def __init__(self, num_layers: int, num_heads: int, k: int) -> None:
        shape = (num_layers, num_heads, k)
        self.key = torch.full(shape, -torch.inf, dtype=torch.float64)
        self.value = torch.zeros(shape, dtype=torch.float64)
        self.count = torch.zeros(shape, dtype=torch.float64)
        self.index = torch.full(shape, -1, dtype=torch.long)

    def offer(self, layer: int, key: Tensor, value: Tensor, count: Tensor, index: Tensor) -> None:
        """Candidates for one layer: key, value and count (H, N), text indices (N,)."""
        H, N = key.shape
        self._keep(layer, key, value, count, index.view(1, N).expand(H, N))

    def _keep(self, layer: int | slice, key: Tensor, value: Tensor, count: Tensor, index: Tensor) -> None:
        k = self.key.shape[-1]
        keys = torch.cat([self.key[layer], key], -1)
        best = keys.topk(k, dim=-1).indices
        for mine, new in ((self.value, value), (self.count, count), (self.index, index)):
            mine[layer] = torch.cat([mine[layer], new.to(mine.dtype)], -1).gather(-1, best)
        self.key[layer] = keys.gather(-1, best)

    def merge(self, other: _Top) -> None:
        self._keep(slice(None), other.key, other.value, other.count, other.index)


class TypicalTexts:
    """Running top texts of every head on every measure (see the module's table)."""

    def __init__(self, num_layers: int, num_heads: int, k: int = TOP) -> None:
        self.shape = (num_layers, num_heads)
        self.k = k
        self.metrics = {m: _Top(num_layers, num_heads, k) for m in (*MEASURES.values(), FALLBACK)}
        self.syntax: dict[str, _Top] = {}

    def add_metrics(self, layer: int, means: Mapping[str, Tensor], tokens: Tensor, ids: Sequence[int]) -> None:
        """One layer's per-text means, each (B, H) (NaN: not counted), of texts with ``tokens``
        (B,) real tokens and corpus indices ``ids``."""
        index = torch.as_tensor(list(ids), dtype=torch.long)
        short = (tokens.to(torch.float64) < MIN_TOKENS)[:, None]  # (B, 1)
        for name, top in self.metrics.items():
            if any(part not in means for part in name.split("+")):  # e.g. no token ids given
                continue
            value = sum(means[part] for part in name.split("+")).to(torch.float64).cpu()  # (B, H)
            key = value.nan_to_num(-torch.inf) - 1e6 * short  # short texts after every long one
            top.offer(layer, key.T, value.nan_to_num(0.0).T, tokens.to(torch.float64)[None].expand_as(key.T), index)

    def add_syntax(self, layer: int, relation: str, hits: Tensor, count: Tensor, ids: Sequence[int]) -> None:
        """One layer's syntax hits (B, H) for one relation over its ``count`` (B,) dependents per text."""
        top = self.syntax.setdefault(relation, _Top(*self.shape, self.k))
        present = count > 0
        hits, count = hits[present].to(torch.float64), count[present].to(torch.float64)  # (N, H), (N,)
        index = torch.as_tensor(list(ids), dtype=torch.long)[present]
        share = hits / count[:, None]
        top.offer(layer, (hits + share / 2).T, share.T, count[None].expand(hits.shape[1], -1), index)

    def merge(self, other: TypicalTexts) -> None:
        for name, top in other.metrics.items():
            self.metrics[name].merge(top)
        for relation, top in other.syntax.items():
            if relation in self.syntax:
                self.syntax[relation].merge(top)
            else:
                self.syntax[relation] = top

    def section(self, labels: Mapping[tuple[int, int], str], texts: Sequence[str]) -> dict:
        """The report's ``typical`` section: per head, its label's measure and its top texts as
        [text index, value, count] (count: real tokens, or the relation's dependents for syntax),
        best first; and the named texts (their first :data:`TEXT_CHARS` characters)."""
        heads, named = [], set()
        for (layer, head), label in sorted(labels.items()):
            measure = measure_of(label)
            top = self.syntax.get(measure.split(":", 1)[1]) if measure.startswith("syntax:") else self.metrics[measure]
            if top is None:  # a relation this corpus never showed (labels from another run): the fallback
                measure, top = FALLBACK, self.metrics[FALLBACK]
            found = [[int(i), round(float(v), 4), int(c)]
                     for i, v, c, key in zip(top.index[layer, head].tolist(), top.value[layer, head].tolist(),
                                             top.count[layer, head].tolist(), top.key[layer, head].tolist(),
                                             strict=True) if i >= 0 and key > -torch.inf]
            named.update(i for i, _, _ in found)
            heads.append({"layer": layer, "head": head, "measure": measure, "texts": found})
        return {"top": self.k, "min_tokens": MIN_TOKENS, "measures": {**MEASURES, "*": FALLBACK},
                "heads": heads, "texts": {str(i): texts[i][:TEXT_CHARS] for i in sorted(named)}}
