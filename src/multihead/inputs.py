"""What goes into a model, as the analyses read it: texts checked, batches padded, tokens as people read them.

* :func:`check_texts`, :func:`read_lines`, :func:`read_text`: a corpus from Python or from files,
  every problem one line naming the text or the file (from :mod:`multihead.texts`, which needs no
  torch: the command line reads them before torch loads);
* :class:`TokenInfo`: what the per-head metrics need to know about a padded batch (real tokens,
  the first one, separators, punctuation, ids) — built by :func:`token_info`;
* :class:`Batch`: one padded batch of a corpus as every reducer receives it (its tokens, the
  corpus indices of its texts, the model's inputs, optional parses and character offsets), with a
  ``memo`` for what several reducers derive from it once;
* :func:`readable_tokens`: byte-level BPE pieces decoded, WordPiece's ``##`` kept, a character
  split over several byte tokens shown on each with its piece's number (``研₁ 研₂``);
* :func:`count_unknown_tokens`: how many tokens are the tokenizer's ``[UNK]``.
"""

from __future__ import annotations

import unicodedata
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from .texts import InputError, check_texts, read_lines, read_text, readable_file

__all__ = ["Batch", "InputError", "TokenInfo", "UnknownTokens", "check_texts", "count_unknown_tokens", "encode_text",
           "read_lines", "read_text", "readable_file", "readable_tokens", "real_positions", "text_tokens", "to_device",
           "token_info"]


@dataclass
class TokenInfo:
    """What the metrics need to know about a padded batch of tokens, all (B, T) bool."""

    valid: Tensor  # a real token (not padding)
    first: Tensor  # the first real token of its sequence ([CLS] / BOS position)
    separator: Tensor  # [SEP] / EOS
    punctuation: Tensor
    ids: Tensor | None = None  # (B, T) the token ids, for the texts' own induction pattern (typical texts)

    def to(self, device: Any) -> TokenInfo:
        """The same flags on ``device`` (itself when they are there already); their
        :attr:`positions` are computed here, where the flags are, and moved too."""
        if self.valid.device == torch.device(device):
            return self
        moved = TokenInfo(*(None if t is None else t.to(device) for t in (self.valid, self.first, self.separator,
                                                                             self.punctuation, self.ids)))
        pos, prefix = self.positions
        moved.__dict__["positions"] = (pos.to(device), prefix)  # not asked of the device (a read back per batch)
        return moved

    @cached_property
    def positions(self) -> tuple[Tensor, bool]:
        """:func:`real_positions` of :attr:`valid`, computed once per batch (a streamed capture
        reads it for every chunk of every layer)."""
        return real_positions(self.valid)


def real_positions(valid: Tensor) -> tuple[Tensor, bool]:
    """Each token's index among the real tokens of its row, (B, T), and whether the real tokens
    are the first ones of every row (right padding or none), so offsets are plain diagonals."""
    pos = valid.long().cumsum(-1) - 1  # (B, T)
    T = valid.shape[-1]
    prefix = bool((pos[valid] == torch.arange(T, device=valid.device).expand_as(pos)[valid]).all())
    return pos, prefix


