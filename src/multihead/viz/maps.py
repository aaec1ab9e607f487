"""One text's attention maps from a real model, for the figures and the page."""

from __future__ import annotations

import torch
from torch import Tensor

from ..hf.capture import AttentionCapture
from ..hf.load import HFModel

__all__ = ["attention_maps"]


def attention_maps(model: HFModel, text: str, *, max_tokens: int | None = None) -> tuple[list[str], Tensor]:
    """The tokens of ``text`` and every head's attention: (L, H, T, T) float32, captured layer by layer."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("attention_maps needs a non-empty text")
    tok = model.tokenizer
    limit = max_tokens or model.max_positions
    enc = tok(text, return_tensors="pt", truncation=limit is not None, max_length=limit)
    tokens = tok.convert_ids_to_tokens(enc["input_ids"][0].tolist())
    maps: dict[int, Tensor] = {}

    def keep(layer: int, weights: Tensor, out: Tensor, visible: Tensor) -> None:
        maps[layer] = weights[0].detach().float().cpu()  # (H, T, T)

    with AttentionCapture(model.model, keep), torch.inference_mode():
        model.body(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    return [t.replace("Ġ", " ").replace("▁", " ") for t in tokens], torch.stack([maps[k] for k in sorted(maps)])
