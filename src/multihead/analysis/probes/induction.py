"""Duplicate-token and induction scores of a causal model, on repeated random token sequences.

The probe: ``count`` sequences, each a prefix (the BOS token, when the tokenizer has one) then
``length`` tokens drawn uniformly from the vocabulary (special tokens excluded), then the same
``length`` tokens again. For a query at position ``i`` in the repeated half, its token last
occurred at ``i - length``.

| key | definition (mean over every query of the repeated half, every sequence) |
|---|---|
| ``duplicate_token`` | ``p[i, i - length]``: attention to the earlier copy of the query's own token |
| ``induction`` | ``p[i, i - length + 1]``: attention to the token that *followed* the earlier copy — |
|  | the token an induction head predicts comes next (Olsson et al. 2022) |

Random tokens carry no meaning and no n-gram statistics, so only a head that matches tokens by
identity can score high: a uniform head over the ``~1.5·length`` visible keys scores about
``1 / (1.5·length)`` on both.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...hf.capture import AttentionCapture, BatchReader, LayerCallback
from ...hf.model import HFModel
from ...hf.route import AttentionChunk

__all__ = ["induction_scores", "repeated_sequences"]


def repeated_sequences(tokenizer, *, count: int = 32, length: int = 40, seed: int = 0) -> tuple[Tensor, int]:
    """(count, prefix + 2·length) token ids and the prefix length; deterministic for a seed."""
    if count < 1 or length < 2:
        raise ValueError(f"need count >= 1 and length >= 2; got count={count}, length={length}")
    special = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)
    vocab = torch.arange(len(tokenizer))
    allowed = vocab[~torch.isin(vocab, special)]
    g = torch.Generator().manual_seed(seed)
    half = allowed[torch.randint(len(allowed), (count, length), generator=g)]  # (count, length)
    bos = tokenizer.bos_token_id
    prefix = torch.full((count, 1 if bos is not None else 0), bos if bos is not None else 0, dtype=torch.long)
    return torch.cat([prefix, half, half], dim=1), prefix.shape[1]


def induction_scores(model: HFModel, *, count: int = 32, length: int = 40, seed: int = 0,
                     batch_size: int = 16, per_sequence: dict[str, Tensor] | None = None,
                     reader: BatchReader | None = None) -> dict[str, Tensor]:
    """``{"duplicate_token": (L, H), "induction": (L, H)}`` float64 means over the probe; with a
    ``per_sequence`` dict, also each sequence's own means there ({key: (count, L, H)}: the scores'
    bootstrap over the probe's sequences). ``reader``: called with the first batch's token ids (its
    first ``batch_size`` sequences), and what it returns handed every chunk of that batch's pass
    (e.g. the page's view of the first, :class:`~multihead.analysis.pipelines.views.InputViews`)."""
    ids, prefix = repeated_sequences(model.tokenizer, count=count, length=length, seed=seed)
    if model.max_positions and ids.shape[1] > model.max_positions:
        raise ValueError(f"the probe needs {ids.shape[1]} positions; the model takes {model.max_positions}")
    L, H = model.num_layers, model.num_heads
    sums = {key: torch.zeros(L, H, dtype=torch.float64) for key in ("duplicate_token", "induction")}
    by_sequence = {key: torch.zeros(count, L, H, dtype=torch.float64) for key in sums}
    queries = torch.arange(prefix + length, prefix + 2 * length)  # the repeated half
    n = 0
    at = [0]  # the first sequence of the running batch

    also: list[LayerCallback] = []  # the reader's callback, during the first batch

    def on_layer(chunk: AttentionChunk) -> None:
        for read in also:
            read(chunk)
        layer = chunk.layer
        if not chunk.whole:  # the probe's texts are short: a streamed chunk is padded back to the whole map
            raise ValueError("the induction probe reads whole maps; its texts fit any memory budget")
        repeated = queries.to(chunk.weights.device)  # gather's index lives where the map does (a GPU's)
        rows = chunk.weights[:, :, repeated].to(torch.float64)  # (B, H, Q, S)
        dup = rows.gather(-1, (repeated - length).view(1, 1, -1, 1).expand(*rows.shape[:3], 1))  # (B, H, Q, 1)
        ind = rows.gather(-1, (repeated - length + 1).view(1, 1, -1, 1).expand(*rows.shape[:3], 1))
        for key, picked in (("duplicate_token", dup), ("induction", ind)):
            each = picked.sum(dim=(2, 3)).cpu()  # (B, H) per sequence
            sums[key][layer] += each.sum(0)
            by_sequence[key][at[0]:at[0] + each.shape[0], layer] = each / len(queries)

    with AttentionCapture(model.model, on_layer), torch.inference_mode():
        for start in range(0, count, batch_size):
            at[0] = start
            also[:] = [reader(ids[start:start + batch_size].tolist())] if reader is not None and start == 0 else []
            batch = ids[start:start + batch_size].to(model.device)
            model.body(input_ids=batch, attention_mask=torch.ones_like(batch), **model.no_cache)
            n += batch.shape[0] * len(queries)
    if per_sequence is not None:
        per_sequence.update(by_sequence)
    return {key: value / n for key, value in sums.items()}
