"""Syntax heads, streamed: each head's word-level predictions against dependency parses.

The scoring of :mod:`multihead.analysis.probes.syntax` (Clark et al. 2019, §4) as a reducer.
Attention *to* a word is the sum over its tokens, *from* a word the mean over its tokens, so a
text's word-level attention of one source word is linear in its query rows:

    to_word[h, s, w] = Σ_i from[s, i] · Σ_j p[h, i, j] · member[w, j]

and a layer streamed in chunks of query rows adds up chunk by chunk; the word each source attends
most (its prediction) is read once the layer's last rows are in. Memory per text is H·S·W (its
source words × words), never a (T, T) map.
"""

from __future__ import annotations

import functools
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from ...hf.route import AttentionChunk
from ...inputs import Batch
from ..probes.syntax import Parse, word_of_tokens
from . import native, onepass
from .base import ReducerBase, shared
from .bootstrap import GROUPS, group_table_bytes, group_zeros

__all__ = ["MAX_OFFSET", "Alignment", "SyntaxScores", "SyntaxStatistics", "alignment", "relation_keys",
           "word_predictions"]

#: The fixed-offset baseline tries every offset in [-MAX_OFFSET, MAX_OFFSET].
MAX_OFFSET = 5


@dataclass
class Alignment:
    """A padded batch's parses aligned to its tokens: G relation groups (a source word and its
    target words) over W words and T tokens."""

    keys: list[str]  # (G,) relation key of each group
    owner: Tensor  # (B, T) the word each token belongs to (-1: none, e.g. [CLS] or padding)
    has_word: Tensor  # (B, W) words that got at least one token
    batch: Tensor  # (G,) the row of each group
    source: Tensor  # (G,) its source word
    #: its target words, sparse — (group, word) pairs, (n,) each: a (G, W) mask would grow as the
    #: square of a document's words (49 MB at 8k tokens, 0.8 GB at 32k)
    target_group: Tensor
    target_word: Tensor
    #: per group: (source word, target words, words with a token in the text) for the offset baseline
    offsets: list[tuple[int, frozenset[int], int]]

    def __post_init__(self) -> None:
        #: the batch's relation keys, sorted, and each group's place among them (G,)
        self.relations = sorted(set(self.keys))
        place = {key: n for n, key in enumerate(self.relations)}
        self.relation = torch.tensor([place[k] for k in self.keys], dtype=torch.long)
        self._by_text = {int(b): (self.batch == b).nonzero().squeeze(1) for b in self.batch.unique()}
        #: the parsed texts (rows of the batch with a group)
        self.texts = sorted(self._by_text)
        #: what every layer's chunks share, made once a batch (:func:`_text_words`)
        self.per_text: dict = {}

    def rows_of(self, b: int) -> Tensor:
        """(S,) the groups of text b."""
        return self._by_text[b]

    def hits(self, picked: Tensor) -> Tensor:
        """(G, H) float64: 1 where a head's predicted word for a group (``picked`` (G, H)) is one of
        its targets."""
        match = picked[self.target_group] == self.target_word[:, None]  # (n, H)
        return torch.zeros(picked.shape, dtype=torch.float64).index_add_(0, self.target_group, match.double())


def alignment(batch: Batch) -> Alignment | None:
    """The batch's :class:`Alignment` (None when it has no parse), computed once per batch."""
    return shared(batch.memo, "syntax-alignment", lambda: _align(batch.parses, batch.offsets, batch.causal))


