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
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .model import HFModel, forward_replaced
from .placement import is_offloaded

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
    slice of the N marked positions this part holds); the reads concatenated along dim 0. With
    nothing marked the model still runs (its hooks see the batch; a loss keeps its graph) and
    ``read`` gets a (0, V) part.

    ``inputs`` are the model's keyword arguments for one forward of ``model.model`` (input ids,
    attention mask, ``use_cache``). The states are taken from the base model, or from the decoder
    where the model calls that directly (OPT's); a model that calls neither on (B, T) inputs gets
    its own logits of every row, read in the same parts. A head that cannot take the cut states (an
    error, or logits not of their rows' shape) gets them whole, the layers not run again. Logits are
    taken to be made row by row from the states, as every language model's head makes them.
    An offloaded head (its weights brought in for each call) takes parts of at least its weights' bytes.
    """
    lm = model.model
    rows = rows.bool()
    B, T = rows.shape
    marked = int(rows.sum())  # the one read back: how many rows, for the parts
    per_part = max(1, _part_bytes(lm, part_bytes) // (4 * _vocabulary(model)))
    first = min(per_part, marked)
    taken: dict[str, Any] = {}  # the marked rows' states (N, D), the module that gave them, its whole output

    def take(module: nn.Module, _args: Any, output: Any) -> Any:
        hidden = _hidden(output)
        if taken or hidden is None or hidden.dim() != 3 or tuple(hidden.shape[:2]) != (B, T):
            return None  # not the one call on the batch: its own outputs
        taken.update(rows=hidden[rows.to(hidden.device)], module=module, output=output)  # (N, D)
        return _with_hidden(type(output), taken["rows"][:first][None])  # (1, n, D): the first part on to the head

    handles = [m.register_forward_hook(take) for m in _states_modules(lm, model.body)]
    logits = None
    try:
        logits = lm(**inputs).logits
    except (RuntimeError, ValueError, IndexError):
        if not taken:
            raise  # the model's own error, not the cut's
    finally:
        for handle in handles:
            handle.remove()
    if not taken:  # no module gave the batch's states: every row's logits, as the model made them
        return _whole(logits, rows, per_part, read)
    if logits is None or tuple(logits.shape[:2]) != (1, first):
        logits = None
        with _answering(taken["module"], taken["output"]):  # the states whole, the layers not run again
            return _whole(lm(**inputs).logits, rows, per_part, read)  # (B, T, V)
    hidden, module, kind = taken["rows"], taken["module"], type(taken["output"])
    taken.clear()  # the whole output let go
    reads = [read(logits[0], slice(0, first))]
    del logits
    for start in range(first, marked, per_part):
        part = slice(start, min(marked, start + per_part))
        with _answering(module, _with_hidden(kind, hidden[part][None])):
            reads.append(read(lm(**inputs).logits[0], part))  # (n, V) read, then let go
    return torch.cat(reads)


def _answering(module: nn.Module, answer: Any) -> contextlib.AbstractContextManager:
    """While open, calling ``module`` returns ``answer`` without running it."""
    return forward_replaced(module, lambda *_args, **_kwargs: answer)


def _whole(logits: Tensor, rows: Tensor, per_part: int, read: Callable[[Tensor, slice], Tensor]) -> Tensor:
    """The reads of ``logits`` (B, T, V) at the marked rows, in the same parts (one empty part for none)."""
    picked = logits[rows.to(logits.device)]  # (N, V)
    N = len(picked)
    return torch.cat([read(picked[s:s + per_part], slice(s, min(N, s + per_part)))
                      for s in range(0, max(N, 1), per_part)])


def _states_modules(lm: nn.Module, body: nn.Module) -> list[nn.Module]:
    """The modules whose output may be the states the head reads: the base model, and the decoder
    where it is another module (OPT's causal LM calls ``model.decoder`` itself)."""
    found = [body]
    try:
        decoder = lm.get_decoder() if hasattr(lm, "get_decoder") else None
    except (AttributeError, NotImplementedError, ValueError):  # a model without a rule for it
        decoder = None
    if isinstance(decoder, nn.Module) and decoder is not body and decoder is not lm:
        found.append(decoder)
    return found


def _part_bytes(lm: nn.Module, part_bytes: int) -> int:
    """``part_bytes``, or — where accelerate brings the head's weights in for each call — at least
    their bytes: a part's logits then cost no more than the copy that comes with it."""
    head = getattr(lm, "get_output_embeddings", lambda: None)()
    if isinstance(head, nn.Module) and is_offloaded(head):
        return max(part_bytes, sum(p.numel() * p.element_size() for p in head.parameters()))
    return part_bytes


def _vocabulary(model: HFModel) -> int:
    head = getattr(model.model, "get_output_embeddings", lambda: None)()
    config = getattr(model.model, "config", None)
    for found in (getattr(head, "out_features", None), getattr(config, "vocab_size", None)):
        if isinstance(found, int) and found > 0:
            return found
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, Tensor) and weight.dim() == 2 else 1


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
