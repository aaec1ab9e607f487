"""What a sparse attention would do to a real model: its loss with its layers attending through one of our masks.

:func:`what_if` measures the change in a causal language model's loss on texts when every layer
— and each layer alone — attends only where ``spec`` allows (``"window=256,sinks=4"``: a ±256
window and the first four tokens as sinks, StreamingLLM's recipe), through
:class:`~multihead.hf.replace_attention`; the local and sparse kernels then compute only the band.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ...hf.interventions import replace_attention
from ...hf.logits import on_rows, token_losses
from ...hf.model import HFModel, right_padding
from ...masks import Mask, global_tokens, window
from ...progress import bar
from ..sections import WhatIf as WhatIfSection
from .whatif_spec import read_what_if

__all__ = ["WhatIf", "check_what_if", "parse_what_if", "what_if"]


def parse_what_if(spec: str) -> tuple[Mask, str]:
    """``"window=256,sinks=4"`` -> (window(256) | global_tokens(range(4)), a readable name)."""
    found = read_what_if(spec)
    mask: Mask = window(found.window, 0)  # causal models: the last W tokens and the query itself
    if found.sinks:
        mask = mask | global_tokens(list(range(found.sinks)))
    return mask, found.name


@dataclass
class WhatIf:
    """A causal LM's loss (mean next-token cross-entropy, nats per token) with a mask in place."""

    name: str
    tokens: int
    loss: float  # intact
    replaced: float  # every layer with the mask
    per_layer: list[float]  # only layer l with the mask

    def section(self) -> WhatIfSection:
        return WhatIfSection(self.name, self.tokens, self.loss, self.replaced, self.replaced - self.loss,
                             [x - self.loss for x in self.per_layer])


def check_what_if(model: HFModel, texts: Sequence[str], spec: str) -> None:
    """Raise ValueError unless :func:`what_if` can measure ``spec`` on ``model`` over ``texts``: a
    causal language model with its head, and a token to predict (texts of two tokens or more) —
    asked of the tokenizer alone, before any forward."""
    parse_what_if(spec)
    if not model.is_causal or not model.has_lm_head:
        raise ValueError(f"what-if measures a causal language model's loss; {model.name} is not one "
                         "(an encoder, or a decoder loaded without its language-model head)")
    if not texts:
        raise ValueError("what-if measures a loss on texts; got none")
    if not any(len(ids) > 1 for ids in model.tokenizer(list(texts), verbose=False)["input_ids"]):
        raise ValueError("what-if measures the loss on the tokens after each text's first, and every text is a "
                         "single token; give texts of two tokens or more")


def what_if(model: HFModel, texts: Sequence[str], spec: str, *, per_layer: bool = True,
            progress: bool | None = False) -> WhatIf:
    """The change in ``model``'s loss on ``texts`` when its layers attend with the ``spec`` mask;
    ``progress``: a line with the time left as its forwards go (2 + one a layer: minutes on a long text)."""
    check_what_if(model, texts, spec)
    mask, name = parse_what_if(spec)
    lm = model.model
    tok = model.tokenizer
    with right_padding(tok):
        batches = [tok([t], return_tensors="pt", verbose=False).to(model.device) for t in texts]
    batches = [batch for batch in batches if batch["input_ids"].shape[1] > 1]  # a single token predicts nothing

    def loss() -> tuple[float, int]:
        # the logits a part of the rows at a time (hf.logits.on_rows): a long text's whole (T, V) block in
        # float32, with log-softmax's as large beside it, was 2.2 GB a forward for SmolLM2 at 5,654 tokens —
        # paged in afresh by each of the what-if's 32 forwards, 2.5-2.9 s of loss against 0.6 s in blocks
        # (Intel Xeon, two threads)
        total, count = 0.0, 0
        with torch.inference_mode():
            for batch in batches:
                ids = batch["input_ids"]  # (1, T)
                predicting = torch.ones_like(ids, dtype=torch.bool)  # (1, T): every position but the last
                predicting[:, -1] = False
                target = ids[:, 1:].reshape(-1)  # (T-1,)
                losses = on_rows(model, {**batch, "use_cache": False}, predicting,
                                 lambda logits, part, target=target: token_losses(logits, target[part]))  # (T-1,)
                total += float(losses.double().sum())  # one read back a text
                count += int(target.numel())
        return total / max(count, 1), count

    # the intact model, every layer replaced, then each layer alone: one forward over the texts each
    passes: list[list[int] | None] = [[], None, *([[layer] for layer in range(model.num_layers)] if per_layer else [])]
    losses, count = [], 0
    for layers in bar(passes, desc="what if: the loss", unit="forward", progress=progress):
        if layers == []:
            value, count = loss()
        else:
            with replace_attention(lm, mask, layers=layers):
                value = loss()[0]
        losses.append(value)
    return WhatIf(name, count, losses[0], losses[1], losses[2:])