@dataclass
class Batch:
    """One padded batch of a corpus, as every reducer's ``begin_batch`` receives it.

    ``tokens``: its :class:`TokenInfo` (of the queries); ``texts``: the corpus index of each row;
    ``inputs``: what the model is called with; ``keys``: for cross-attention, the keys' tokens;
    ``parses`` and ``offsets``: per row, a dependency parse (or None) and the tokens' character
    spans, when syntax is scored; ``memo``: derived data several reducers
    read, computed once by whichever asks first; ``causal``: the model attends causally.
    """

    tokens: TokenInfo
    texts: list[int]
    inputs: dict[str, Tensor] = field(default_factory=dict)
    #: cross-attention: the keys' tokens (an encoder's), the queries' being ``tokens``
    keys: TokenInfo | None = None
    parses: Sequence[Any] | None = None
    offsets: Sequence[Sequence[tuple[int, int]]] | None = None
    memo: dict = field(default_factory=dict)
    #: the model attends causally: a query sees no later token (syntax scores only what it can see)
    causal: bool = False
    #: the query tokens' flags in host memory (None: ``tokens`` are there): what a reducer counts
    #: once per batch is read here, so the device is never waited for
    host: TokenInfo | None = None

    def to(self, device: Any) -> Batch:
        """The batch with its tokens and the model's inputs on ``device`` (where the model takes its
        inputs, and the captured maps are): the reducers then never mix devices."""
        return Batch(self.tokens.to(device), self.texts, to_device(self.inputs, device),
                     None if self.keys is None else self.keys.to(device), self.parses, self.offsets, self.memo,
                     self.causal, self.host_tokens)

    @property
    def host_tokens(self) -> TokenInfo:
        """The query tokens' flags in host memory (:attr:`host`, or :attr:`tokens` when on the CPU;
        copied there once for a batch made on a device)."""
        if self.host is None:
            self.host = self.tokens if self.tokens.valid.device.type == "cpu" else self.tokens.to("cpu")
        return self.host


def to_device(inputs: dict[str, Any], device: Any) -> dict[str, Any]:
    """A model's keyword inputs with every tensor on ``device``."""
    return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in inputs.items()}


def token_info(input_ids: Tensor, valid: Tensor, tokenizer: Any, cache: dict[int, bool] | None = None) -> TokenInfo:
    """The :class:`TokenInfo` of a padded batch (B, T) of ``tokenizer``'s ids: separators are its
    [SEP] / EOS tokens (never the first real token), punctuation the tokens made only of
    punctuation (``cache``: token id -> punctuation, kept across batches)."""
    cache = {} if cache is None else cache
    special = {t for t in (tokenizer.sep_token_id, tokenizer.eos_token_id) if t is not None}
    first = torch.zeros_like(valid)
    first[torch.arange(valid.shape[0]), valid.long().argmax(-1)] = True
    first &= valid
    separator = torch.zeros_like(valid)
    for sid in special:
        separator |= input_ids == sid
    separator &= valid
    punct = torch.tensor([[_is_punct(int(t), tokenizer, cache) for t in row] for row in input_ids.tolist()],
                         dtype=torch.bool) & valid
    return TokenInfo(valid=valid, first=first, separator=separator & ~first, punctuation=punct, ids=input_ids)


def _is_punct(token_id: int, tok: Any, cache: dict[int, bool]) -> bool:
    if token_id not in cache:
        text = tok.convert_ids_to_tokens(token_id) or ""
        text = text.removeprefix("##").lstrip("Ġ▁")
        cache[token_id] = bool(text) and all(unicodedata.category(c).startswith("P") for c in text)
    return cache[token_id]


# --------------------------------------------------------------------------- tokens


@dataclass
class UnknownTokens:
    """Tokens the tokenizer could not represent (its ``unk_token``), of all non-special tokens."""

    count: int
    total: int
    token: str | None

    @property
    def share(self) -> float:
        return self.count / self.total if self.total else 0.0


#: Above this share of unknown tokens (the tokenizer's [UNK]) analyze and view warn: the heads'
#: statistics then describe how the model treats [UNK] more than how it reads the texts.
UNKNOWN_WARN = 0.05


def warn_unknown_tokens(found: Any, shown: str = "the heads' statistics describe") -> None:
    """A warning when more than :data:`UNKNOWN_WARN` of the tokens are unknown (``found``: an
    :class:`UnknownTokens` or the report section of the same fields; None: nothing to say);
    ``shown``: what of the command's output they mislead, as the warning's subject and verb."""
    if found is not None and found.share > UNKNOWN_WARN:
        warnings.warn(f"{found.share:.0%} of the {found.total} tokens are unknown to the tokenizer "
                      f"({found.token}); above {UNKNOWN_WARN:.0%} {shown} how the model "
                      f"treats {found.token} more than how it reads the texts", stacklevel=3)


