"""The page of one activation-patching run: the layer x head map of restored shares (and of
direct logit attribution for decoders), self-contained and escaped like every page we write."""

from __future__ import annotations

import math

from torch import Tensor

from ..analysis.interventions.patching import Patching
from .html import escape, static_document

__all__ = ["patching_page"]

_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
table.map { border-collapse: collapse; font: 11px ui-monospace, monospace; }
table.map td, table.map th { border: 1px solid #ddd; padding: 2px 4px; text-align: right; }
table.map th { background: #f3f3f3; }
.tokens span { border: 1px solid #ccc; border-radius: 3px; padding: 0 3px; margin: 0 1px; white-space: pre; }
.tokens span.diff { background: #fde0c5; }
.legend { font-size: 12px; color: #555; }
"""


def _cell_colour(value: float, limit: float) -> tuple[int, int, int]:
    """Diverging: red where patching restores the clean answer, blue where it pushes the wrong way."""
    if math.isnan(value) or limit <= 0:
        return 255, 255, 255
    t = max(-1.0, min(1.0, value / limit))
    fade = int(255 * (1 - abs(t)))
    return (255, fade, fade) if t >= 0 else (fade, fade, 255)


def _cell_style(value: float, limit: float) -> str:
    """The cell's background and whichever of black or white text reads better on it (WCAG
    contrast: black on full blue is 2.4 : 1, white 8.6 : 1)."""
    rgb = _cell_colour(value, limit)
    linear = [c / 255 / 12.92 if c <= 10 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
    luminance = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
    on_black, on_white = (luminance + 0.05) / 0.05, 1.05 / (luminance + 0.05)
    text = "#000" if on_black >= on_white else "#fff"
    return f"background:rgb{rgb};color:{text}".replace(" ", "")


#: What a map's colours mean: a share's sign is toward the clean run's difference (which may prefer the wrong
#: answer more than the corrupt run's does), a change's and an attribution's toward the answer.
SHARE_COLOURS = "red: toward the clean run's logit difference (restored); blue: away from it"
ANSWER_COLOURS = "red: toward the answer; blue: toward the wrong one"


def _map(values: Tensor, caption: str, noise: Tensor | None = None, rounding: str = "",
         colours: str = ANSWER_COLOURS) -> str:
    """A layer x head table of ``values``, coloured; the cells ``noise`` marks (within the rounding of the
    model's logits, ``rounding`` saying how much) drawn as "·" on white where a number would show, their
    values in their titles."""
    L, H = values.shape
    # where a number within the rounding would show (a half dtype's), every such cell is "·", +0.000 as well;
    # else none is (float32's resolution hides nothing a cell shows: +0.000 is itself)
    if noise is None or not bool((noise & (values.abs() >= 0.0005)).any()):
        noise = values.new_zeros(values.shape, dtype=bool)
    shown = values.masked_fill(noise, 0)
    limit = float(shown.abs().max()) if values.numel() else 0.0
    head = "".join(f"<th>H{h}</th>" for h in range(H))
    rows = []
    for layer in range(L):
        cells = "".join(f'<td style="{_cell_style(0.0 if quiet else float(v), limit)}" title="L{layer}.H{h}: '
                        f'{float(v):+.4f}{" (within rounding)" if quiet else ""}">'
                        f'{"·" if quiet else f"{float(v):+.3f}"}</td>'
                        for h, (v, quiet) in enumerate(zip(values[layer], noise[layer], strict=True)))
        rows.append(f"<tr><th>L{layer}</th>{cells}</tr>")
    quiet = f"; ·: {escape(rounding)}" if bool(noise.any()) and rounding else ""
    return (f"<figure><figcaption>{escape(caption)}</figcaption><table class=\"map\"><tr><th></th>{head}</tr>"
            f"{''.join(rows)}</table><p class=\"legend\">{escape(colours)}; "
            f"full colour = ±{limit:.3g}{quiet}</p></figure>")


def _tokens(tokens: list[str], other: list[str]) -> str:
    return "".join(f'<span class="{"diff" if t != o else ""}">{escape(t)}</span>' for t, o in zip(tokens, other,
                                                                                            strict=True))


def patching_page(result: Patching, model: str) -> str:
    """A whole HTML document for ``result`` (nothing loaded from the network, every token escaped)."""
    gap = result.gap
    parts = [f"<h1>Activation patching: {escape(model)}</h1>",
             f'<p>Clean <span class="tokens">{_tokens(result.tokens, result.corrupt_tokens)}</span></p>',
             f'<p>Corrupt <span class="tokens">{_tokens(result.corrupt_tokens, result.tokens)}</span></p>',
             f"<p>Answer {escape(repr(result.answer))} vs wrong {escape(repr(result.wrong))}, read at token "
             f"{result.position}. Logit difference: clean {result.clean_diff:+.4f}, corrupt "
             f"{result.corrupt_diff:+.4f} (gap {gap:+.4f}); method: {escape(result.method)}.</p>"]
    why = result.no_share()
    noise, rounding = result.within_rounding(), result.rounding_words()
    if why is None:
        parts.append(_map(result.restored, f"Share of the gap restored {result.how()} (its output before W^O, "
                                           "every position)", noise, rounding, SHARE_COLOURS))
        words = result.top_words(5)
        parts.append(f"<p>{escape(words[:1].upper() + words[1:])}</p>")
        if result.small_gap() is not None:
            parts.append(f"<p><strong>Note:</strong> {escape(result.small_gap())}</p>")
    else:
        parts.append(f"<p>No shares: {escape(why)}</p>")
        parts.append(_map(result.change, f"Change of the logit difference {result.how()}", noise, rounding))
    if result.direct is not None:
        parts.append(_map(result.direct, "Direct logit attribution in the clean run (logits; the final norm's scale "
                                         "frozen): each head's output projected on W_U[answer] − W_U[wrong]"))
    return static_document(f"multihead patching: {model}", "".join(parts), style=_STYLE)
