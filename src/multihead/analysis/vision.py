"""Vision transformers (ViT, DeiT and the like) on images: every head's attention over the patch grid.

Images go through the model folder's own image processor; each image becomes ``P`` prefix tokens
([CLS], and DeiT's distillation token) followed by a ``g × g`` grid of patches, row by row. The
metrics are means over the patch query rows (the prefix tokens' own rows are not patches):

| key | definition for one patch row ``p_i`` |
|---|---|
| ``entropy`` / ``entropy_norm`` | ``-Σ_j p_ij log p_ij``; divided by ``log S`` (1 is uniform) |
| ``max_weight`` | ``max_j p_ij`` |
| ``cls`` | mass on the prefix tokens ([CLS] / distillation) |
| ``self`` | ``p_ii`` |
| ``grid_distance`` | ``Σ_j p_ij · ‖g(i) − g(j)‖`` over patches ``j``: mean Euclidean distance on the grid, in patches |
| ``local_3x3`` | mass on the 3 × 3 neighbourhood of the patch (itself included) |

Labels, first match: ``cls`` (cls ≥ 0.5), ``self`` (self ≥ 0.5), ``local`` (local_3x3 ≥ 0.5),
``broad`` (entropy_norm ≥ 0.8), else ``mixed``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..hf.capture import AttentionCapture
from ..hf.load import HFModel
from ..progress import bar
from .report import Report, head_records

__all__ = ["IMAGE_SUFFIXES", "PATCH_METRICS", "PatchStatistics", "analyze_images", "digit_images", "image_maps",
           "load_images", "patch_label"]

PATCH_METRICS = ("entropy", "entropy_norm", "max_weight", "cls", "self", "grid_distance", "local_3x3")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


class PatchStatistics:
    """Running sums of the patch metrics for an (L, H) grid of heads."""

    def __init__(self, num_layers: int, num_heads: int) -> None:
        self.shape = (num_layers, num_heads)
        self.sums = torch.zeros(len(PATCH_METRICS), num_layers, num_heads, dtype=torch.float64)
        self.rows = 0

    def update(self, layer: int, weights: Tensor) -> None:
        """weights (B, H, T, T) over P prefix tokens and a g x g grid of patches (T = P + g²)."""
        B, _, T, _ = weights.shape
        g, prefix = _grid_size(T)
        p = weights.detach().float()  # (B, H, T, T)
        rows = p[:, :, prefix:, :]  # (B, H, g², T) the patches' rows
        r = torch.arange(g * g, device=p.device) // g
        c = torch.arange(g * g, device=p.device) % g
        dist = ((r[:, None] - r[None, :]).float() ** 2 + (c[:, None] - c[None, :]).float() ** 2).sqrt()  # (g², g²)
        near = ((r[:, None] - r[None, :]).abs() <= 1) & ((c[:, None] - c[None, :]).abs() <= 1)  # (g², g²)
        patches = rows[..., prefix:]  # (B, H, g², g²)
        entropy = -rows.clamp_min(1e-30).log().mul(rows).sum(-1)  # (B, H, g²)
        values = {
            "entropy": entropy,
            "entropy_norm": entropy / math.log(T),
            "max_weight": rows.amax(-1),
            "cls": rows[..., :prefix].sum(-1),
            "self": patches.diagonal(dim1=-2, dim2=-1),
            "grid_distance": (patches * dist).sum(-1),
            "local_3x3": (patches * near).sum(-1),
        }
        for name, value in values.items():
            self.sums[PATCH_METRICS.index(name), layer] += value.to(torch.float64).sum(dim=(0, 2)).cpu()
        if layer == 0:
            self.rows += B * g * g

    def means(self) -> dict[str, Tensor]:
        out = self.sums / self.rows if self.rows else torch.full_like(self.sums, math.nan)
        return {name: out[k] for k, name in enumerate(PATCH_METRICS)}


def _grid_size(T: int) -> tuple[int, int]:
    """(g, P): the largest square grid of patches that leaves 1-2 prefix tokens."""
    for prefix in (1, 2, 0):
        g = math.isqrt(T - prefix)
        if g * g == T - prefix:
            return g, prefix
    raise ValueError(f"{T} tokens are not a square grid of patches after [CLS] (and a distillation token)")


def patch_label(metrics: dict[str, float]) -> str:
    """The label of a vision head (rules in the module docstring)."""
    for label, key, threshold in (("cls", "cls", 0.5), ("self", "self", 0.5), ("local", "local_3x3", 0.5),
                                  ("broad", "entropy_norm", 0.8)):
        value = metrics.get(key, math.nan)
        if not math.isnan(value) and value >= threshold:
            return label
    return "mixed"


def load_images(folder: str | Path) -> list[Any]:
    """The images of ``folder`` (PNG, JPEG, ...), sorted by name, as RGB PIL images."""
    from PIL import Image, UnidentifiedImageError

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder of images")
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        raise ValueError(f"{folder} holds no image ({', '.join(IMAGE_SUFFIXES)})")
    images = []
    for path in paths:
        try:
            with Image.open(path) as image:
                images.append(image.convert("RGB"))
        except (UnidentifiedImageError, OSError) as err:
            raise ValueError(f"{path} is not a readable image: {err}") from err
    return images


def digit_images(n: int = 300, size: int = 32) -> list[Any]:
    """The first ``n`` of scikit-learn's 1,797 handwritten digits (8 x 8, shipped offline), as RGB
    images upscaled to ``size`` pixels (the model's processor then resizes them as it does any image)."""
    from PIL import Image
    from sklearn.datasets import load_digits

    if n < 1:
        raise ValueError(f"n must be a positive integer; got {n}")
    pixels = load_digits().images[:n]  # (n, 8, 8) values 0..16
    return [Image.fromarray((255 - p * 255 / 16).astype("uint8")).convert("RGB").resize((size, size), Image.NEAREST)
            for p in pixels]


def image_maps(model: HFModel, image: Any) -> Tensor:
    """Every head's attention over one image: (L, H, T, T) float32, captured layer by layer."""
    maps: dict[int, Tensor] = {}

    def keep(layer: int, weights: Tensor, out: Tensor, visible: Tensor) -> None:
        maps[layer] = weights[0].detach().float().cpu()  # (H, T, T)

    dtype = next(model.model.parameters()).dtype
    pixels = model.processor(images=[image], return_tensors="pt")["pixel_values"].to(dtype)
    with AttentionCapture(model.model, keep, stack="vision"), torch.inference_mode():
        model.body(pixel_values=pixels)
    return torch.stack([maps[k] for k in sorted(maps)])


def analyze_images(model: HFModel, images: Sequence[Any], *, batch_size: int = 32,
                   progress: bool | None = None) -> Report:
    """Metrics and a label for every head of a vision ``model`` over ``images`` (PIL images or arrays)."""
    if model.processor is None:
        raise TypeError(f"{model.name} has no image processor: analyze_images needs a vision model")
    images = list(images)
    if not images:
        raise ValueError("no image to analyze")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer; got {batch_size!r}")
    stats = PatchStatistics(model.num_layers, model.num_heads)

    def on_layer(layer: int, weights: Tensor, out: Tensor, visible: Tensor) -> None:
        stats.update(layer, weights)

    batches = [images[s:s + batch_size] for s in range(0, len(images), batch_size)]
    dtype = next(model.model.parameters()).dtype
    with AttentionCapture(model.model, on_layer, stack="vision"), torch.inference_mode():
        for batch in bar(batches, desc="analyze", unit="batch", progress=progress):
            pixels = model.processor(images=batch, return_tensors="pt")["pixel_values"].to(dtype)
            model.body(pixel_values=pixels)
    tokens = stats.rows
    heads = head_records(stats.means(), patch_label)
    return Report(model.name, False, model.num_layers, model.num_heads, len(images), tokens, heads, None,
                  {"images": {"count": len(images), "patch_rows": tokens}}, "vision")