def count_unknown_tokens(encoded: Sequence[Sequence[int]], tok: Any) -> UnknownTokens:
    """How many of the texts' tokens (special tokens aside) are the tokenizer's unknown token.

    Raises ValueError when no token at all is known: the report would describe ``[UNK]``, not the texts.
    """
    unk = getattr(tok, "unk_token_id", None)
    specials = set(getattr(tok, "all_special_ids", ()) or ()) - {unk}
    total = unknown = 0
    for ids in encoded:
        for t in ids:
            if t in specials:
                continue
            total += 1
            unknown += t == unk
    found = UnknownTokens(unknown, total, getattr(tok, "unk_token", None))
    if total and unknown == total:
        raise ValueError(f"none of the texts' {total} tokens is known to the tokenizer: all are {found.token} "
                         "(a script or symbols its vocabulary lacks); nothing to analyse")
    return found


def encode_text(tokenizer: Any, text: str, *, max_tokens: int | None = None) -> tuple[dict, list[str]]:
    """``text`` encoded (a batch of one, cut at ``max_tokens``) and its tokens as people read them."""
    fast = bool(getattr(tokenizer, "is_fast", False))
    enc = tokenizer(text, return_tensors="pt", truncation=max_tokens is not None, max_length=max_tokens,
                    return_offsets_mapping=fast)
    offsets = enc.pop("offset_mapping")[0].tolist() if fast else None
    return dict(enc), readable_tokens(tokenizer, enc["input_ids"][0].tolist(), text, offsets)


def text_tokens(tok: Any, ids: list[int], text: str, **encoding: Any) -> list[str]:
    """The :func:`readable_tokens` of ``ids``, the tokenizer's encoding of ``text`` (with ``encoding``'s
    arguments, e.g. ``add_special_tokens=False``): their character spans read again where the
    tokenizer is fast, so a character split over byte tokens shows as itself ("小₁ 小₂"), not "�"."""
    offsets = None
    if getattr(tok, "is_fast", False):
        again = tok(text, return_offsets_mapping=True, verbose=False, **encoding)
        if list(again["input_ids"]) == list(ids):
            offsets = [tuple(span) for span in again["offset_mapping"]]
    return readable_tokens(tok, list(ids), text, offsets)


def readable_tokens(tok: Any, ids: list[int], text: str, offsets: list | None = None) -> list[str]:
    """Tokens as people read them: byte-level BPE pieces decoded ("å°" -> "小"; a character split
    over several byte tokens is shown on each of them with its piece's number, "研₁" "研₂", so it
    reads as one character in two tokens), WordPiece's "##" kept, specials as named.
    ``offsets``: the tokens' character spans in ``text`` (fast tokenizers)."""
    raw = tok.convert_ids_to_tokens(ids)
    special = set(getattr(tok, "all_special_ids", ()) or ())
    out = []
    split: list[int] = []  # the tokens of the character being split, while it goes on
    for n, (i, t) in enumerate(zip(ids, raw, strict=True)):
        if i in special or t.startswith("##"):
            out.append(t)
            continue
        decoded = tok.convert_tokens_to_string([t])
        if "\ufffd" in decoded and offsets is not None and offsets[n][1] > offsets[n][0]:
            decoded = text[offsets[n][0]:offsets[n][1]]  # part of a multi-byte character: show the character
            # the pieces of one character end where it ends (the first may begin at a space before it)
            if split and offsets[split[-1]][1] != offsets[n][1]:
                _number(out, split)
                split = []
            split.append(n)
        elif split:
            _number(out, split)
            split = []
        out.append(decoded if decoded.strip() else t.replace("Ġ", " ").replace("▁", " "))
    if split:
        _number(out, split)
    return out


_SUBSCRIPTS = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")


def _number(out: list[str], pieces: list[int]) -> None:
    """Mark the byte pieces of one character with their number (a character in one token: no mark)."""
    if len(pieces) > 1:
        for k, n in enumerate(pieces, start=1):
            out[n] = out[n] + str(k).translate(_SUBSCRIPTS)
