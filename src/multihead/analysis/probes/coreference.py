"""Coreference heads: does a head's attention from a pronoun land on its antecedent?

Each example is a sentence with a pronoun, its antecedent and the other candidate mentions
(nouns the pronoun could refer to). The shipped set (``data/coreference.jsonl``) has 32 English
sentences, mostly Winograd-style pairs where swapping one word swaps the answer, and 15 Chinese
ones, including the articles' "The animal didn't cross the street because it was too tired." and
"小明把蛋糕递给小红，因为她不饿了。".

For one head and one example, the pronoun's attention row is averaged over the pronoun's
tokens, and each mention's *mass* is the sum of that row over the mention's tokens.

| key | definition, mean over examples |
|---|---|
| ``coreference`` | accuracy: 1 when the antecedent has more mass than every other candidate |
| ``coreference_mass`` | the antecedent's mass: the share of the pronoun's attention that lands on it |

The baseline is *nearest mention*: always pick the candidate that ends closest before the
pronoun. On the Winograd pairs it is right about half of the time by construction.

The JSONL format, one object per line: ``{"text", "pronoun", "antecedent", "candidates", "lang"}``
with mentions as substrings of ``text``. Each candidate is its first occurrence (whole words in
Latin script); the pronoun is its first occurrence after every candidate.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ...hf.capture import AttentionCapture
from ...hf.model import HFModel, right_padding
from ...hf.route import AttentionChunk

__all__ = ["DEFAULT_EXAMPLES", "CoreferenceExample", "CoreferenceScores", "coreference_scores", "load_examples"]

DEFAULT_EXAMPLES = Path(__file__).with_name("data") / "coreference.jsonl"

Span = tuple[int, int]  # character offsets [start, end)


@dataclass(frozen=True)
class CoreferenceExample:
    text: str
    pronoun: Span
    antecedent: int  # index into candidates
    candidates: tuple[Span, ...]
    lang: str = ""

    def nearest(self) -> int:
        """The candidate that ends closest before the pronoun (the baseline's answer)."""
        before = [(end, c) for c, (_, end) in enumerate(self.candidates) if end <= self.pronoun[0]]
        return max(before)[1]


@dataclass
class CoreferenceScores:
    accuracy: Tensor  # (L, H) share of examples where the antecedent gets the most mass
    mass: Tensor  # (L, H) mean mass on the antecedent
    baseline: float  # nearest-mention accuracy
    examples: int  # scored
    skipped: int = 0  # examples whose pronoun or antecedent the tokenizer turns into its unknown token
    #: per example (E, L, H): the head picked the antecedent (1/0), and its mass there (bootstrap over examples)
    per_example: dict[str, Tensor] | None = None


def _find(text: str, mention: str, start: int = 0) -> Span | None:
    if mention.isascii() and mention[:1].isalnum():
        hit = re.compile(rf"(?<!\w){re.escape(mention)}(?!\w)").search(text, start)
        return None if hit is None else hit.span()
    at = text.find(mention, start)
    return None if at < 0 else (at, at + len(mention))


def _example(record: dict, where: str) -> CoreferenceExample:
    for key in ("text", "pronoun", "antecedent", "candidates"):
        if key not in record:
            raise ValueError(f"{where}: missing {key!r} (expected text, pronoun, antecedent, candidates)")
    text, names = record["text"], list(record["candidates"])
    if record["antecedent"] not in names:
        raise ValueError(f"{where}: antecedent {record['antecedent']!r} is not among the candidates {names}")
    if len(names) < 2:
        raise ValueError(f"{where}: need at least two candidates, got {names}")
    spans = []
    for name in names:
        span = _find(text, name)
        if span is None:
            raise ValueError(f"{where}: candidate {name!r} does not occur in {text!r}")
        spans.append(span)
    pronoun = _find(text, record["pronoun"], max(end for _, end in spans))
    if pronoun is None:
        raise ValueError(f"{where}: pronoun {record['pronoun']!r} does not occur after the candidates in {text!r}")
    return CoreferenceExample(text, pronoun, names.index(record["antecedent"]), tuple(spans), record.get("lang", ""))


def load_examples(path: str | Path | None = None, *, lang: str | None = None) -> list[CoreferenceExample]:
    """Examples from a JSONL file (default: the shipped English + Chinese set), optionally one language."""
    path = Path(path) if path is not None else DEFAULT_EXAMPLES
    examples = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n}: not JSON ({err.msg})") from err
            examples.append(_example(record, f"{path}:{n}"))
    return [e for e in examples if lang is None or e.lang == lang]


def _token_masks(offsets: list[Span], spans: Sequence[Span]) -> list[list[bool]]:
    """For each span, which tokens overlap it (special tokens have empty offsets and never do)."""
    return [[e > s and s < hi and e > lo for s, e in offsets] for lo, hi in spans]