def _align(parses, offsets, causal: bool = False) -> Alignment | None:
    """Only words that received a token count (a truncated text's later words are not analysed),
    so memory follows the tokens, however long the parsed text. ``causal``: only the targets
    before the source word count (a causal head cannot attend a later word), and not the word of
    the first token (a causal model's attention sink: a sink head "finds" any target there — 143
    of SmolLM2's heads scored as ``prep>`` governors, whose dependent opened the sentence); a group
    left without any is not scored, so a direction no causal head can attend (``conj>``) has no
    count at all."""
    if parses is None or offsets is None:
        return None
    B, T = len(offsets), max((len(o) for o in offsets), default=0)
    words = [word_of_tokens(p.words, o) if p is not None else [] for p, o in zip(parses, offsets, strict=True)]
    reached = [1 + max((w for w in ws if w >= 0), default=-1) for ws in words]  # words with a token, per text
    W = max(reached, default=0)
    owner = torch.full((B, T), -1, dtype=torch.long)  # the word of each token
    for b, ws in enumerate(words):
        owner[b, :len(ws)] = torch.tensor(ws, dtype=torch.long)
    has_word = torch.zeros(B, W, dtype=torch.bool)
    for b in range(B):
        has_word[b, owner[b][owner[b] >= 0]] = True
    sources, target_group, target_word, keys, batch_of, counted = [], [], [], [], [], []
    for b, parse in enumerate(parses):
        if parse is None:
            continue
        # a text's words with a token and its first token's word (-1: a BOS) as Python values, read once:
        # a tensor read a group cost ~10 µs, 0.3 s of a 4,096-token document's thousands of groups
        tokened, sink = set(words[b]), (int(owner[b, 0]) if causal and T else -1)
        for src, tgt, key in parse.groups():
            if src >= reached[b] or src not in tokened:  # dropped by the tokenizer or truncation
                continue
            if causal:
                tgt = _causal_targets(src, tgt, sink=sink)
                if not tgt:
                    continue
            kept = sorted(w for w in tgt if w < W)
            target_group.extend([len(keys)] * len(kept))
            target_word.extend(kept)
            sources.append(src)
            keys.append(key)
            batch_of.append(b)
            counted.append((src, tgt, reached[b]))
    if not keys:
        return None
    return Alignment(keys, owner, has_word, torch.tensor(batch_of), torch.tensor(sources),
                     torch.tensor(target_group, dtype=torch.long), torch.tensor(target_word, dtype=torch.long), counted)


def _causal_targets(source: int, targets: frozenset[int], sink: int) -> frozenset[int]:
    """The targets a causal head can attend from ``source``: the words before it, not the sink's."""
    return frozenset(w for w in targets if w < source and w != sink)


def relation_keys(parses: Iterable[Parse], causal: bool) -> set[str]:
    """The relation keys a run over ``parses`` may score (its syntax tables hold one entry each):
    every group's, and for a causal model only those with a target before the source — an upper
    bound, as the words that truncation or the tokenizer drop, and whether the first word is the
    sink (no BOS token), are not known before the texts are encoded."""
    return {key for parse in parses for src, tgt, key in parse.groups()
            if not causal or _causal_targets(src, tgt, sink=-1)}


def word_predictions(chunk: AttentionChunk, batch: Batch) -> Tensor | None:
    """(G, H) the word each group's source attends most, per head — once the layer's last chunk is
    in (None before, and for a batch without parses). Accumulated chunk by chunk in the layer
    call's memo, so every reader shares one computation."""
    found = alignment(batch)
    if found is None:
        return None
    to_word = shared(chunk.memo, "syntax-words", lambda: _add_chunk(chunk, found))
    return to_word if chunk.last else None


def word_jobs(chunk: AttentionChunk, parts: int, batch: Batch) -> dict[int, native.WordJob]:
    """The compiled reader's pass over each parsed text's rows of ``chunk``, by the text's row
    (:data:`~.onepass.WORDS`; ``parts`` does not change it)."""
    found = alignment(batch)
    if found is None or not native.usable(chunk.weights):
        return {}
    state = chunk.call_memo.setdefault("syntax-to-word", {})
    return {b: job for b in found.texts if (job := _word_job(found, b, chunk, state)) is not None}


def _word_job(found: Alignment, b: int, chunk: AttentionChunk, state: dict) -> native.WordJob | None:
    """Text b's rows of ``chunk`` as the compiled reader reads them — its best words reset at a
    layer's first chunk, the word carried on from the last one — or None where its words are not
    runs of consecutive tokens (the eager steps then)."""
    p = chunk.weights.detach()  # (B, H, c, K) float32
    H = p.shape[1]
    words_of = _text_words(found, b, found.has_word.shape[1], H, p.device)
    if "runs" not in words_of:  # once a batch
        words_of["runs"] = native.word_runs(found.owner[b], H)
        # the rows it reads: those of the words that are a scored group's source (-1 elsewhere) — only their
        # predictions are read (word_predictions' `picked`): ~40 % of a Penn Treebank document's rows are
        # another word's only, a causal head's targets before them counted (SmolLM2's tokens, 4,096 of them)
        owner = found.owner[b]  # (T,) -1: no word, never a source
        words_of["source_rows"] = owner.where(torch.isin(owner, found.source[found.rows_of(b)]), -1)  # (T,)
    runs = words_of["runs"]
    if runs is None:
        return None
    best = words_of["best"]  # (W, H)
    if chunk.start == 0:
        best.fill_(-1)
    return native.word_job(p[b], words_of["source_rows"][chunk.start:chunk.stop], runs, state.get(b), chunk.last,
                           best)


