"""One text's attention maps from a real model, for the figures and the page."""

from __future__ import annotations

import torch
from torch import Tensor

from ..hf.capture import AttentionCapture
from ..hf.load import HFModel

__all__ = ["attention_maps", "encode_text", "readable_tokens"]


def attention_maps(model: HFModel, text: str, *, max_tokens: int | None = None) -> tuple[list[str], Tensor]:
    """The tokens of ``text`` and every head's attention: (L, H, T, T) float32, captured layer by layer."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("attention_maps needs a non-empty text")
    enc, tokens = encode_text(model, text, max_tokens=max_tokens)
    maps: dict[int, Tensor] = {}

    def keep(layer: int, weights: Tensor, out: Tensor, visible: Tensor) -> None:
        maps[layer] = weights[0].detach().float().cpu()  # (H, T, T)

    with AttentionCapture(model.model, keep), torch.inference_mode():
        model.body(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    return tokens, torch.stack([maps[k] for k in sorted(maps)])


def encode_text(model: HFModel, text: str, *, max_tokens: int | None = None) -> tuple[dict, list[str]]:
    """``text`` encoded for the model (a batch of one, cut at ``max_tokens`` or the model's
    positions) and its tokens as people read them."""
    tok = model.tokenizer
    limit = max_tokens or model.max_positions
    fast = bool(getattr(tok, "is_fast", False))
    enc = tok(text, return_tensors="pt", truncation=limit is not None, max_length=limit, return_offsets_mapping=fast)
    offsets = enc.pop("offset_mapping")[0].tolist() if fast else None
    return enc, readable_tokens(tok, enc["input_ids"][0].tolist(), text, offsets)


def readable_tokens(tok, ids: list[int], text: str, offsets: list | None = None) -> list[str]:
    """Tokens as people read them: byte-level BPE pieces decoded ("å°" -> "小"; a character split
    over several byte tokens is shown on each of them), WordPiece's "##" kept, specials as named.
    ``offsets``: the tokens' character spans in ``text`` (fast tokenizers)."""
    raw = tok.convert_ids_to_tokens(ids)
    special = set(getattr(tok, "all_special_ids", ()) or ())
    out = []
    for n, (i, t) in enumerate(zip(ids, raw, strict=True)):
        if i in special or t.startswith("##"):
            out.append(t)
            continue
        decoded = tok.convert_tokens_to_string([t])
        if "\ufffd" in decoded and offsets is not None and offsets[n][1] > offsets[n][0]:
            decoded = text[offsets[n][0]:offsets[n][1]]  # part of a multi-byte character: show the character
        out.append(decoded if decoded.strip() else t.replace("Ġ", " ").replace("▁", " "))
    return out
