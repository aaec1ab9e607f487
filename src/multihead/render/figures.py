"""Static figures of attention (matplotlib): one head, a layer's heads, the whole model, and the
head x head similarity matrix. Saved as PNG or SVG by the file's suffix.

Token labels in Chinese and other non-Latin scripts render as glyphs: a CJK font is looked up
among the installed system fonts and, failing that, taken from the ``cvttf-notosanscjk-regular``
package (Noto Sans CJK, installed by ``make``), and put behind the default font as a fallback.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..analysis.stats.patches import grid_size
from ..plotting import cjk_font, new_figure, save_figure, styled

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..analysis.report import Report

__all__ = ["cjk_font", "head_heatmap", "image_attention_grid", "layer_grid", "model_grid", "rollout_grid", "save",
           "similarity_matrix"]


def _matrix(weights: Tensor, dims: int, name: str) -> Tensor:
    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions; got shape {tuple(w.shape)}")
    return w


def _labels(tokens: Sequence[str] | None, n: int, which: str) -> list[str]:
    if tokens is None:
        return [str(i) for i in range(n)]
    if len(tokens) != n:
        raise ValueError(f"{which} tokens: got {len(tokens)} labels for {n} positions")
    return [str(t) for t in tokens]


@styled
def head_heatmap(weights: Tensor, tokens: Sequence[str] | None = None, key_tokens: Sequence[str] | None = None,
                 *, title: str = "", ax=None) -> Figure:
    """One head's attention (T, S): rows are queries, columns keys, with token labels on both axes."""
    w = _matrix(weights, 2, "weights")
    T, S = w.shape
    if ax is None:
        size = max(3.0, min(0.28 * max(T, S) + 1.5, 30.0))
        fig, ax = new_figure(figsize=(size + 1, size), dpi=100)
    else:
        fig = ax.figure
    image = ax.imshow(w.numpy(), cmap="viridis", vmin=0, vmax=max(float(w.max()), 1e-6), aspect="auto")
    ax.set_xticks(range(S), _labels(key_tokens if key_tokens is not None else tokens, S, "key"), rotation=90,
                  fontsize=8)
    ax.set_yticks(range(T), _labels(tokens, T, "query"), fontsize=8)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    return fig


