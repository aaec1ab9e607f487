"""Vision transformers (ViT, DeiT and the like) on images: every head's attention over the patch grid.

Images go through the model folder's own image processor; each image becomes ``P`` prefix tokens
([CLS], and DeiT's distillation token) followed by a ``g × g`` grid of patches, row by row. The
metrics are means over the patch query rows (the prefix tokens' own rows are not patches):

Metrics: :mod:`multihead.analysis.stats.patches` (entropy, [CLS] mass, grid distance, 3 × 3 locality).
Labels: :data:`multihead.analysis.labels.PATCH_RULES`. The report keeps the first image's maps
(``report.views``) for its page.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ...data import DIGITS
from ...hf.model import HFModel
from ...inputs import Batch, TokenInfo
from .. import sections as S
from ..labels import patch_label
from ..report import Report, head_records
from ..stats.maps import TextView, WholeMaps
from ..stats.patches import PatchStatistics
from .common import run_pass

__all__ = ["IMAGE_SUFFIXES", "analyze_images", "digit_images", "image_maps", "load_images"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


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

    if not 1 <= n <= DIGITS:
        raise ValueError(f"n must be 1 to {DIGITS:,} (the digits scikit-learn ships); got {n}")
    pixels = load_digits().images[:n]  # (n, 8, 8) values 0..16
    return [Image.fromarray((255 - p * 255 / 16).astype("uint8")).convert("RGB").resize((size, size), Image.NEAREST)
            for p in pixels]


def _batches(model: HFModel, images: list[Any], batch_size: int):
    dtype = next(model.model.parameters()).dtype
    for s in range(0, len(images), batch_size):
        pixels = model.processor(images=images[s:s + batch_size], return_tensors="pt")["pixel_values"].to(dtype)
        B = pixels.shape[0]
        none = torch.zeros(B, 0, dtype=torch.bool)  # patches are no tokens: the patch reducers read the grid
        yield Batch(TokenInfo(none, none, none, none), list(range(s, s + B)), {"pixel_values": pixels})


def image_maps(model: HFModel, image: Any) -> Tensor:
    """Every head's attention over one image: (L, H, T, T) float32, captured layer by layer."""
    maps = WholeMaps(model.num_layers, model.num_heads, [0])
    run_pass(model, _batches(model, [image], 1), [maps], at="vision", progress=False, desc="maps")
    return maps.result()[0]


def analyze_images(model: HFModel, images: Sequence[Any], *, batch_size: int = 32,
                   progress: bool | None = None) -> Report:
    """Metrics and a label for every head of a vision ``model`` over ``images`` (PIL images or
    arrays), in one pass that also keeps the first image's maps for the page."""
    if model.processor is None:
        raise TypeError(f"{model.name} has no image processor: analyze_images needs a vision model")
    images = [images] if isinstance(images, str) else list(images)
    if not images:
        raise ValueError("no image to analyze")
    texts = [i for i, item in enumerate(images) if isinstance(item, str | bytes)]
    if texts:  # transformers would take a string for a URL or base64 and say so, deep inside its processor
        raise TypeError(f"{model.name} is a vision model: give it images (PIL images or arrays), not texts "
                        f"(item {texts[0] + 1} is text)")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer; got {batch_size!r}")
    stats = PatchStatistics(model.num_layers, model.num_heads)
    first = WholeMaps(model.num_layers, model.num_heads, [0])
    run_pass(model, _batches(model, images, batch_size), [stats, first], at="vision", progress=progress,
             total=-(-len(images) // batch_size))
    tokens = stats.rows
    view = TextView("image 1", [], maps=first.result()[0], extra={"image": images[0]})
    return Report(model=model.name, causal=False, num_layers=model.num_layers, num_heads=model.num_heads,
                  sentences=len(images), tokens=tokens, heads=head_records(stats.result(), patch_label),
                  sections=S.Sections(images=S.Images(len(images), tokens)), stack="vision", views=[view])
