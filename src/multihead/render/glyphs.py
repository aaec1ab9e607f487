"""Glyphs that need no system font: the page embeds the subset of the bundled Noto Sans CJK that
its tokens use, as a ``data:`` font its own Content-Security-Policy allows (``font-src data:``).

Only characters outside ASCII that the font has are kept (Latin text keeps the system's look); a
page of a few Chinese sentences carries a few kilobytes of glyphs. Without the font package
(``cvttf-notosanscjk-regular``, installed by ``make``) the page falls back to system fonts.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import io
from collections.abc import Iterable
from pathlib import Path

__all__ = ["FONT_FAMILY", "embedded_font_css", "noto_cjk_path"]

#: The family name the page's CSS and canvases list after their system fonts.
FONT_FAMILY = "mh-glyphs"


@functools.cache
def noto_cjk_path() -> Path | None:
    """The bundled Noto Sans CJK font file, or None when its package is not installed."""
    spec = importlib.util.find_spec("cvttf_NotoSansCJK_Regular")
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(iter(sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.otf"))), None)


@functools.cache
def _font():
    from fontTools.ttLib import TTFont

    path = noto_cjk_path()
    return None if path is None else TTFont(path, lazy=True)


def embedded_font_css(texts: Iterable[str]) -> str:
    """An ``@font-face`` rule with the glyphs of every non-ASCII character of ``texts`` the font has
    (empty when there are none or the font is not installed)."""
    font = _font()
    if font is None:
        return ""
    cmap = font.getBestCmap()
    chars = sorted({c for text in texts for c in text if ord(c) > 127 and ord(c) in cmap})
    if not chars:
        return ""
    data = _subset("".join(chars))
    return (f"@font-face {{ font-family: '{FONT_FAMILY}'; "
            f"src: url(data:font/otf;base64,{base64.b64encode(data).decode()}) format('opentype'); }}")


@functools.lru_cache(maxsize=32)
def _subset(chars: str) -> bytes:
    from fontTools import subset
    from fontTools.ttLib import TTFont

    font = TTFont(noto_cjk_path())
    options = subset.Options()
    options.layout_features = []  # glyphs only: the page draws tokens, not shaped paragraphs
    options.name_IDs = [1, 2]
    options.notdef_outline = True
    subsetter = subset.Subsetter(options)
    subsetter.populate(text=chars)
    subsetter.subset(font)
    out = io.BytesIO()
    font.save(out)
    return out.getvalue()
