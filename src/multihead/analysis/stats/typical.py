"""The corpus texts on which each head is most typical of its label.

:func:`~multihead.analysis.pipelines.analyze.analyze` keeps, for every head and every measure below, the
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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ...hf.route import AttentionChunk
from ...inputs import Batch
from ..sections import Typical, TypicalHead
from . import native, onepass
from .base import ReducerBase, shared
from .heads import METRICS, row_values
from .syntax import alignment, word_predictions

__all__ = ["FALLBACK", "MEASURES", "MIN_TOKENS", "TOP", "RepeatKeys", "TypicalTexts", "measure_of"]

#: Texts kept per head and measure.
TOP = 3
#: Texts shorter than this (real tokens) rank after every longer one.
MIN_TOKENS = 8
#: label -> the metric (``+``: a sum of metrics) whose per-text mean ranks its texts.
MEASURES = {"previous": "previous_token", "next": "next_token", "self": "self", "local": "local",
            "special-token": "cls+sep", "broad": "entropy_norm", "induction": "repeat_successor"}
#: The measure of every other label that has no syntax relation.
FALLBACK = "max_weight"
#: Every measure whose top texts are kept (one table each, whatever the labels turn out to be).
_RANKED = tuple(dict.fromkeys((*MEASURES.values(), FALLBACK)))
#: Characters of each named text kept in the report.
TEXT_CHARS = 300
#: Candidates (names × layers × texts × heads) offered to the tables in one step at a batch's end: all of
#: SmolLM2's 30 layers for a document (13 measures × 9 heads a layer), a few layers at a time for a batch
#: of 128 texts of a 32-head model — its temporaries (the tables' rows beside the candidates, their
#: top-k) stay a few MB, not hundreds.
OFFER_ELEMENTS = 1 << 18


def measure_of(label: str) -> str:
    """The measure ranking the texts of a head with this label (``syntax:REL`` for syntax heads)."""
    if label.startswith("syntactic:"):
        return "syntax:" + label.split(":", 1)[1]
    return MEASURES.get(label, FALLBACK)


class _Top:
    """A running top-k of (rank key, value, count, text index) per (L, H) cell: ``key``, ``value``,
    ``count`` (L, H, k) float64 and ``index`` (L, H, k) int64 (-1: no text yet), best first."""

    def __init__(self, key: Tensor, value: Tensor, count: Tensor, index: Tensor) -> None:
        self.key, self.value, self.count, self.index = key, value, count, index


class _Tops(Mapping[str, _Top]):
    """Named running top-ks (a measure's, a relation's), stacked in one (R, L, H, k) table each, so
    one layer's candidates of every name are kept in one step — a document's 40-odd relations are
    one ``topk``, not forty. Reads as a mapping name -> :class:`_Top` (views of the stack)."""

    def __init__(self, num_layers: int, num_heads: int, k: int, names: Sequence[str] = ()) -> None:
        self._cell = (num_layers, num_heads, k)
        self._at: dict[str, int] = {}
        self.key = torch.empty(0, *self._cell, dtype=torch.float64)  # (R, L, H, k)
        self.value = torch.empty(0, *self._cell, dtype=torch.float64)
        self.count = torch.empty(0, *self._cell, dtype=torch.float64)
        self.index = torch.empty(0, *self._cell, dtype=torch.long)
        self.rows(names)

    def rows(self, names: Sequence[str]) -> Tensor:
        """(R',) the stack's rows of ``names`` (each once), new names getting empty tables."""
        if len(set(names)) != len(names):  # one row twice in an index_put: which write wins is not defined
            raise ValueError(f"a name offered twice at once: {sorted(names)}")
        new = [n for n in names if n not in self._at]
        if new:
            n = len(new)
            self.key = torch.cat([self.key, torch.full((n, *self._cell), -torch.inf, dtype=torch.float64)])
            self.value = torch.cat([self.value, torch.zeros(n, *self._cell, dtype=torch.float64)])
            self.count = torch.cat([self.count, torch.zeros(n, *self._cell, dtype=torch.float64)])
            self.index = torch.cat([self.index, torch.full((n, *self._cell), -1, dtype=torch.long)])
            base = len(self._at)
            self._at.update((name, base + i) for i, name in enumerate(new))
        return torch.tensor([self._at[n] for n in names], dtype=torch.long)

    def offer(self, names: Sequence[str], layer: int | slice, key: Tensor, value: Tensor, count: Tensor,
              index: Tensor) -> None:
        """Candidates of each of ``names`` (R') at ``layer``: key, value, count and text index, each
        (R', H, N) for one layer or (R', l, H, N) for a slice of l layers; a candidate keyed -inf is never named."""
        rows = self.rows(names)
        k = self._cell[-1]
        keys = torch.cat([self.key[rows, layer], key], -1)
        best = keys.topk(k, dim=-1).indices
        for mine, new in ((self.value, value), (self.count, count), (self.index, index)):
            mine[rows, layer] = torch.cat([mine[rows, layer], new.to(mine.dtype)], -1).gather(-1, best)
        self.key[rows, layer] = keys.gather(-1, best)

    def merge(self, other: _Tops) -> None:
        """Add another stack's candidates, name by name."""
        names = list(other)
        if names:
            theirs = other.rows(names)
            self.offer(names, slice(None), other.key[theirs], other.value[theirs], other.count[theirs],
                       other.index[theirs])

    def __getitem__(self, name: str) -> _Top:
        r = self._at[name]
        return _Top(self.key[r], self.value[r], self.count[r], self.index[r])

    def __iter__(self):
        return iter(self._at)

    def __len__(self) -> int:
        return len(self._at)


class TypicalTexts(ReducerBase):
    """Running top texts of every head on every measure (see the module's table); a reducer, whose
    per-text values are the head statistics' own (:func:`~multihead.analysis.stats.heads.row_values`)
    and the syntax predictions (:func:`~multihead.analysis.stats.syntax.word_predictions`), read
    from the chunk's memo: nothing is computed twice."""

    def __init__(self, num_layers: int, num_heads: int, k: int = TOP) -> None:
        self.shape = (num_layers, num_heads)
        self.k = k
        self.metrics = _Tops(num_layers, num_heads, k, _RANKED)
        self.syntax = _Tops(num_layers, num_heads, k)  # a table per relation key, as the parses show them
        self._per_text: dict[int, tuple[list[str], Tensor, Tensor]] = {}  # a streamed layer's per-text sums
        self._repeat: RepeatKeys | None = None  # the batch's tokens as its induction pattern reads them
        # the batch's per-layer candidates, offered at its end in runs of layers (:func:`_runs`; an offer a layer
        # and table — a cat, a top-k and four gathers each — had been ~60 of a document's steps per table)
        self._texts_of_batch: tuple[Tensor | None, list[int]] = (None, [])  # (B,) real tokens, corpus indices
        self._layer_means: dict[int, dict[str, Tensor]] = {}  # layer -> measure -> (B, H) per-text means
        self._layer_hits: dict[int, tuple[list[str], Tensor, Tensor]] = {}  # layer -> relations, hits, count

    @staticmethod
    def planned_bytes(num_layers: int, num_heads: int, relations: int = 0, k: int = TOP) -> int:
        """Bytes of the running top texts: four (L, H, k) tables of 8-byte values per measure and
        per relation key the parses hold."""
        return (len(_RANKED) + relations) * 4 * num_layers * num_heads * k * 8

    @staticmethod
    def batch_bytes(num_layers: int, num_heads: int, relations: int, batch: int) -> int:
        """Bytes a batch of ``batch`` texts holds until its end, where the model runs: every layer's
        per-text means (B, H) of the head metrics and the induction pattern, and its syntax hits (R, B,
        H) and dependents (R, B) per relation key — float64 (offered to the tables at the batch's end,
        :data:`OFFER_ELEMENTS` at a time)."""
        return num_layers * batch * 8 * (len(METRICS) * num_heads + relations * (num_heads + 1))

    @staticmethod
    def summary_needs(batch: Batch) -> frozenset[str] | None:
        """What this reducer reads of a layer given as row sums — the head metrics' key sets and the
        induction pattern's targets — or None with parses (the syntax scores read the map)."""
        return None if batch.parses is not None else frozenset({"key_sets", "targets"})

    def begin_batch(self, batch: Batch) -> None:
        self._offer_batch()
        super().begin_batch(batch)
        batch.memo[onepass.ROWS] = True  # it reads the compiled row sums
        self._per_text = {}
        self._texts_of_batch = (batch.host_tokens.valid.sum(-1), list(batch.texts))
        host = batch.host_tokens
        self._repeat = None
        if host.ids is not None:  # made once a batch on the host; read on the batch's device (and by native.row_sums)
            self._repeat = RepeatKeys.of(host.ids, host.valid).to(batch.tokens.valid.device)
            batch.memo[native.REPEAT] = (self._repeat.prev, self._repeat.token)

    def end_batch(self) -> None:
        self._repeat = None
        self._offer_batch()

    def _offer_batch(self) -> None:
        """Offer the batch's layers' candidates: runs of consecutive layers the batch gave the same names
        (a whole forward: every layer) in one step each, as many layers a step as keep its candidates
        within :data:`OFFER_ELEMENTS` (its temporaries bounded, whatever the batch and the model)."""
        means, hits = self._layer_means, self._layer_hits
        self._layer_means, self._layer_hits = {}, {}
        tokens, texts = self._texts_of_batch
        B, H = len(texts), self.shape[1]
        for layers in _runs(means, lambda found: tuple(found), lambda found: len(found) * B * H):
            names = means[layers[0]]
            self._add_metrics(slice(layers[0], layers[-1] + 1), {
                n: torch.stack([means[layer][n] for layer in layers]) for n in names}, tokens, texts)  # (l, B, H)
        for layers in _runs(hits, lambda found: tuple(found[0]), lambda found: len(found[0]) * B * H):
            relations, _, count = hits[layers[0]]  # (R, B): the batch's, the same at every layer
            self._add_syntax(slice(layers[0], layers[-1] + 1), relations,
                             torch.stack([hits[layer][1] for layer in layers], 1),  # (R, l, B, H)
                             count[:, None].expand(-1, len(layers), -1), texts)  # (R, l, B)

    def update(self, chunk: AttentionChunk) -> None:
        """Add one chunk's per-text sums; at the layer's last chunk, keep each text's means (offered at the
        batch's end)."""
        assert self.batch is not None, "begin_batch first"
        batch, layer = self.batch, chunk.layer
        tokens = batch.tokens
        found = row_values(chunk, batch)
        names, per_text, per_count = list(found.names), found.sums, found.counts  # (M, B, H)
        if tokens.ids is not None:  # and, per text only, its own induction pattern
            compiled = native.compiled_rows(chunk, batch)
            if chunk.weights is None:  # a summary chunk: summed by the row-statistics kernel, row by row
                copy_sum = chunk.summary.found.repeat.sum(-1)  # (B, H)
                copy_rows = self._repeat.rows_counted(chunk.start, chunk.stop).expand_as(copy_sum)
            elif compiled is not None and compiled.repeat is not None:  # summed in the compiled row pass
                copy_sum = compiled.repeat  # (B, H)
                copy_rows = self._repeat.rows_counted(chunk.start, chunk.stop).expand_as(copy_sum)
            else:
                copy_sum, copy_rows = _repeats_followed(chunk.weights.detach().float(), self._repeat, chunk.start)
            names.append("repeat_successor")
            per_text = torch.cat([per_text, copy_sum[None].to(torch.float64)])
            per_count = torch.cat([per_count, copy_rows[None].to(torch.float64)])
        if chunk.start > 0:  # the layer's earlier chunks
            _, before, before_count = self._per_text.pop(layer)
            per_text, per_count = per_text + before, per_count + before_count
        if not chunk.last:
            self._per_text[layer] = (names, per_text, per_count)
        else:
            means = per_text / per_count.where(per_count > 0, torch.nan)  # (M, B, H)
            self._layer_means[layer] = {n: means[k] for k, n in enumerate(names)}  # (B, H) each
        picked = word_predictions(chunk, batch)
        if picked is not None:  # per text: its dependents of each relation that attend most to their governor
            found_syntax = alignment(batch)
            hit = found_syntax.hits(picked)  # (G, H)
            B, H = len(batch.texts), hit.shape[1]
            relations, cell = shared(batch.memo, "typical-relations", lambda: _relation_cells(found_syntax.keys,
                                                                                              found_syntax.batch, B))
            R = len(relations)
            hits = torch.zeros(R * B, H, dtype=torch.float64).index_add_(0, cell, hit).view(R, B, H)
            count = torch.bincount(cell, minlength=R * B).to(torch.float64).view(R, B)  # its dependents per text
            self._layer_hits[layer] = (relations, hits, count)

    def result(self) -> TypicalTexts:
        """The running top texts (:meth:`section` picks each head's by its label)."""
        self._offer_batch()
        return self

    def _add_metrics(self, layer: int | slice, means: Mapping[str, Tensor], tokens: Tensor, ids: Sequence[int]) -> None:
        """One layer's per-text means, each (B, H) (NaN: not counted) — or a run of layers', (l, B, H), for
        a slice of them — of texts with ``tokens`` (B,) real tokens and corpus indices ``ids``."""
        names = [n for n in self.metrics if all(part in means for part in n.split("+"))]  # e.g. no token ids given
        if not names:
            return
        value = torch.stack([sum(means[part] for part in n.split("+")) for n in names]).to(torch.float64).cpu()
        short = (tokens.to(torch.float64).cpu() < MIN_TOKENS)  # (B,)
        key = value.nan_to_num(-torch.inf) - 1e6 * short[:, None]  # (M, [L,] B, H): short texts after every long one
        key = key.transpose(-1, -2)  # (M, [L,] H, B)
        index = torch.as_tensor(list(ids), dtype=torch.long).expand(key.shape)
        count = tokens.to(torch.float64).cpu().expand(key.shape)
        self.metrics.offer(names, layer, key, value.nan_to_num(0.0).transpose(-1, -2), count, index)

    def _add_syntax(self, layer: int | slice, relations: str | Sequence[str], hits: Tensor, count: Tensor,
                    ids: Sequence[int]) -> None:
        """One layer's syntax hits (R, B, H) of ``relations`` (R) over their ``count`` (R, B)
        dependents per text (one relation: (B, H) and (B,)) — a run of layers', (R, l, B, H) over (R, l, B),
        for a slice of them; texts without a dependent are not named."""
        if isinstance(relations, str):
            relations, hits, count = [relations], hits[None], count[None]
        hits, count = hits.to(torch.float64), count.to(torch.float64)
        present = count > 0  # (R, [L,] B)
        share = hits / count.where(present, 1.0)[..., None]  # (R, [L,] B, H)
        key = (hits + share / 2).masked_fill(~present[..., None], -torch.inf).transpose(-1, -2)  # (R, [L,] H, B)
        index = torch.as_tensor(list(ids), dtype=torch.long).expand(key.shape)
        self.syntax.offer(relations, layer, key, share.transpose(-1, -2), count.unsqueeze(-2).expand(key.shape), index)

    def merge(self, other: TypicalTexts) -> None:
        self._offer_batch()
        other._offer_batch()
        self.metrics.merge(other.metrics)
        self.syntax.merge(other.syntax)

    def section(self, labels: Mapping[tuple[int, int], str], texts: Sequence[str]) -> Typical:
        """The report's ``typical`` section: per head, its label's measure and its top texts as
        [text index, value, count] (count: real tokens, or the relation's dependents for syntax),
        best first; and the named texts (their first :data:`TEXT_CHARS` characters)."""
        self._offer_batch()
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
            heads.append(TypicalHead(layer, head, measure, found))
        return Typical(self.k, MIN_TOKENS, {**MEASURES, "*": FALLBACK}, heads,
                       {str(i): texts[i][:TEXT_CHARS] for i in sorted(named)})


@dataclass
class RepeatKeys:
    """A batch's tokens as its induction pattern reads them, O(B·T): row i's targets are the keys j
    with ``prev[j] == token[i]`` and j <= i — the keys right after an earlier occurrence of its
    token (ids[j - 1] = ids[i], j - 1 < i, tokens j - 1 and j real) — and ``counted`` the rows
    that have one.

    A frequent token's row has as many targets as the token's earlier occurrences, so a document's
    targets grow with the square of its length (tens of millions of (text, row, key) triples at
    80k tokens, 3.4 GiB when they were listed): they are never listed. A row's mass on them is one
    comparison a key, read with the row (:func:`_repeats_followed`; on a CPU inside the compiled
    row pass, :func:`~.native.row_sums`)."""

    prev: Tensor  # (B, T) int32: the token before each key when both are real, else -1
    token: Tensor  # (B, T) int32: each real row's token, else -2 (no key's)
    counted: Tensor  # (B, T) bool: the rows with an earlier occurrence of their token (followed by a real token)

    @classmethod
    def of(cls, ids: Tensor, valid: Tensor) -> RepeatKeys:
        """From a batch's token ids and real-token flags (B, T) (in host memory: sorted once a batch)."""
        B, T = ids.shape
        ids = ids.to(torch.int64).where(valid, 0)  # padding may hold any id (-100, -1): never read
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= 2**31):
            raise ValueError("a real token's id must lie in 0 .. 2^31 - 1")
        follows = valid.clone()  # (B, T) the occurrences a later row can copy from: real tokens followed by one
        follows[:, :-1] &= valid[:, 1:]
        follows[:, T - 1:] = False  # (no column at all when T = 0)
        prev = torch.full((B, T), -1, dtype=torch.int32)
        prev[:, 1:] = torch.where(follows[:, :-1], ids[:, :-1], -1).to(torch.int32)
        token = torch.where(valid, ids, -2).to(torch.int32)
        # counted: an occurrence before row i among the followed ones — by (text, token, position) sorted
        vocabulary = int(ids.max()) + 1 if ids.numel() else 1
        run = (torch.arange(B)[:, None] * vocabulary + ids) * T  # (B, T) where each row's (text, token) run starts
        at = run + torch.arange(T)  # (B, T) each row's place in the order
        occurrences = at[follows].sort().values  # (M,)
        before = torch.searchsorted(occurrences, at) - torch.searchsorted(occurrences, run)
        return cls(prev, token, valid & (before > 0))

    def rows_counted(self, start: int, stop: int) -> Tensor:
        """(B, 1) how many of rows ``start`` .. ``stop`` of each text have a target."""
        return self.counted[:, start:stop].sum(-1, keepdim=True)

    def to(self, device: torch.device) -> RepeatKeys:
        return RepeatKeys(self.prev.to(device), self.token.to(device), self.counted.to(device))


def _runs(by_layer: Mapping[int, Any], names: Callable[[Any], tuple], elements: Callable[[Any], int]
          ) -> list[list[int]]:
    """``by_layer``'s layers in runs offered at once: consecutive layers whose candidates have the same
    ``names``, each run at most as many layers as keep their candidates (``elements`` a layer) within
    :data:`OFFER_ELEMENTS`."""
    runs: list[list[int]] = []
    for layer in sorted(by_layer):
        found = by_layer[layer]
        last = runs[-1] if runs else None
        if (last is not None and last[-1] == layer - 1 and names(by_layer[last[0]]) == names(found)
                and (len(last) + 1) * elements(found) <= OFFER_ELEMENTS):
            last.append(layer)
        else:
            runs.append([layer])
    return runs


def _relation_cells(keys: Sequence[str], text: Tensor, B: int) -> tuple[list[str], Tensor]:
    """A batch's relation keys, sorted, and each group's cell (G,) ``relation · B + text`` in
    their (R, B) table: found once a batch, shared by its layers."""
    relations = sorted(set(keys))
    at = {key: r for r, key in enumerate(relations)}
    return relations, torch.tensor([at[key] for key in keys], dtype=torch.long) * B + text


def _repeats_followed(p: Tensor, keys: RepeatKeys, start: int) -> tuple[Tensor, Tensor]:
    """A text's own induction pattern in p (B, H, C, K), rows ``start`` .. ``start + C``: for each
    row that repeats an earlier token, its mass on the keys right after those occurrences
    (:class:`RepeatKeys`) — the reference, and the path where the compiled rows do not read the
    chunk. Returns the summed mass over such rows, (B, H), and how many rows there are, (B, H)."""
    B, H, C, K = p.shape
    rows = torch.arange(start, start + C, device=p.device)[:, None]  # (C, 1)
    target = keys.prev[:, None, :K] == keys.token[:, start:start + C, None]  # (B, C, K)
    target &= torch.arange(K, device=p.device) <= rows  # earlier occurrences only (j - 1 < i)
    mass = torch.einsum("bhck,bck->bh", p, target.to(p.dtype))  # (B, H)
    return mass, keys.rows_counted(start, start + C).expand(B, H)