def _add_chunk(chunk: AttentionChunk, found: Alignment) -> Tensor | None:
    """This chunk's share of every parsed text's word-to-word attention; at the last chunk, the
    predicted words (G, H).

    Streamed word by word: a chunk's keys are summed into their words (the first token of each word
    picked, its other tokens added — most words are one token, so this is about one read of the
    chunk), then its rows into their own words — a word's tokens are consecutive rows, so each word
    whose rows are all in is decided at once (its argmax over the words it attends) and only the
    last word of a chunk, which may go on in the next, is carried. Memory is (H, c, words) per
    chunk, never (W, H, W) per layer (1.8 GB for the 7,000 words of an 8k-token document). A
    word's mean over its tokens is its sum over them divided by their count, the same for every
    key: the argmax reads the sum."""
    p = chunk.weights.detach().float()  # (B, H, c, K)
    H, K = p.shape[1], p.shape[3]
    start, stop = chunk.start, chunk.stop
    G, W = len(found.keys), found.has_word.shape[1]
    state = chunk.call_memo.setdefault("syntax-to-word", {})  # per text: the word carried on, if any
    compiled = native.usable(chunk.weights)  # float32 maps (a float64 run's stay eager)
    for b in found.texts:
        read, carried = onepass.words_result(chunk, b)  # read with the chunk's other compiled readers
        if read:
            state[b] = carried
            continue
        job = _word_job(found, b, chunk, state) if compiled else None
        if job is not None:  # the same, in one pass a row (state: the word open, its keys)
            state[b] = native.word_pass(job)
            continue
        words_of = _text_words(found, b, W, H, p.device)
        best, partial = words_of["best"], words_of["partial"]  # (W, H), (H, W): kept for the batch, reused
        if start == 0:
            best.fill_(-1)
        carried = state.get(b)
        first, rest, rest_column, key_words = _key_words(words_of, K)
        # gathers with the index expanded over (H, c): ~15x faster on the CPU than index_select on the last axis
        c, n, m = p.shape[2], len(first), len(rest)
        by_key = p[b].gather(-1, first.expand(H, c, n))  # (H, c, n) each key word's first token
        if m:  # and its other tokens
            by_key.scatter_add_(-1, rest_column.expand(H, c, m), p[b].gather(-1, rest.expand(H, c, m)))
        first_rows, later, later_first, words, word_ids = _row_words(found, b, start, stop, p.device)
        if later is not None:  # a word's later rows summed into its first (in place: no copy of the chunk)
            by_key.index_add_(1, later_first, by_key.index_select(1, later))
        spread = key_words.view(1, -1).expand(H, -1)  # (H, n): a compact column's word
        head, tail = 0, len(word_ids)
        if carried is not None:
            if tail and word_ids[0] == carried:  # the carried word goes on here
                partial.scatter_add_(1, spread, by_key.index_select(1, first_rows[:1])[:, 0])
                head = 1
            if head == tail and not chunk.last:  # and still on in the next chunk
                state[b] = carried
                continue
            best[carried] = partial.masked_fill(~words_of["has_word"], -1.0).max(-1).indices  # (H,)
            state[b] = carried = None
        if not chunk.last and tail > head:  # the chunk's last word may go on in the next chunk
            tail -= 1
            partial.zero_().scatter_(1, spread, by_key.index_select(1, first_rows[tail:tail + 1])[:, 0])
            state[b] = word_ids[tail]
        if tail > head:  # (u', H): each word's most attended word, by its compact column, read at its first row
            most = by_key.max(-1).indices  # (H, c)
            best[words[head:tail]] = key_words[most[:, first_rows[head:tail]]].T
    if not chunk.last:
        return None
    picked = torch.empty(G, H, dtype=torch.long)  # (G, H) each head's predicted word
    for b in found.texts:
        rows = found.rows_of(b)  # (S,) groups of text b
        best = _text_words(found, b, W, H, p.device)["best"]
        picked[rows] = best[found.source[rows].to(best.device)].cpu()  # (S, H)
    return picked


