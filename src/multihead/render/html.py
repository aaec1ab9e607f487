"""A report as one self-contained HTML page: the label map, the head table, the probes (a renderer).

Static on purpose: no script, no style sheet or font from anywhere else, every string escaped
(a token or a model name is text, never markup). The interactive views build on
:func:`report_body`.
"""

from __future__ import annotations

import base64
import html
import math

from ..analysis.labels import MARKS, colour_of
from ..analysis.report import Report
from ..progress import counted

__all__ = ["escape", "report_body", "report_page", "static_document"]

_STYLE = """
.mh-report { font: 13px/1.4 system-ui, sans-serif; color: #222; }
.mh-report table { border-collapse: collapse; margin: 0.5em 0 1.2em; }
.mh-report th, .mh-report td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
.mh-report th { background: #f3f3f3; }
.mh-report td.label { text-align: center; min-width: 4.5em; }
.mh-report .flag { color: #b2182b; font-weight: 600; }
"""


def escape(value: object) -> str:
    """``value`` as HTML text (``<``, ``>``, ``&`` and quotes escaped): never markup."""
    return html.escape(str(value), quote=True)


def _num(value: float | None, digits: int = 3) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def report_body(report: Report, *, one_of_stacks: bool = False) -> str:
    """The report as an HTML fragment (a ``<div class="mh-report">``), safe to embed anywhere;
    ``one_of_stacks``: it is an encoder-decoder's decoder or cross stack (its title names it)."""
    stack = f" — {escape(report.stack)} stack" if report.stacks or one_of_stacks else ""
    images = report.sections.images is not None
    parts = [f'<div class="mh-report"><style>{_STYLE}</style>',
             f"<h2>{escape(report.model)}{stack}: {report.num_layers} layers × {report.num_heads} heads"
             f"{' (causal)' if report.causal else ''}</h2>",
             f"<p>{counted(report.sentences, 'image' if images else 'text')}, "
             f"{counted(report.tokens, 'patch' if images else 'token')}"
             f"{'; ' + escape(report.placement) if report.placement else ''}.</p>",
             "<h3>Head map</h3><table><tr><th>layer</th>"]
    parts += [f"<th>h{h}</th>" for h in range(report.num_heads)]
    parts.append("</tr>")
    marks = report.marks()
    for layer in range(report.num_layers):
        parts.append(f"<tr><th>{layer}</th>")
        for h in range(report.num_heads):
            r = report.head(layer, h)
            flags = f' <span class="flag">degenerate: {escape(", ".join(r.flags))}</span>' if r.degenerate else ""
            mark = marks.get((layer, h))
            sign = f" {MARKS[mark]}" if mark else ""
            parts.append(f'<td class="label" style="background:{colour_of(r.label)}" '
                         f'title="L{layer}.H{h}: {escape(r.describe())}">{escape(r.label)}{sign}{flags}</td>')
        parts.append("</tr>")
    parts.append("</table>")
    evidence = report.sections.evidence
    if evidence:
        parts.append(f"<p>{MARKS['confirmed']} confirmed, {MARKS['attention-only']} attention-only: the label's "
                     "behaviour tested with the head removed — "
                     + "; ".join(f"{escape(k)}: {escape(v)}" for k, v in evidence.tests.items()) + ".</p>")
    names = list(report.heads[0].metrics) if report.heads else []
    parts.append("<h3>Every head</h3><table><tr><th>layer</th><th>head</th><th>label (its defining value)</th>"
                 "<th>stability</th><th>flags</th>")
    parts += [f"<th>{escape(n)}</th>" for n in names]
    parts.append("</tr>")
    for r in report.heads:
        cells = "".join(f"<td>{_num(r.metrics[n])}</td>" for n in names)
        stability = "–" if r.stability is None else f"{r.stability:.0%}"
        flagged = ", ".join(r.flags) + (" (degenerate)" if r.degenerate else "")
        parts.append(f"<tr><td>{r.layer}</td><td>{r.head}</td><td>{escape(r.describe())}</td><td>{stability}</td>"
                     f"<td>{escape(flagged)}</td>{cells}</tr>")
    parts.append("</table>")
    red = report.redundancy
    if red is not None and red.pairs_js:
        over = f", over {counted(red.rows_js, 'query token')}" if red.rows_js else ""
        parts.append(f"<h3>Most redundant pairs (Jensen–Shannon distance of attention{over})</h3><table>"
                     "<tr><th>head</th><th>head</th><th>JS distance</th></tr>")
        for a, b, value in red.pairs_js:
            parts.append(f"<tr><td>L{a[0]}.H{a[1]}</td><td>L{b[0]}.H{b[1]}</td><td>{_num(value)}</td></tr>")
        parts.append("</table>")
    syntax = report.sections.syntax
    if syntax:
        parts.append("<h3>Syntax: best head per relation against the best fixed offset</h3><table><tr>"
                     "<th>relation</th><th>count</th><th>best head</th><th>accuracy</th><th>baseline</th>"
                     "<th>offset</th><th>margin needed (95%)</th><th>beats it</th></tr>")
        for rel, d in sorted(syntax.relations.items(), key=lambda kv: -kv[1].count):
            b = d.best
            parts.append(f"<tr><td>{escape(rel)}</td><td>{d.count}</td><td>L{b['layer']}.H{b['head']}</td>"
                         f"<td>{_num(b['accuracy'])}</td><td>{_num(d.baseline)}</td>"
                         f"<td>{int(d.baseline_offset):+d}</td><td>{_num(d.margin_needed())}</td>"
                         f"<td>{'yes' if d.beats() else 'no'}</td></tr>")
        parts.append("</table>")
    ablation = report.sections.ablation
    if ablation is not None and not ablation.skipped:
        how = " (attribution estimates; exact for the tested heads)" if ablation.method == "attribution" else ""
        parts.append(f"<p>Ablation: {escape(ablation.objective)} over {counted(ablation.texts, 'text')}, effects in "
                     f"{escape(ablation.unit or 'the objective')}{escape(how)}.</p>")
    evidence = report.sections.evidence
    if evidence and evidence.heads:
        parts.append("<h3>Labels tested by ablation</h3><table><tr><th>head</th><th>label</th><th>measured</th>"
                     "<th>unit</th><th>random heads (mean ± sd)</th><th>confirmed above</th><th>mark</th></tr>")
        for e in evidence.heads:
            spread = "–" if e.baseline_mean is None else \
                f"{e.baseline_heads} heads: {_num(e.baseline_mean)} ± {_num(e.baseline_sd)}"
            parts.append(f"<tr><td>L{e.layer}.H{e.head}</td><td>{escape(e.label)}</td><td>{_num(e.value)}</td>"
                         f"<td>{escape(e.unit)}</td><td>{escape(spread)}</td><td>{_num(e.threshold)}</td>"
                         f"<td>{escape(e.mark)}</td></tr>")
        parts.append("</table>")
    coref = report.sections.coreference
    if coref:
        parts.append(f"<p>Coreference: {coref.examples} pronoun examples; nearest-mention baseline "
                     f"{_num(coref.baseline_nearest)}.</p>")
    parts.append("</div>")
    parts += [report_body(sub, one_of_stacks=True) for sub in report.stacks.values()]  # an encoder-decoder's others
    return "".join(parts)


def static_document(title: str, body: str, *, style: str = "") -> str:
    """A whole HTML document around ``body`` (already escaped): inline styles and ``data:`` images
    only — its Content-Security-Policy forbids scripts and any network load."""
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            f"img-src data:\"><title>{escape(title)}</title>" + (f"<style>{style}</style>" if style else "") +
            f"</head><body>{body}</body></html>\n")


def report_page(report: Report, figures: list[tuple[str, bytes]] = ()) -> str:
    """A whole HTML document that loads nothing from the network; ``figures``: (caption, PNG bytes)
    shown after the tables, embedded as ``data:`` images (the page's own CSP allows only those)."""
    shown = "".join(f'<figure><img alt="{escape(caption)}" src="data:image/png;base64,'
                    f'{base64.b64encode(png).decode()}"><figcaption>{escape(caption)}</figcaption></figure>'
                    for caption, png in figures)
    return static_document(f"multihead report: {report.model}", report_body(report) + shown)