def coreference_scores(model: HFModel, examples: Sequence[CoreferenceExample] | None = None, *,
                       batch_size: int = 16) -> CoreferenceScores:
    """Accuracy and antecedent mass of every head on the examples (default: the shipped set)."""
    examples = list(examples) if examples is not None else load_examples()
    if not examples:
        raise ValueError("no coreference examples")
    tok = model.tokenizer
    if not getattr(tok, "is_fast", False):
        raise ValueError("coreference scores need a fast tokenizer (character offsets of tokens)")
    total = len(examples)
    examples = [e for e in examples if _representable(tok, e)]
    if not examples:
        raise ValueError(f"the tokenizer represents none of the {total} coreference examples' pronouns and "
                         "antecedents (all become its unknown token)")
    L, H = model.num_layers, model.num_heads
    correct = torch.zeros(L, H, dtype=torch.float64)
    mass = torch.zeros(L, H, dtype=torch.float64)
    each = {key: torch.zeros(len(examples), L, H, dtype=torch.float64) for key in ("accuracy", "mass")}
    state: dict[str, Tensor] = {}

    rows: dict[int, Tensor] = {}

    def on_layer(chunk: AttentionChunk) -> None:
        layer, weights = chunk.layer, chunk.weights
        part = torch.einsum("bt,bhts->bhs", state["pronoun"][:, chunk.start:chunk.stop],
                            weights.to(torch.float64))  # (B, H, K)
        S = state["candidates"].shape[-1]
        part = torch.nn.functional.pad(part, (0, S - part.shape[-1]))  # (B, H, S): keys after K have weight 0
        row = part if chunk.start == 0 else rows.pop(layer) + part
        if not chunk.last:
            rows[layer] = row
            return
        cand = torch.einsum("bhs,bcs->bhc", row, state["candidates"])  # (B, H, C)
        cand = cand.masked_fill(~state["real"][:, None, :], -1.0)
        picked = cand.argmax(-1)  # (B, H)
        answer = state["answer"][:, None]  # (B, 1)
        hit = (picked == answer).to(torch.float64).cpu()  # (B, H)
        on = cand.gather(-1, answer[..., None].expand(-1, cand.shape[1], 1))[..., 0].cpu()  # (B, H)
        correct[layer] += hit.sum(0)
        mass[layer] += on.sum(0)
        first = int(state["first"])
        each["accuracy"][first:first + hit.shape[0], layer] = hit
        each["mass"][first:first + hit.shape[0], layer] = on

    with right_padding(tok), AttentionCapture(model.model, on_layer) as capture, torch.inference_mode():
        here = capture.device or model.device  # where the chunks come: the probe's masks beside them
        for start in range(0, len(examples), batch_size):
            chunk = examples[start:start + batch_size]
            enc = tok([e.text for e in chunk], return_offsets_mapping=True, padding=True, return_tensors="pt")
            T = enc["input_ids"].shape[1]
            C = max(len(e.candidates) for e in chunk)
            pronoun = torch.zeros(len(chunk), T, dtype=torch.float64)
            candidates = torch.zeros(len(chunk), C, T, dtype=torch.float64)
            real = torch.zeros(len(chunk), C, dtype=torch.bool)
            for b, e in enumerate(chunk):
                offsets = [tuple(o) for o in enc["offset_mapping"][b].tolist()]
                (p_mask,) = _token_masks(offsets, [e.pronoun])
                if not any(p_mask):
                    raise ValueError(f"the pronoun of {e.text!r} maps to no token")
                pronoun[b] = torch.tensor(p_mask, dtype=torch.float64) / sum(p_mask)
                for c, c_mask in enumerate(_token_masks(offsets, e.candidates)):
                    candidates[b, c] = torch.tensor(c_mask, dtype=torch.float64)
                    real[b, c] = True
            state.update(pronoun=pronoun.to(here), candidates=candidates.to(here), real=real.to(here),
                         answer=torch.tensor([e.antecedent for e in chunk]).to(here), first=torch.tensor(start))
            to = model.device
            model.body(input_ids=enc["input_ids"].to(to), attention_mask=enc["attention_mask"].to(to), **model.no_cache)
    n = len(examples)
    baseline = sum(e.nearest() == e.antecedent for e in examples) / n
    return CoreferenceScores(correct / n, mass / n, baseline, n, total - n, per_example=each)


def _representable(tok, e: CoreferenceExample) -> bool:
    """Whether the pronoun and the antecedent each reach the model as real tokens, not [UNK]: a model
    cannot point from an unknown token to another, so such an example says nothing about its heads."""
    unk = getattr(tok, "unk_token_id", None)
    if unk is None:  # byte-level vocabularies represent everything
        return True
    enc = tok(e.text, return_offsets_mapping=True, verbose=False)
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    for mask in _token_masks(offsets, [e.pronoun, e.candidates[e.antecedent]]):
        ids = [i for i, hit in zip(enc["input_ids"], mask, strict=True) if hit]
        if not ids or any(i == unk for i in ids):
            return False
    return True
