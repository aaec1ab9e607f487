"""What a sparse attention would do to a real model: run its layers with one of our masks.

``with mh.hf.replace_attention(model, mh.masks.window(256) | mh.masks.global_tokens(range(4))):``
every chosen self-attention layer (default: all) computes its attention through our kernels with
the model's own mask *and* this one — the StreamingLLM recipe above keeps a ±256 window and the
first four tokens as sinks. The local and sparse kernels then compute only the band: O(n·w).
:func:`what_if` measures the change in a causal language model's loss on texts, with every
layer replaced and with each layer alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..masks import Mask, global_tokens, window
from .capture import EXTRA_MASK_ATTRIBUTE, restore, route_through_capture
from .load import HFModel, ModelLike, as_module, right_padding
from .sites import find_sites, main_stack

__all__ = ["WhatIf", "parse_what_if", "replace_attention", "what_if"]


class replace_attention:  # noqa: N801 - used as a context manager, like torch.no_grad
    """Context manager: the chosen ``layers`` (default: every layer of the model's self-attention
    stack) attend only where ``mask`` (True = may attend) and the model's own mask both allow."""

    def __init__(self, model: ModelLike, mask: Mask, *, layers: Iterable[int] | None = None) -> None:
        if not isinstance(mask, Mask):
            raise TypeError(f"replace_attention takes a multihead Mask (e.g. masks.window(256)); got "
                            f"{type(mask).__name__}")
        self.model = as_module(model)
        sites = find_sites(self.model)
        stack = main_stack(sites)
        sites = [s for s in sites if s.stack == stack]
        if any(s.ours for s in sites):
            raise TypeError("replace_attention is for transformers models; our own layers take masks directly")
        chosen = range(len(sites)) if layers is None else sorted(set(int(x) for x in layers))
        bad = [x for x in chosen if not 0 <= x < len(sites)]
        if bad:
            raise ValueError(f"layers {bad} out of range; the model has {len(sites)} attention layers")
        self.modules = [sites[x].module for x in chosen]
        self.mask = mask
        self._saved: list = []

    def __enter__(self) -> replace_attention:
        for module in self.modules:
            setattr(module, EXTRA_MASK_ATTRIBUTE, self.mask)
        self._saved = route_through_capture(self.model)
        return self

    def __exit__(self, *exc: object) -> None:
        for module in self.modules:
            if hasattr(module, EXTRA_MASK_ATTRIBUTE):
                delattr(module, EXTRA_MASK_ATTRIBUTE)
        restore(self._saved)
        self._saved = []


def parse_what_if(spec: str) -> tuple[Mask, str]:
    """``"window=256,sinks=4"`` -> (window(256) | global_tokens(range(4)), a readable name)."""
    parts: dict[str, int] = {}
    for item in spec.split(","):
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in ("window", "sinks") or not value.strip().isdigit():
            raise ValueError(f"what-if must look like 'window=256,sinks=4' (window required, sinks optional); "
                             f"got {spec!r}")
        parts[key] = int(value)
    if "window" not in parts or parts["window"] < 1:
        raise ValueError(f"what-if needs window=W with W >= 1; got {spec!r}")
    mask: Mask = window(parts["window"], 0)  # causal models: the last W tokens and the query itself
    name = f"window {parts['window']}"
    if parts.get("sinks"):
        mask = mask | global_tokens(list(range(parts["sinks"])))
        name += f" + {parts['sinks']} sinks"
    return mask, name


@dataclass
class WhatIf:
    """A causal LM's loss (mean next-token cross-entropy, nats per token) with a mask in place."""

    name: str
    tokens: int
    loss: float  # intact
    replaced: float  # every layer with the mask
    per_layer: list[float]  # only layer l with the mask

    def to_dict(self) -> dict:
        return {"mask": self.name, "tokens": self.tokens, "loss": self.loss, "loss_all_layers": self.replaced,
                "delta_all_layers": self.replaced - self.loss,
                "delta_per_layer": [x - self.loss for x in self.per_layer]}

    def table(self) -> str:
        lines = [f"What if the model attended with {self.name}? Mean next-token loss over {self.tokens} tokens "
                 f"(nats): intact {self.loss:.4f}, every layer {self.replaced:.4f} ({self.replaced - self.loss:+.4f})",
                 "layer alone | loss   | change"]
        lines += [f"{layer:11d} | {x:.4f} | {x - self.loss:+.4f}" for layer, x in enumerate(self.per_layer)]
        return "\n".join(lines)


def what_if(model: HFModel, texts: Sequence[str], spec: str, *, per_layer: bool = True) -> WhatIf:
    """The change in ``model``'s loss on ``texts`` when its layers attend with the ``spec`` mask."""
    mask, name = parse_what_if(spec)
    lm = model.model
    if not model.is_causal or getattr(lm, "get_output_embeddings", lambda: None)() is None:
        raise ValueError(f"what-if measures a causal language model's loss; {model.name} is not one "
                         "(an encoder, or a decoder loaded without its language-model head)")
    tok = model.tokenizer
    with right_padding(tok):
        batches = [tok([t], return_tensors="pt", verbose=False) for t in texts]

    def loss() -> tuple[float, int]:
        total, count = 0.0, 0
        with torch.inference_mode():
            for batch in batches:
                logits = lm(**batch).logits[:, :-1]  # (1, T-1, V)
                target = batch["input_ids"][:, 1:]
                if logits.dtype in (torch.float16, torch.bfloat16):
                    logits = logits.float()
                # (N, V) rows: over a strided vocabulary axis ((B, V, T) layout) it is ~1e-4 off on the CPU
                total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                               reduction="sum"))
                count += int(target.numel())
        return total / max(count, 1), count

    intact, count = loss()
    with replace_attention(lm, mask):
        replaced, _ = loss()
    layers = []
    if per_layer:
        for layer in range(model.num_layers):
            with replace_attention(lm, mask, layers=[layer]):
                layers.append(loss()[0])
    return WhatIf(name, count, intact, replaced, layers)
