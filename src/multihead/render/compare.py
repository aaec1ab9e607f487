"""The diff page of two reports (:mod:`multihead.analysis.compare`): self-contained, escaped."""

from __future__ import annotations

from ..analysis.compare import ALIVE_SHARE, DEAD_SHARE, Comparison, pair_name, same_parts
from .html import escape, static_document

__all__ = ["compare_page"]

_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; font-size: 12px; margin-bottom: 1em; }
td, th { border: 1px solid #ccc; padding: 2px 6px; }
th { background: #f3f3f3; }
table.grid td { text-align: center; min-width: 5.5em; }
.warning { background: #fff3cd; border: 1px solid #e0b400; padding: 6px 10px; }
.changed { background: #fdd9a8; } .died { background: #555; color: #fff; } .appeared { background: #b8e6b8; }
.unmatched { background: repeating-linear-gradient(45deg, #eee 0 4px, #fff 4px 8px); color: #777; }
.legend span { padding: 1px 6px; margin-right: 6px; border: 1px solid #ccc; }
"""


def _cell(cell: tuple[int, int]) -> str:
    return f"L{cell[0]}.H{cell[1]}"


def compare_page(comparison: Comparison) -> str:
    """A whole HTML document: the head grid of A with each head's label in A and B, what died and
    appeared, the label changes and the largest metric changes."""
    c = comparison
    died = {ca for ca, _ in c.died()}
    appeared = {ca for ca, _ in c.appeared()}
    partner = {ca: cb for ca, cb, _ in c.pairs}
    ran_a, ran_b = (f", {escape(p)}" if p else "" for p in c.placements())
    parts = [f"<h1>Compare: {escape(c.a_name)} → {escape(c.b_name)}</h1>",
             f"<p>A: {escape(c.a.model)} ({c.a.num_layers} × {c.a.num_heads}{ran_a}), B: {escape(c.b.model)} "
             f"({c.b.num_layers} × {c.b.num_heads}{ran_b}); heads matched by {escape(c.matching)}.</p>"]
    parts += [f'<p class="warning">Warning: {escape(w)}</p>' for w in c.warnings]
    parts.append('<p class="legend"><span>label kept</span><span class="changed">label changed</span>'
                 '<span class="died">died (zeroing it changes nothing in B)</span>'
                 '<span class="appeared">appeared</span>'
                 + ('<span class="unmatched">unmatched (no head of B)</span>' if c.unmatched_a else "")
                 + ' — each cell: A\'s label → B\'s (B\'s head when matched by profile)</p>')
    parts.append('<table class="grid"><tr><th></th>' + "".join(f"<th>H{h}</th>" for h in range(c.a.num_heads))
                 + "</tr>")
    for layer in range(c.a.num_layers):
        row = [f"<tr><th>L{layer}</th>"]
        for h in range(c.a.num_heads):
            ca = (layer, h)
            cb = partner.get(ca)
            if cb is None:
                row.append(f'<td class="unmatched" title="{_cell(ca)}: unmatched">{escape(c.a.head(*ca).label)}'
                           '<br>–</td>')
                continue
            la, lb = c.a.head(*ca).label, c.b.head(*cb).label
            kind = "died" if ca in died else "appeared" if ca in appeared else \
                "changed" if not same_parts(la, lb) else ""  # the same parts reordered: kept
            where = "" if ca == cb else f"<br>({_cell(cb)})"
            text = escape(la) if la == lb else f"{escape(la)} →<br>{escape(lb)}"
            row.append(f'<td class="{kind}" title="{_cell(ca)} → {_cell(cb)}">{text}{where}</td>')
        parts.append("".join(row) + "</tr>")
    parts.append("</table>")
    changes = c.label_changes()
    parts.append(f"<h2>Labels changed ({len(changes)} of {len(c.pairs)})</h2>")
    if changes:
        parts.append("<table><tr><th>A</th><th>B</th><th>label in A</th><th>label in B</th></tr>")
        parts += [f"<tr><td>{_cell(ca)}</td><td>{_cell(cb)}</td><td>{escape(la)}</td><td>{escape(lb)}</td></tr>"
                  for ca, cb, la, lb in changes]
        parts.append("</table>")
    else:
        parts.append("<p>None: every matched head keeps its label.</p>")
    parts.append("<h2>Heads that died or appeared</h2>")
    if not c.died() and not c.appeared():
        parts.append("<p>None" + ("" if "zero_ablation" in (c.a.heads[0].metrics if c.a.heads else {}) else
                                 " measured: both reports need ablation effects (analyze --ablation N)") + ".</p>")
    else:
        parts.append("<p>died: " + escape(", ".join(pair_name(ca, cb) for ca, cb in c.died()) or "none")
                     + "; appeared: " + escape(", ".join(pair_name(ca, cb) for ca, cb in c.appeared()) or "none")
                     + f" (died: zeroing it changed the objective by more than {ALIVE_SHARE:.0%} of A's largest "
                     f"effect, its interval clear of zero, and by at most {DEAD_SHARE:.0%} of B's; appeared: the "
                     "reverse)</p>")
    excluded = c.excluded()
    if excluded:
        parts.append("<h2>Not compared</h2><ul>" + "".join(f"<li>{escape(name)}: {escape(why)}</li>"
                                                          for name, why in excluded.items()) + "</ul>")
    flags = c.flag_changes()
    if flags:
        parts.append("<h2>Flags changed</h2><table><tr><th>A</th><th>B</th><th>gained</th><th>lost</th></tr>")
        parts += [f"<tr><td>{_cell(ca)}</td><td>{_cell(cb)}</td><td>{escape(', '.join(g))}</td>"
                  f"<td>{escape(', '.join(lo))}</td></tr>" for ca, cb, g, lo in flags]
        parts.append("</table>")
    parts.append("<h2>Largest metric changes</h2><p>B − A, sorted by size in units of the metric's spread over "
                 "A's heads.</p><table><tr><th>A</th><th>B</th><th>metric</th><th>A</th><th>B</th><th>change</th>"
                 "<th>spreads</th></tr>")
    for d in c.metric_deltas(100):
        parts.append(f"<tr><td>{_cell(d['a'])}</td><td>{_cell(d['b'])}</td><td>{escape(d['metric'])}</td>"
                     f"<td>{d['before']:.4g}</td><td>{d['after']:.4g}</td><td>{d['delta']:+.4g}</td>"
                     f"<td>{d['spread_units']:+.2f}</td></tr>")
    parts.append("</table>")
    if c.unmatched_a or c.unmatched_b:
        parts.append("<p>Unmatched heads: A " + escape(", ".join(map(_cell, c.unmatched_a)) or "none") + "; B "
                     + escape(", ".join(map(_cell, c.unmatched_b)) or "none") + "</p>")
    return static_document("multihead compare", "".join(parts), style=_STYLE)