@styled
def rollout_grid(tokens: Sequence[str], rollout: Tensor, flow: Tensor | None = None, *,
                 layers: Sequence[int] | None = None, title: str = "") -> Figure:
    """Attention rollout (and flow) of one text, (L, T, T) each, at a few layers (default: the
    first, the middle and the last): rows are positions, columns the input tokens they draw on
    (:mod:`multihead.analysis.rollout`; residual convention Â = ½·I + ½·mean_h A)."""
    rolled = _matrix(rollout, 3, "rollout")
    L, T, _ = rolled.shape
    shown = list(layers) if layers is not None else sorted({0, L // 2, L - 1})
    if any(not 0 <= layer < L for layer in shown):
        raise ValueError(f"layers must be in 0..{L - 1}; got {shown}")
    kinds = [("rollout", rolled)] + ([("flow", _matrix(flow, 3, "flow"))] if flow is not None else [])
    names = _labels(tokens, T, "input")
    fig, axes = new_figure(len(kinds), len(shown), figsize=(3.4 * len(shown), 3.4 * len(kinds)), dpi=100,
                           squeeze=False)
    for row, (kind, values) in enumerate(kinds):
        for col, layer in enumerate(shown):
            ax = axes[row][col]
            if bool(values[layer].isnan().all()):  # flow is solved only at the layers asked for
                ax.text(0.5, 0.5, f"{kind} not solved\nafter layer {layer}", ha="center", va="center", fontsize=9)
                ax.axis("off")
                continue
            m = values[layer].nan_to_num(0.0)  # (T, T)
            ax.imshow(m.numpy(), cmap="viridis", vmin=0, vmax=max(float(m.max()), 1e-6), aspect="auto")
            ax.set_title(f"{kind} after layer {layer}", fontsize=9)
            if T <= 32:  # token labels only while they stay legible
                ax.set_xticks(range(T), names, rotation=90, fontsize=6)
                ax.set_yticks(range(T), names, fontsize=6)
            else:
                ax.set_xticks([])
                ax.set_yticks([])
    fig.suptitle(title or "attention rollout" + (" and flow" if flow is not None else "") +
                 " (residual ½·I + ½·mean over heads)", fontsize=10)
    fig.tight_layout()
    return fig


@styled
def layer_grid(weights: Tensor, tokens: Sequence[str] | None = None, *, layer: int | None = None,
               labels: Sequence[str] | None = None, columns: int = 4) -> Figure:
    """A layer's heads (H, T, S) side by side, each titled with its label when given."""
    w = _matrix(weights, 3, "weights")
    H, T, S = w.shape
    cols = min(columns, H)
    rows = math.ceil(H / cols)
    fig, axes = new_figure(rows, cols, figsize=(3.2 * cols, 3.2 * rows), dpi=100, squeeze=False)
    names = _labels(tokens, T, "query") if tokens is not None else None
    show = T <= 24  # token labels only while they stay legible
    for h in range(rows * cols):
        ax = axes[h // cols][h % cols]
        if h >= H:
            ax.axis("off")
            continue
        ax.imshow(w[h].numpy(), cmap="viridis", vmin=0, vmax=max(float(w[h].max()), 1e-6), aspect="auto")
        title = f"head {h}" + (f": {labels[h]}" if labels is not None else "")
        ax.set_title(title, fontsize=9)
        if show and names is not None:
            ax.set_xticks(range(S), names[:S], rotation=90, fontsize=6)
            ax.set_yticks(range(T), names, fontsize=6)
        else:
            ax.set_xticks([])
            ax.set_yticks([])
    if layer is not None:
        fig.suptitle(f"layer {layer}")
    fig.tight_layout()
    return fig


@styled
def model_grid(maps: Tensor, report: Report | None = None, *, title: str = "") -> Figure:
    """The whole model as an L x H grid of thumbnails (maps (L, H, T, S) for one sentence), each
    titled with the head's pattern label from ``report``."""
    m = _matrix(maps, 4, "maps")
    L, H = m.shape[:2]
    if report is not None and (report.num_layers, report.num_heads) != (L, H):
        raise ValueError(f"the report is for {report.num_layers} x {report.num_heads} heads; the maps are {L} x {H}")
    fig, axes = new_figure(L, H, figsize=(1.3 * H, 1.35 * L), dpi=100, squeeze=False)
    for layer in range(L):
        for h in range(H):
            ax = axes[layer][h]
            ax.imshow(m[layer, h].numpy(), cmap="viridis", vmin=0, aspect="auto")
            ax.set_xticks([])
            ax.set_yticks([])
            label = report.head(layer, h).label if report is not None else f"L{layer}.H{h}"
            ax.set_title(label.replace("syntactic:", "syn:")[:12], fontsize=6, pad=2)
            if h == 0:
                ax.set_ylabel(f"L{layer}", fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout(pad=0.4)
    return fig


@styled
def similarity_matrix(matrix: Tensor, num_heads: int, *, title: str = "head x head similarity",
                      distance: bool = True) -> Figure:
    """An (N, N) head x head matrix (N = L·H, head n is layer n // H), with layer boundaries drawn."""
    m = _matrix(matrix, 2, "matrix")
    if m.shape[0] != m.shape[1] or m.shape[0] % num_heads:
        raise ValueError(f"expected an (L·H, L·H) matrix with H={num_heads}; got {tuple(m.shape)}")
    N = m.shape[0]
    fig, ax = new_figure(figsize=(7, 6), dpi=100)
    image = ax.imshow(m.numpy(), cmap="magma" if distance else "viridis", aspect="equal")
    for b in range(num_heads, N, num_heads):
        ax.axhline(b - 0.5, color="white", linewidth=0.5)
        ax.axvline(b - 0.5, color="white", linewidth=0.5)
    ticks = list(range(0, N, num_heads))
    ax.set_xticks(ticks, [f"L{t // num_heads}" for t in ticks], fontsize=7)
    ax.set_yticks(ticks, [f"L{t // num_heads}" for t in ticks], fontsize=7)
    ax.set_title(title)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="JS distance" if distance else "cosine")
    fig.tight_layout()
    return fig


@styled
def image_attention_grid(image, maps: Tensor, report: Report | None = None, *, title: str = "") -> Figure:
    """A vision model's heads over one image: for every (layer, head) of ``maps`` (L, H, T, T) —
    [CLS] (and any prefix token) then a g x g grid of patches — the [CLS] row's attention over the
    patches, upsampled and laid over the image in grey; titled with the head's label from ``report``."""
    import numpy as np

    m = _matrix(maps, 4, "maps")
    L, H, T, _ = m.shape
    g, prefix = grid_size(T)
    picture = np.asarray(image.convert("L"), dtype=np.float32) / 255.0
    fig, axes = new_figure(L, H, figsize=(1.6 * H, 1.7 * L + 0.4), dpi=100, squeeze=False)
    for layer in range(L):
        for h in range(H):
            ax = axes[layer][h]
            heat = m[layer, h, 0, prefix:].reshape(g, g).numpy()  # (g, g) where [CLS] looks
            ax.imshow(picture, cmap="gray", extent=(0, 1, 1, 0))
            ax.imshow(heat / max(float(heat.max()), 1e-12), cmap="inferno", alpha=0.55, extent=(0, 1, 1, 0),
                      interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            label = report.head(layer, h).label if report is not None else ""
            ax.set_title(f"L{layer}.H{h} {label}".strip(), fontsize=7, pad=2)
    fig.suptitle(title or "where [CLS] looks, per head", fontsize=9)
    fig.tight_layout(pad=0.4)
    return fig


def save(fig: Figure, path: str | Path) -> Path:
    """Write a figure as PNG or SVG (by suffix), atomically."""
    return save_figure(fig, path)
