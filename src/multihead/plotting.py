"""Figures without touching the user's matplotlib session.

Library code never calls ``matplotlib.use`` or ``pyplot``: figures are plain
``matplotlib.figure.Figure`` objects (they save without any backend and display in Jupyter), and
the CJK font fallback is set only while a figure is built or saved (:func:`style`), so a
notebook's backend and rcParams stay as the user set them.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .files import atomic_path

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["cjk_font", "figure_png", "new_figure", "save_figure", "style", "styled"]

_CJK_FAMILIES = ("Noto Sans CJK SC", "Noto Sans CJK TC", "Noto Sans CJK JP", "Source Han Sans SC",
                 "WenQuanYi Zen Hei", "WenQuanYi Micro Hei", "Droid Sans Fallback", "AR PL UMing CN")
_FORMATS = (".png", ".svg")


@cache
def cjk_font() -> str | None:
    """The family name of a CJK-capable font made available to matplotlib, or None.

    Looked up among the installed system fonts and, failing that, taken from the
    ``cvttf-notosanscjk-regular`` package (Noto Sans CJK, installed by ``make``)."""
    from matplotlib import font_manager

    installed = {f.name for f in font_manager.fontManager.ttflist}
    for family in _CJK_FAMILIES:
        if family in installed:
            return family
    spec = importlib.util.find_spec("cvttf_NotoSansCJK_Regular")
    if spec is not None and spec.submodule_search_locations:
        for path in Path(next(iter(spec.submodule_search_locations))).glob("*.otf"):
            font_manager.fontManager.addfont(str(path))
            return font_manager.FontProperties(fname=str(path)).get_name()
    return None


@contextmanager
def style() -> Iterator[None]:
    """Inside: the default font with a CJK fallback behind it (matplotlib's per-glyph chain)."""
    import matplotlib

    family = cjk_font()
    settings = {"font.family": ["DejaVu Sans", family]} if family is not None else {}
    with matplotlib.rc_context(settings):
        yield


def styled(draw: Callable[..., Any]) -> Callable[..., Any]:
    """``draw`` run inside :func:`style` (its text gets the CJK fallback)."""

    @functools.wraps(draw)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with style():
            return draw(*args, **kwargs)

    return wrapper


def new_figure(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float], dpi: int = 100,
               squeeze: bool = True, **subplots: Any) -> tuple[Figure, Any]:
    """A figure and its axes (as ``plt.subplots`` returns them), made without pyplot."""
    from matplotlib.figure import Figure

    with style():
        fig = Figure(figsize=figsize, dpi=dpi)
        axes = fig.subplots(nrows, ncols, squeeze=squeeze, **subplots)
    return fig, axes


def save_figure(fig: Figure, path: str | Path, **savefig: Any) -> Path:
    """Write ``fig`` as PNG or SVG (by the suffix), atomically."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in _FORMATS:
        raise ValueError(f"figures are saved as .png or .svg; got {path.name!r}")
    with style(), atomic_path(path) as tmp:
        fig.savefig(tmp, format=suffix[1:], **savefig)
    return path


def figure_png(fig: Figure, **savefig: Any) -> bytes:
    """``fig`` as PNG bytes (to embed in a page)."""
    import io

    buffer = io.BytesIO()
    with style():
        fig.savefig(buffer, format="png", **savefig)
    return buffer.getvalue()
