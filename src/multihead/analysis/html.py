"""A report as one self-contained HTML page: the label map, the head table, the probes.

Static on purpose: no script, no style sheet or font from anywhere else, every string escaped
(a token or a model name is text, never markup). The interactive views build on
:func:`report_body`.
"""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .report import Report

__all__ = ["report_body", "report_page"]

#: background colour of each label in the map (syntactic labels share one)
LABEL_COLOURS = {
    "induction": "#f4a582", "coreference": "#b2abd2", "self": "#fddbc7", "previous": "#92c5de",
    "next": "#d1e5f0", "special-token": "#e0e0e0", "broad": "#fff7bc", "local": "#c7e9c0",
    "mixed": "#ffffff", "syntactic": "#a6dba0",
}

_STYLE = """
.mh-report { font: 13px/1.4 system-ui, sans-serif; color: #222; }
.mh-report table { border-collapse: collapse; margin: 0.5em 0 1.2em; }
.mh-report th, .mh-report td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
.mh-report th { background: #f3f3f3; }
.mh-report td.label { text-align: center; min-width: 4.5em; }
.mh-report .flag { color: #b2182b; font-weight: 600; }
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float | None, digits: int = 3) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _colour(label: str) -> str:
    return LABEL_COLOURS.get(label.split(":")[0], "#ffffff")


def report_body(report: Report) -> str:
    """The report as an HTML fragment (a ``<div class="mh-report">``), safe to embed anywhere."""
    stack = f" — {_e(report.stack)} stack" if report.stacks else ""
    parts = [f'<div class="mh-report"><style>{_STYLE}</style>',
             f"<h2>{_e(report.model)}{stack}: {report.num_layers} layers × {report.num_heads} heads"
             f"{' (causal)' if report.causal else ''}</h2>",
             f"<p>{report.sentences} sentences, {report.tokens} tokens.</p>",
             "<h3>Head map</h3><table><tr><th>layer</th>"]
    parts += [f"<th>h{h}</th>" for h in range(report.num_heads)]
    parts.append("</tr>")
    marks = report.marks()
    for layer in range(report.num_layers):
        parts.append(f"<tr><th>{layer}</th>")
        for h in range(report.num_heads):
            r = report.head(layer, h)
            flags = f' <span class="flag">{_e(", ".join(r.flags))}</span>' if r.flags else ""
            sign = {"confirmed": " ✓", "attention-only": " ~"}.get(marks.get((layer, h), ""), "")
            parts.append(f'<td class="label" style="background:{_colour(r.label)}" '
                         f'title="L{layer}.H{h}">{_e(r.label)}{sign}{flags}</td>')
        parts.append("</tr>")
    parts.append("</table>")
    evidence = report.sections.get("evidence")
    if evidence:
        parts.append("<p>✓ confirmed, ~ attention-only: the label's behaviour tested with the head removed — "
                     + "; ".join(f"{_e(k)}: {_e(v)}" for k, v in evidence["tests"].items()) + ".</p>")
    names = list(report.heads[0].metrics) if report.heads else []
    parts.append("<h3>Every head</h3><table><tr><th>layer</th><th>head</th><th>label</th><th>flags</th>")
    parts += [f"<th>{_e(n)}</th>" for n in names]
    parts.append("</tr>")
    for r in report.heads:
        cells = "".join(f"<td>{_num(r.metrics[n])}</td>" for n in names)
        parts.append(f"<tr><td>{r.layer}</td><td>{r.head}</td><td>{_e(r.label)}</td>"
                     f"<td>{_e(', '.join(r.flags))}</td>{cells}</tr>")
    parts.append("</table>")
    red = report.redundancy or {}
    if red.get("pairs_js"):
        parts.append("<h3>Most redundant pairs (Jensen–Shannon distance of attention)</h3><table>"
                     "<tr><th>head</th><th>head</th><th>JS distance</th></tr>")
        for a, b, value in red["pairs_js"]:
            parts.append(f"<tr><td>L{a[0]}.H{a[1]}</td><td>L{b[0]}.H{b[1]}</td><td>{_num(value)}</td></tr>")
        parts.append("</table>")
    syntax = report.sections.get("syntax")
    if syntax:
        parts.append("<h3>Syntax: best head per relation against the best fixed offset</h3><table><tr>"
                     "<th>relation</th><th>count</th><th>best head</th><th>accuracy</th><th>baseline</th>"
                     "<th>offset</th></tr>")
        for rel, d in sorted(syntax["relations"].items(), key=lambda kv: -kv[1]["count"]):
            b = d["best"]
            parts.append(f"<tr><td>{_e(rel)}</td><td>{d['count']}</td><td>L{b['layer']}.H{b['head']}</td>"
                         f"<td>{_num(b['accuracy'])}</td><td>{_num(d['baseline'])}</td>"
                         f"<td>{int(d['baseline_offset']):+d}</td></tr>")
        parts.append("</table>")
    coref = report.sections.get("coreference")
    if coref:
        parts.append(f"<p>Coreference: {coref['examples']} pronoun examples; nearest-mention baseline "
                     f"{_num(coref['baseline_nearest'])}.</p>")
    parts.append("</div>")
    parts += [report_body(sub) for sub in report.stacks.values()]  # an encoder-decoder's other stacks
    return "".join(parts)


def static_document(title: str, body: str, *, style: str = "") -> str:
    """A whole HTML document around ``body`` (already escaped): inline styles and ``data:`` images
    only — its Content-Security-Policy forbids scripts and any network load."""
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            f"img-src data:\"><title>{_e(title)}</title>" + (f"<style>{style}</style>" if style else "") +
            f"</head><body>{body}</body></html>\n")


def report_page(report: Report, figures: list[tuple[str, bytes]] = ()) -> str:
    """A whole HTML document that loads nothing from the network; ``figures``: (caption, PNG bytes)
    shown after the tables, embedded as ``data:`` images (the page's own CSP allows only those)."""
    import base64

    shown = "".join(f'<figure><img alt="{_e(caption)}" src="data:image/png;base64,'
                    f'{base64.b64encode(png).decode()}"><figcaption>{_e(caption)}</figcaption></figure>'
                    for caption, png in figures)
    return static_document(f"multihead report: {report.model}", report_body(report) + shown)
