"""A language model's logits at chosen positions only, made a part of the rows at a time.

A causal LM's forward makes logits at every position, (B, T, V) in the model's dtype, and a loss
reads them in float32: at 8,192 positions SmolLM2's 49,152 words are 0.8 GB in bfloat16 and
1.6 GB again in float32, Llama 3's 128,256 words 2.1 GB and 4.2 GB — more than the rest of an
8B model's forward holds at that length. The ablation passes (8,192 positions each), a what-if on a
long document and a patched run all read only some rows, or read rows one loss at a time.

:func:`on_rows` runs the model once, up to its base model's last hidden states (``HFModel.body``),
takes the hidden states of the chosen positions, (N, D), and runs the rest of the model's own
forward — its final transform, output embedding and whatever it does to logits after it (Gemma's
soft-cap, a logit scale) — on at most ``part_bytes`` of float32 logits' worth of those rows at a
time: the base model answers the later calls with the next rows (a forward of its own that returns
them, not its layers again). What the caller keeps of a part (its rows' losses, a few logits) is
all that outlives it. Under autograd the rows keep their graph, so a loss's gradient reaches the
model; every part's logits are then held until the backward, as a whole forward holds them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .model import HFModel

__all__ = ["PART_BYTES", "on_rows", "token_losses"]

#: The float32 logits one part of rows may take (its model-dtype logits and the loss's work beside them).
PART_BYTES = 64 << 20


def token_losses(logits: Tensor, targets: Tensor) -> Tensor:
    """−log softmax(logits)[target] (…), from logits (…, V) and targets (…) on any device: in float32
    (float64 stays float64). Without a gradient as logsumexp − logit, no log-softmax of every word
    written; with one as cross-entropy, whose backward makes one (…, V) gradient where logsumexp's
    and gather's make four (SmolLM2, 349 rows: a backward's peak 915 → 1,147 MiB that way)."""
    if logits.dtype != torch.float64:
        logits = logits.float()
    targets = targets.to(logits.device)
    if logits.requires_grad:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               reduction="none").view(targets.shape)
    return logits.logsumexp(-1) - logits.gather(-1, targets[..., None])[..., 0]


def on_rows(model: HFModel, inputs: dict[str, Any], rows: Tensor, read: Callable[[Tensor, slice], Tensor], *,
            part_bytes: int = PART_BYTES) -> Tensor:
    """``read(logits, part)`` for the logits (n, V) of the positions ``rows`` (B, T) bool marks, in
    row-major order, a part of at most ``part_bytes`` of float32 logits at a time (``part``: the
    slice of the N marked positions this part holds); the reads concatenated along dim 0 ((0,)
    where nothing is marked).

    ``inputs`` are the model's keyword arguments for one forward of ``model.model`` (input ids,
    attention mask, ``use_cache``); ``rows`` is read where the hidden states are. A model whose
    base model is not called once on (B, T) inputs with (B, T, D) states, or whose logits are not
    made row by row from them, gets one whole forward instead, read in the same parts.
    """
    lm, body = model.model, model.body
    B, T = rows.shape
    marked = int(rows.sum())  # the one read back: how many rows, for the parts
    if marked == 0:
        return torch.empty(0)
    per_part = max(1, part_bytes // (4 * _vocabulary(model)))
    first = min(per_part, marked)
    taken: list[Any] = []  # the marked rows' hidden states (N, D) and the class of what the base model returned

    def take(_module: nn.Module, _args: Any, output: Any) -> Any:
        hidden = _hidden(output)
        if taken or hidden is None or hidden.dim() != 3 or tuple(hidden.shape[:2]) != (B, T):
            return None  # not the one call on the batch: the model's own outputs (every row's logits)
        taken.extend([hidden[rows.to(hidden.device)], type(output)])  # (N, D)
        return _with_hidden(taken[1], taken[0][:first][None])  # (1, n, D): the first part on to the head

    handle = body.register_forward_hook(take)
    try:
        logits = lm(**inputs).logits
    finally:
        handle.remove()
    if not taken or tuple(logits.shape[:2]) != (1, first):
        if taken:  # the states were cut but the logits are not their rows': the whole forward, uncut
            taken.clear()
            logits = lm(**inputs).logits  # (B, T, V)
        return _whole(logits, rows, per_part, read)
    reads = [read(logits[0], slice(0, first))]
    del logits
    hidden, kind = taken  # (N, D)
    del taken[:]
    for start in range(first, marked, per_part):
        part = slice(start, min(marked, start + per_part))
        with _answering(body, _with_hidden(kind, hidden[part][None])):
            reads.append(read(lm(**inputs).logits[0], part))  # (n, V) read, then let go
    return torch.cat(reads)


def _whole(logits: Tensor, rows: Tensor, per_part: int, read: Callable[[Tensor, slice], Tensor]) -> Tensor:
    """The reads of ``logits`` (B, T, V) at the marked rows, in the same parts."""
    picked = logits[rows.to(logits.device)]  # (N, V)
    return torch.cat([read(picked[s:s + per_part], slice(s, min(len(picked), s + per_part)))
                      for s in range(0, len(picked), per_part)])


def _vocabulary(model: HFModel) -> int:
    head = getattr(model.model, "get_output_embeddings", lambda: None)()
    weight = getattr(head, "weight", None)
    if isinstance(weight, Tensor) and weight.dim() == 2:
        return int(weight.shape[0])
    return int(getattr(getattr(model.model, "config", None), "vocab_size", 0) or 1)


def _hidden(output: Any) -> Tensor | None:
    """A base model's last hidden states from what its forward returned (a ModelOutput or a tuple)."""
    found = getattr(output, "last_hidden_state", None)
    if found is None and isinstance(output, tuple) and output:
        found = output[0]
    return found if isinstance(found, Tensor) else None


def _with_hidden(kind: type, hidden: Tensor) -> Any:
    """What the base model returns with ``hidden`` as its last hidden states, as an output of
    ``kind`` did: a ModelOutput of that class without its other fields, or a one-tensor tuple."""
    if issubclass(kind, tuple) and not hasattr(kind, "last_hidden_state"):
        return (hidden,)
    return kind(last_hidden_state=hidden)


@contextlib.contextmanager
def _answering(module: nn.Module, answer: Any) -> Iterator[None]:
    """While open, calling ``module`` returns ``answer`` without running it (an instance forward,
    which ``nn.Module.__call__`` takes — also over the one accelerate's hooks put there)."""
    saved = module.__dict__.get("forward")
    module.forward = lambda *_args, **_kwargs: answer
    try:
        yield
    finally:
        if saved is None:
            module.__dict__.pop("forward", None)
        else:
            module.forward = saved