def _text_words(found: Alignment, b: int, W: int, H: int, device: torch.device) -> dict:
    """Text b's words as its keys and the carried sums need them, made once a batch (so no chunk
    leaves a block behind between the next chunks' buffers): every word with a key in the order of
    its first key — ``first`` its first key, ``rest`` the keys of a word after its first (ascending)
    and ``rest_column`` their word's column, ``words`` each column's word, with the first and later
    keys as lists for slicing at any K — and the buffers a layer reuses: ``best`` (W, H) each word's
    prediction, ``partial`` (H, W) the sums of a word carried into the next chunk."""
    cache = found.per_text
    if ("text", b, device) not in cache:
        owner = found.owner[b]  # (T,) on the host, where the parse is
        keys = (owner >= 0).nonzero().squeeze(1)  # (k,) keys in a word
        words, column = torch.unique(owner[keys], return_inverse=True)  # (n,), (k,)
        first = torch.full((len(words),), len(owner), dtype=torch.long).scatter_reduce_(0, column, keys, "amin")
        order = first.argsort()  # columns in the order of their first key: any K keeps a prefix of them
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(order))
        later = keys != first[column]  # (k,)
        cache[("text", b, device)] = {
            "first": first[order].to(device), "words": words[order].to(device),
            "rest": keys[later].to(device), "rest_column": rank[column[later]].to(device),
            "first_keys": first[order].tolist(), "rest_keys": keys[later].tolist(),
            "has_word": found.has_word[b].to(device),
            "best": torch.full((W, H), -1, dtype=torch.long, device=device),
            "partial": torch.zeros(H, W, device=device)}
    return cache[("text", b, device)]


