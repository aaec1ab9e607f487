"""A long text's attention for the page, streamed: block-pooled maps and each row's largest weights.

A document of thousands of tokens cannot be stored as L·H·T² weights (SmolLM2 at 4,096 tokens:
18 GB). :func:`streamed_page_text` captures the maps in chunks of query rows
(:class:`~multihead.hf.AttentionCapture` with ``chunk``) and keeps, per head:

* **block-pooled maps**: the T x T map cut into blocks of ``block`` x ``block`` tokens (``block``
  chosen from T so the pooled map has at most :data:`POOLED_CELLS` cells a side); per block the
  *mass* (the mean over its query rows of the weight they put on its keys) and the *max* (the
  largest single weight in it). Together they say where attention goes and whether one key
  takes it;
* **the k largest weights of every row** (k chosen from T to keep the page small), from which
  the page draws any region at full resolution; what a row does not store is shown as "not
  stored", with the share of the row's attention that is stored.

Both are quantised to a byte (on a square-root scale for the pooled maps: faint long-range mass
stays visible) and gzip-compressed; the page inflates them with the browser's own
``DecompressionStream``.
"""

from __future__ import annotations

import base64
import gzip
import math

import torch
from torch import Tensor

from ..hf.capture import AttentionCapture
from ..hf.load import HFModel
from .maps import encode_text

__all__ = ["LONG_TEXT", "POOLED_CELLS", "pooled_maps", "streamed_page_text", "top_k_for"]

#: Above this many tokens a text is shown pooled (the head view's lines and the plain matrix stop
#: being readable long before).
LONG_TEXT = 512
#: The pooled maps have at most this many blocks a side.
POOLED_CELLS = 128
#: Bytes of stored top-k entries (3 bytes each: a uint16 key, a uint8 weight) a page may hold
#: before compression; k is the largest that fits, between 4 and 16 (SmolLM2 at 4,096 tokens: 6,
#: a page of ~18 MB; MiniLM at 512: 16).
TOP_K_BYTES = 20 << 20


def top_k_for(num_heads_total: int, tokens: int) -> int:
    """How many weights per row a page of ``num_heads_total`` heads over ``tokens`` tokens stores."""
    return max(4, min(16, TOP_K_BYTES // max(1, num_heads_total * tokens * 3)))


def pooled_maps(weights: Tensor, start: int, block: int, cells: int) -> tuple[Tensor, Tensor, Tensor]:
    """One chunk's contribution to the pooled maps.

    weights (H, c, K): query rows ``start`` .. ``start + c`` over keys 0..K-1. Returns, over
    (row block, key block) cells (H, cells, cells): the weight summed over each cell, the largest
    weight in it, and how many query rows each row block received from this chunk (cells,).
    """
    H, c, K = weights.shape
    width = cells * block
    padded = torch.zeros(H, c, width, dtype=torch.float32, device=weights.device)
    padded[..., :K] = weights.float()
    by_key = padded.view(H, c, cells, block)  # (H, c, cells, block)
    row_block = (torch.arange(start, start + c, device=weights.device) // block)  # (c,)
    total = torch.zeros(H, cells, cells, device=weights.device).index_add_(1, row_block, by_key.sum(-1))
    index = row_block.view(1, c, 1).expand(H, c, cells)
    largest = torch.zeros(H, cells, cells, device=weights.device).scatter_reduce_(
        1, index, by_key.amax(-1), reduce="amax")
    rows = torch.zeros(cells, device=weights.device).index_add_(0, row_block, torch.ones(c, device=weights.device))
    return total, largest, rows


def _pack(raw: bytes) -> str:
    """gzip, then base64: the page inflates it with DecompressionStream("gzip")."""
    return base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode()


def streamed_page_text(model: HFModel, text: str, *, chunk: int = 256, top_k: int | None = None) -> dict:
    """The page's entry for one long text of a causal or encoder text model, captured in chunks
    of ``chunk`` query rows: peak memory O(H·chunk·T) per layer plus L·H·T·k stored bytes."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("the page needs a non-empty text")
    enc, tokens = encode_text(model, text)
    ids = enc["input_ids"]
    L, H, T = model.num_layers, model.num_heads, ids.shape[1]
    k = min(T, top_k or top_k_for(L * H, T))
    block = max(1, math.ceil(T / POOLED_CELLS))
    cells = math.ceil(T / block)
    index = torch.zeros(L, H, T, k, dtype=torch.int32)
    values = torch.zeros(L, H, T, k, dtype=torch.uint8)
    mass = torch.zeros(L, H, cells, cells)
    largest = torch.zeros(L, H, cells, cells)
    rows = torch.zeros(cells)  # query rows per row block (counted on layer 0)

    def keep(layer: int, weights: Tensor, out: Tensor, visible: Tensor, start: int = 0) -> None:
        w = weights[0].detach().float()  # (H, c, K)
        c = w.shape[1]
        top, where = w.topk(min(k, w.shape[-1]), dim=-1)  # (H, c, k')
        index[layer, :, start:start + c, :top.shape[-1]] = where.to(torch.int32).cpu()
        values[layer, :, start:start + c, :top.shape[-1]] = (top.clamp(0, 1) * 255).round().to(torch.uint8).cpu()
        total, big, counted = pooled_maps(w, start, block, cells)
        mass[layer] += total.cpu()
        if layer == 0:
            rows.add_(counted.cpu())
        torch.maximum(largest[layer], big.cpu(), out=largest[layer])

    with AttentionCapture(model.model, keep, chunk=min(chunk, T)), torch.inference_mode():
        model.body(input_ids=ids, attention_mask=enc["attention_mask"])
    mass /= rows.view(1, 1, cells, 1)  # mean row mass per block, in [0, 1]
    scale = mass.flatten(2).amax(-1).clamp_min(1e-12)  # (L, H) each head's largest block mass
    mass_q = (mass / scale[..., None, None]).sqrt().mul(255).round().to(torch.uint8)
    largest_q = largest.clamp(0, 1).sqrt().mul(255).round().to(torch.uint8)
    return {
        "text": text, "tokens": tokens, "k": k, "gzip": True,
        "index": _pack(index.numpy().astype("<u2").tobytes()),
        "values": _pack(values.numpy().tobytes()),
        "pooled": {"block": block, "cells": cells, "mass": _pack(mass_q.numpy().tobytes()),
                   "max": _pack(largest_q.numpy().tobytes()),
                   "mass_scale": [round(float(s), 6) for s in scale.flatten()]},
    }