def _key_words(words_of: dict, K: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The words of a text's first K keys (:func:`_text_words`) as views: ``first`` (n,) each
    word's first key, ``rest`` (m,) the keys of a word after its first and ``rest_column`` (m,)
    their word's column, ``words`` (n,) each column's word. Keys in no word are left out."""
    n, m = bisect_left(words_of["first_keys"], K), bisect_left(words_of["rest_keys"], K)
    return words_of["first"][:n], words_of["rest"][:m], words_of["rest_column"][:m], words_of["words"][:n]


def _row_words(found: Alignment, b: int, start: int, stop: int, device: torch.device
               ) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor, list[int]]:
    """The words of text b's rows ``start`` .. ``stop``, in order: each one's first row in the
    chunk (u,), the rows that go on a word (None when every word is one row) and their word's
    first row, the words (u,) and the words as ints — found on the host (a chunk reads no value
    back from its device)."""
    owner = found.owner[b, start:stop]  # (c,)
    rows = (owner >= 0).nonzero().squeeze(1)  # (c',) the rows in a word
    words, inverse, counts = torch.unique_consecutive(owner[rows], return_inverse=True, return_counts=True)
    starts = counts.cumsum(0) - counts  # (u,) each word's first place among the rows
    first_rows = rows[starts]  # (u,)
    later = torch.ones(len(rows), dtype=torch.bool)
    later[starts] = False
    found_later = (rows[later].to(device), first_rows[inverse[later]].to(device)) if bool(later.any()) else (None, None)
    return first_rows.to(device), *found_later, words.to(device), words.tolist()


@dataclass
class SyntaxScores:
    """Per relation key: accuracy (L, H), count, and the best fixed-offset baseline."""

    accuracy: dict[str, Tensor]
    count: dict[str, int]
    baseline: dict[str, float]
    baseline_offset: dict[str, int]

    def best(self, relation: str) -> tuple[int, int, float]:
        acc = self.accuracy[relation]
        n = int(acc.argmax())
        return n // acc.shape[1], n % acc.shape[1], float(acc.flatten()[n])


class SyntaxStatistics(ReducerBase):
    """Running counts of correct predictions per relation and head (a reducer; batches carry their
    parses and token offsets, :class:`~multihead.inputs.Batch`), also per group of texts (text i in
    group i % G, as :class:`~.heads.HeadStatistics` groups them) for the labels' stability
    (:meth:`resampled`)."""

    def __init__(self, num_layers: int, num_heads: int, groups: int = GROUPS) -> None:
        self.shape = (num_layers, num_heads)
        self.groups = groups
        self.correct: dict[str, Tensor] = {}
        self.count: dict[str, int] = defaultdict(int)
        self.offset_hits: dict[str, Tensor] = {}  # relation -> (2·MAX_OFFSET + 1,) hits per offset
        self.group_correct: dict[str, Tensor] = {}  # relation -> (G, L, H)
        self.group_count: dict[str, Tensor] = {}  # relation -> (G,)
        self.group_offset: dict[str, Tensor] = {}  # relation -> (G, 2·MAX_OFFSET + 1)
        # the batch's hits over its sorted relation keys, (relations, L, H) and (relations, its text groups, L, H)
        # — with those groups (g,) and each scored word group's cell among them — added into the tables above once,
        # at its end: a chunk adds its layer's in two operations (an addition per relation and chunk had been
        # ~2,400 small operations of a 1k-token document of SmolLM2, a twentieth of its analysis)
        self._batch_hits: tuple[list[str], Tensor, Tensor, Tensor, Tensor] | None = None

    @staticmethod
    def planned_bytes(num_layers: int, num_heads: int, relations: int, groups: int = GROUPS,
                      texts: int | None = None) -> int:
        """Bytes of the running counts (float64) for ``relations`` relation keys: per key the hits
        (L, H) and their groups (G, L, H), the offset baseline's hits (2·MAX_OFFSET + 1) and their
        groups, and the groups' counts (G,) — with ``texts``, the memory the per-group hits hold
        through a run of that many texts (:func:`~.bootstrap.group_table_bytes`: the pages of the
        groups it writes; the offsets' and counts' tables are small, and written whole every batch)."""
        offsets, row = 2 * MAX_OFFSET + 1, num_layers * num_heads * 8
        return relations * (row + group_table_bytes(groups, row, texts) + 8 * ((groups + 1) * offsets + groups))

    @staticmethod
    def batch_bytes(num_layers: int, num_heads: int, relations: int, batch: int, groups: int = GROUPS) -> int:
        """Bytes a batch of ``batch`` texts holds until its end, in host memory: its hits (L, H) per
        relation key, and per key and text group it holds (at most ``batch``), float64."""
        return relations * 8 * (1 + min(batch, groups)) * num_layers * num_heads

    def begin_batch(self, batch: Batch) -> None:
        self.end_batch()
        super().begin_batch(batch)
        found = alignment(batch)
        if found is None:
            return
        batch.memo[onepass.WORDS] = functools.partial(word_jobs, batch=batch)  # read with the other compiled readers
        G, L_H, offsets = self.groups, self.shape, 2 * MAX_OFFSET + 1
        # the offset baseline's hits counted in Python ints per (relation, text group) met, then added to the
        # tables once a batch (a tensor's element added to per arc and offset: ~0.13 s of an 8k document's batch;
        # a relation's G = 256 groups listed whole: 10 ms of a 1k document's, where one group is met)
        hits_of: dict[tuple[str, int], list[int]] = {}  # (relation, text group) -> hits per offset
        for key, (src, tgt, n_words), row in zip(found.keys, found.offsets, found.batch.tolist(), strict=True):
            cell = (key, batch.texts[row] % G)
            by_offset = hits_of.setdefault(cell, [0] * (offsets + 1))  # the hits per offset, then the arcs
            for target in tgt:  # the target words within MAX_OFFSET of the source (and among the text's words)
                k = target - src
                if k != 0 and -MAX_OFFSET <= k <= MAX_OFFSET and 0 <= target < n_words:
                    by_offset[k + MAX_OFFSET] += 1
            by_offset[offsets] += 1
        if not hits_of:
            return
        keys = sorted({key for key, _ in hits_of})
        place = {key: n for n, key in enumerate(keys)}
        fresh = [key for key in keys if key not in self.offset_hits]
        # relations seen for the first time: their tables, each its own (views of one block would each carry the
        # whole block when a shard is pickled for its merge: ten relations' tables pickled to ten times their bytes)
        for tables_of, shape in ((self.offset_hits, (offsets,)), (self.correct, L_H)):
            tables_of.update((key, torch.zeros(shape, dtype=torch.float64)) for key in fresh)
        for tables_of, shape in ((self.group_offset, (G, offsets)), (self.group_count, (G,)),
                                 (self.group_correct, (G, *L_H))):  # pages written at the groups met only
            tables_of.update((key, group_zeros(*shape)) for key in fresh)
        cells = list(hits_of)
        met = torch.tensor(list(hits_of.values()), dtype=torch.float64)  # (cells, offsets + 1)
        table = torch.zeros(len(keys), G, offsets + 1, dtype=torch.float64).index_put_(
            (torch.tensor([place[key] for key, _ in cells]), torch.tensor([g for _, g in cells])), met)  # (K, G, ·)
        totals = table.sum(1)  # (K, offsets + 1)
        for n, key in enumerate(keys):
            self.group_offset[key] += table[n, :, :offsets]
            self.offset_hits[key] += totals[n, :offsets]
            self.group_count[key] += table[n, :, offsets]
            self.count[key] += int(totals[n, offsets])

    def update(self, chunk: AttentionChunk) -> None:
        assert self.batch is not None, "begin_batch first"
        picked = word_predictions(chunk, self.batch)
        if picked is None:
            return
        found = alignment(self.batch)
        hit = found.hits(picked)  # (G, H)
        # (the alignment's word groups G are not the bootstrap's groups of texts, `text_groups` of them)
        # the layer's hits summed by relation and by (relation, text group) in two scatters into the batch's
        # tables (a masked selection, sum and scatter a relation and a layer had been the reader's whole time:
        # ~8,500 small operations for a 1k-token document of SmolLM2), over the text groups the batch holds
        # (not all 256: a document's table would be 26 MB of zeros)
        if self._batch_hits is None:
            L, H = self.shape
            groups = sorted({text % self.groups for text in self.batch.texts})
            place = {g: n for n, g in enumerate(groups)}
            text_group = torch.tensor([place[text % self.groups] for text in self.batch.texts])[found.batch]  # (G,)
            self._batch_hits = (found.relations, torch.tensor(groups), hit.new_zeros(len(found.relations), L, H),
                                hit.new_zeros(len(found.relations) * len(groups), L, H),
                                found.relation * len(groups) + text_group)
        _, _, by_relation, by_group, cell = self._batch_hits
        by_relation[:, chunk.layer].index_add_(0, found.relation, hit)  # (R, H) of the layer
        by_group[:, chunk.layer].index_add_(0, cell, hit)  # (R · the batch's text groups, H)

    def end_batch(self) -> None:
        """Add the batch's hits into the running tables, a relation at a time (once a batch)."""
        if self._batch_hits is None:
            return
        keys, groups, by_relation, by_group, _ = self._batch_hits
        self._batch_hits = None
        by_relation, by_group = by_relation.cpu(), by_group.cpu().view(len(keys), len(groups), *self.shape)
        for n, key in enumerate(keys):
            self.correct[key] += by_relation[n]
            self.group_correct[key].index_add_(0, groups, by_group[n])

    def merge(self, other: SyntaxStatistics) -> None:
        if (other.shape, other.groups) != (self.shape, self.groups):
            raise ValueError(f"cannot merge syntax counts of {other.shape} heads in {other.groups} groups with "
                             f"{self.shape} in {self.groups}")
        self.end_batch()
        other.end_batch()
        for key, n in other.count.items():
            self.count[key] += n
        for mine, theirs in ((self.correct, other.correct), (self.offset_hits, other.offset_hits),
                             (self.group_correct, other.group_correct), (self.group_count, other.group_count),
                             (self.group_offset, other.group_offset)):
            for key, value in theirs.items():
                if key in mine:
                    mine[key].add_(value)
                else:
                    mine[key] = value.clone()

    def result(self, min_count: int = 1) -> SyntaxScores:
        self.end_batch()
        keys = sorted(k for k, n in self.count.items() if n >= min_count)
        baseline, offset = {}, {}
        for k in keys:
            hits = self.offset_hits[k]
            best = int(hits.argmax())
            baseline[k] = float(hits[best]) / self.count[k]
            offset[k] = best - MAX_OFFSET
        return SyntaxScores({k: self.correct[k] / self.count[k] for k in keys}, {k: self.count[k] for k in keys},
                            baseline, offset)

    def resampled(self, weights: Tensor, used: Tensor, min_count: int = 1) -> list[SyntaxScores]:
        """The scores on each resampled corpus: ``weights`` (R, G') over the ``used`` groups (G,)
        (the draws of :class:`~.heads.HeadStatistics`, so both resample the same texts)."""
        self.end_batch()
        keys = sorted(k for k, n in self.count.items() if n >= min_count)
        correct = {k: torch.einsum("rg,glh->rlh", weights, self.group_correct[k][used]) for k in keys}  # (R, L, H)
        count = {k: weights @ self.group_count[k][used] for k in keys}  # (R,)
        best = {k: (weights @ self.group_offset[k][used]).max(-1) for k in keys}  # (R,) the best offset's hits, offset
        out = []
        for r in range(weights.shape[0]):
            n = {k: float(count[k][r]) for k in keys}
            kept = [k for k in keys if n[k] >= min_count]
            out.append(SyntaxScores({k: correct[k][r] / n[k] for k in kept}, {k: int(n[k]) for k in kept},
                                    {k: float(best[k].values[r]) / n[k] for k in kept},
                                    {k: int(best[k].indices[r]) - MAX_OFFSET for k in kept}))
        return out

