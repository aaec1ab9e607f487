"""The interactive attention page: one self-contained HTML file (or a notebook cell).

Views: model (L x H thumbnails titled with labels; a click opens the head), head (lines from each
token to what it attends to, heads toggled by colour), matrix (one head's heatmap, the value
under the pointer, PNG/SVG export), rollout (attention rollout and flow of the text through the
layers, :mod:`multihead.analysis.rollout`), the sortable head table with every metric of a
:class:`~multihead.Report`, and the head x head similarity with its clusters. Several sentences
in one page, chosen from a list.

Size: each attention row keeps its ``k`` largest weights (k = 32, or 16 for large models and
long inputs), quantised to a byte — the views draw nothing finer. All strings are data (JSON in
a non-executable script tag, ``<``, ``>`` and ``&`` escaped) and are put on the page with
``textContent``; the page loads nothing from the network (a Content-Security-Policy says so).
"""

from __future__ import annotations

import base64
import html
import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..files import write_atomically
from ..jsonable import json_number, json_value
from .pooled import LONG_TEXT, streamed_page_text

if TYPE_CHECKING:
    from ..analysis.report import Report
    from ..hf.load import HFModel

#: Rollout is stored for texts up to this many tokens (L·T² bytes each).
ROLLOUT_TOKENS = 64
#: Attention flow (after the last layer) is solved for a text when L·T⁴ stays within this: the cost
#: of its T² maximum flows on a graph of L·T² edges (about 3 s at the budget on one core).
FLOW_BUDGET = 2_000_000

__all__ = ["AttentionPage", "attention_page", "page_data", "page_html", "view_page", "write_page"]

_CSS = """
.mh-page { font: 13px/1.4 system-ui, sans-serif, 'mh-glyphs'; color: #222; }
.mh-page .mh-tabs button { margin-right: 4px; }
.mh-page select, .mh-page button, .mh-page option { font-family: inherit; }
.mh-page .mh-tab.active { font-weight: 700; }
.mh-page .mh-headbox { display: inline-block; min-width: 18px; text-align: center; color: #fff; margin: 1px;
  cursor: pointer; opacity: 0.3; border-radius: 3px; font-size: 11px; }
.mh-page .mh-headbox.on { opacity: 1; }
.mh-page table { border-collapse: collapse; }
.mh-page th, .mh-page td { border: 1px solid #ccc; padding: 1px 5px; text-align: right; }
.mh-page th { cursor: pointer; background: #f3f3f3; }
.mh-page canvas { border: 1px solid #eee; max-width: 100%; }
.mh-page .mh-view[data-view="head"] { max-height: 85vh; overflow-y: auto; }
.mh-page .mh-info { min-height: 1.4em; font-family: monospace; }
.mh-page table.mh-labelmap td { text-align: center; cursor: pointer; font-size: 11px; min-width: 4.2em; }
.mh-page table.mh-table tr.mh-row { cursor: pointer; }
.mh-page table.mh-table tr.mh-row:hover, .mh-page table.mh-labelmap td:hover { outline: 2px solid #fc0; }
.mh-page dl.mh-legend { display: grid; grid-template-columns: max-content auto; gap: 2px 10px; font-size: 12px; }
.mh-page dl.mh-legend dt { padding: 0 6px; border: 1px solid #ccc; }
.mh-page dl.mh-legend dd { margin: 0; }
.mh-page table.mh-probe td, .mh-page table.mh-probe th { font-size: 12px; }
.mh-page .mh-meta, .mh-page .mh-note { color: #555; }
.mh-page .mh-detail td:first-child { text-align: left; }
"""


def _sparse_rows(maps: Tensor, k: int) -> tuple[str, str, int]:
    """Top-k of every row of (L, H, T, T) as base64 uint16 indices and uint8 values."""
    T = maps.shape[-1]
    k = min(k, T)
    values, index = maps.float().topk(k, dim=-1)  # (L, H, T, k)
    q = (values.clamp(0, 1) * 255).round().to(torch.uint8)
    idx = index.to(torch.int32).numpy().astype("<u2")
    return base64.b64encode(idx.tobytes()).decode(), base64.b64encode(q.numpy().tobytes()).decode(), k


def _json_for_script(value: object) -> str:
    """JSON that cannot end the script element it sits in."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page_data(sentences: Sequence[tuple[str, Sequence[str], Tensor] | dict], report: Report | None = None,
              num_layers: int | None = None, num_heads: int | None = None, *, top_k: int | None = None) -> dict:
    """The page's data: sentences as (text, tokens, maps (L, H, T, T)) — or, for long texts, the
    streamed entries of :func:`multihead.viz.pooled.streamed_page_text` — and an optional report."""
    if not sentences:
        raise ValueError("a page needs at least one sentence")
    if isinstance(sentences[0], dict):
        if num_layers is None or num_heads is None:
            if report is None:
                raise ValueError("streamed page entries need num_layers and num_heads (or a report)")
            num_layers, num_heads = report.num_layers, report.num_heads
        L, H = num_layers, num_heads
    else:
        L, H = sentences[0][2].shape[:2]
    if report is not None and (report.num_layers, report.num_heads) != (L, H):
        raise ValueError(f"the report is for {report.num_layers} x {report.num_heads} heads; the maps are {L} x {H}")
    rows = []
    for sentence in sentences:
        if isinstance(sentence, dict):  # already streamed and packed
            rows.append(sentence)
            continue
        text, tokens, maps = sentence
        if maps.dim() != 4 or maps.shape[:2] != (L, H) or maps.shape[2] != maps.shape[3] != len(tokens):
            raise ValueError(f"maps must be (L, H, T, T) with T = {len(tokens)} tokens; got {tuple(maps.shape)}")
        T = len(tokens)
        k = top_k or (16 if L * H * T > 20_000 else 32)
        idx, val, k = _sparse_rows(maps, k)
        row = {"text": text, "tokens": list(tokens), "k": k, "index": idx, "values": val}
        row.update(_rollout_entry(maps))
        rows.append(row)
    data: dict = {"num_layers": L, "num_heads": H, "sentences": rows, "metric_names": [], "heads": [],
                  "long_text": LONG_TEXT}
    if report is not None:
        data["model"] = report.model
        data["labels"] = [r.label for r in report.heads]
        marks = report.marks()
        if marks:  # labels tested by ablation (multihead.analysis.evidence)
            data["evidence"] = [marks.get((r.layer, r.head)) for r in report.heads]
        data["metric_names"] = list(report.heads[0].metrics) if report.heads else []
        data["heads"] = [{"layer": r.layer, "head": r.head, "label": r.label, "flags": list(r.flags),
                          "metrics": {k: json_number(v, 4) for k, v in r.metrics.items()}}
                         for r in report.heads]
        red = report.redundancy or {}
        if red.get("js_distance") is not None:
            js = torch.as_tensor(red["js_distance"], dtype=torch.float64).nan_to_num(1.0).clamp(0, 1)
            data["similarity"] = (js * 255).round().to(torch.uint8).flatten().tolist()
            data["clusters"] = [list(map(list, g)) for g in red.get("clusters_js", [])]
            if red.get("groups_js"):
                groups = red["groups_js"]
                data["groups"] = {**groups, "groups": [list(map(list, g)) for g in groups["groups"]]}
            data["pairs"] = [[list(a), list(b), json_number(v, 4)] for a, b, v in red.get("pairs_js", [])]
        data["overview"] = _overview(report)
    return data


def _overview(report: Report) -> dict:
    """What the overview tab shows beside the label map: the run and the probes' summaries (the
    per-head matrices stay out: the table has every head's metrics)."""
    from datetime import UTC, datetime

    from .. import __version__

    out: dict = {"model": report.model, "causal": report.causal, "sentences": report.sentences,
                 "tokens": report.tokens, "written": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                 "version": __version__, "flags": [[r.layer, r.head, list(r.flags)] for r in report.heads if r.flags]}
    out.update(_legend())
    sections = report.sections
    if "syntax" in sections:
        out["syntax"] = {"min_count": sections["syntax"]["min_count"], "relations": {
            rel: {k: d[k] for k in ("count", "baseline", "baseline_offset", "best")}
            for rel, d in sections["syntax"]["relations"].items()}}
    for key in ("coreference", "induction", "ablation", "evidence", "long_context", "retrieval", "corpus", "typical"):
        if key in sections:
            out[key] = json_value(sections[key])
    return out


def _legend() -> dict:
    """Each label's and flag's rule in words, from the rules themselves (one source of truth), and
    the labels' colours."""
    from ..analysis.html import LABEL_COLOURS
    from ..analysis.patterns import COREFERENCE_RULE, FLAG_RULES, LABEL_RULES, SYNTAX_RULE

    words = {"induction": "attends to the token after an earlier copy of the current one (induction probe)",
             "self": "attends to its own position", "previous": "attends to the previous token",
             "next": "attends to the next token", "special-token": "attends to [CLS]/[SEP] (or BOS/EOS)",
             "broad": "spreads its attention widely (normalised entropy)", "local": "attends within ±2 tokens"}
    legend = {label: f"{words.get(label, label)}: {key} ≥ {threshold}" for label, key, threshold in LABEL_RULES}
    n, acc, margin = SYNTAX_RULE
    legend["syntactic:REL"] = (f"the dependent attends to its governor for relation REL (REL>: the governor to "
                               f"its dependents): seen ≥ {n} times, accuracy ≥ {acc} and ≥ the best fixed offset "
                               f"+ {margin}")
    legend["coreference"] = (f"a pronoun attends to its antecedent: accuracy ≥ {COREFERENCE_RULE[0]} and ≥ the "
                             f"nearest-mention baseline + {COREFERENCE_RULE[1]}")
    legend["mixed"] = "none of the rules above holds"
    flags = {flag: f"{key} ≥ {threshold}" for flag, key, threshold in FLAG_RULES}
    return {"legend": legend, "flag_legend": flags, "colours": LABEL_COLOURS}


def _rollout_entry(maps: Tensor) -> dict:
    """The text's rollout at every layer and its flow after the last one, as bytes (0..255 = 0..1)
    — or nothing where the text is too long for them (see ROLLOUT_TOKENS, FLOW_BUDGET)."""
    from ..analysis.rollout import attention_flow, attention_rollout

    L, T = maps.shape[0], maps.shape[-1]
    if T > ROLLOUT_TOKENS:
        return {}

    def packed(values: Tensor) -> str:
        return base64.b64encode((values.clamp(0, 1) * 255).round().to(torch.uint8).numpy().tobytes()).decode()

    entry = {"rollout": packed(attention_rollout(maps))}  # (L, T, T)
    if L * T ** 4 <= FLOW_BUDGET:
        entry["flow"] = packed(attention_flow(maps, layers=[L - 1])[L - 1])  # (T, T)
    return entry


def page_body(data: dict) -> str:
    """The page as a fragment: a container with its own id, its data and its script."""
    from importlib.resources import files

    root = f"mh-{uuid.uuid4().hex[:12]}"
    script = files("multihead.viz").joinpath("page.js").read_text(encoding="utf-8").replace("__ROOT_ID__", root)
    title = html.escape(str(data.get("model", "attention")))
    from .glyphs import embedded_font_css

    glyphs = embedded_font_css(t for s in data["sentences"] for t in (s["text"], *s["tokens"]))
    return (f'<div class="mh-page" id="{root}"><style>{glyphs}{_CSS}</style>'
            f"<h2>{title}: {data['num_layers']} layers × {data['num_heads']} heads</h2>"
            '<div class="mh-controls"></div>'
            '<div class="mh-tabs">'
            + ('<button class="mh-tab" data-view="overview">overview</button>' if data.get("overview") else "") +
            '<button class="mh-tab" data-view="model">model</button>'
            '<button class="mh-tab" data-view="head">head</button>'
            '<button class="mh-tab" data-view="matrix">matrix</button>'
            '<button class="mh-tab" data-view="rollout">rollout</button>'
            '<button class="mh-tab" data-view="table">table</button>'
            '<button class="mh-tab" data-view="similarity">similarity</button>'
            ' <button class="mh-export-png">export PNG</button>'
            ' <button class="mh-export-svg">export SVG</button>'
            ' <button class="mh-export-csv">export table CSV</button></div>'
            '<div class="mh-info"></div>'
            '<div class="mh-view" data-view="overview" style="display:none"><div class="mh-overview"></div></div>'
            '<div class="mh-view" data-view="model" style="display:none"><canvas class="mh-modelview"></canvas></div>'
            '<div class="mh-view" data-view="head" style="display:none"><canvas class="mh-headview"></canvas></div>'
            '<div class="mh-view" data-view="matrix" style="display:none"><div class="mh-matrix-title"></div>'
            '<div class="mh-zoom" style="display:none"><select class="mh-pool-mode" aria-label="pooled value">'
            '<option value="mass">block mass</option><option value="max">block max</option></select>'
            ' <button class="mh-zoom-out">zoom out</button> <button class="mh-zoom-all">whole map</button></div>'
            '<canvas class="mh-matrix"></canvas><div class="mh-detail"></div></div>'
            '<div class="mh-view" data-view="rollout" style="display:none"><div class="mh-rollout-title"></div>'
            '<select class="mh-rollout-mode" aria-label="rollout or flow"><option value="rollout">attention rollout'
            '</option><option value="flow">attention flow</option></select><br>'
            '<canvas class="mh-rollout"></canvas></div>'
            '<div class="mh-view" data-view="table" style="display:none"><table class="mh-table"></table></div>'
            '<div class="mh-view" data-view="similarity" style="display:none">'
            '<select class="mh-sim-order" aria-label="order of the heads"><option value="layer">layer order'
            '</option><option value="group">grouped (Ward groups on the diagonal)</option></select><br>'
            '<canvas class="mh-similarity"></canvas><ul class="mh-clusters"></ul></div>'
            f'<script type="application/json" id="{root}-data">{_json_for_script(data)}</script>'
            f"<script>{script}</script></div>")


def page_html(data: dict) -> str:
    """A whole HTML document: everything inline, and a policy that forbids any network load."""
    csp = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; font-src data:"
    title = html.escape(str(data.get("model", "attention")))
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
            f"<title>multihead: {title}</title></head><body>{page_body(data)}</body></html>\n")


class AttentionPage:
    """The page's data, shown inline in Jupyter (each display is its own independent instance)."""

    def __init__(self, data: dict) -> None:
        self.data = data

    def _repr_html_(self) -> str:
        return page_body(self.data)

    def html(self) -> str:
        return page_html(self.data)

    def save(self, path: str | Path) -> Path:
        return write_page(self.html(), path)


def attention_page(model: HFModel, texts: Sequence[str], report: Report | None = None) -> AttentionPage:
    """The page object for a few texts of a real model (display it in Jupyter, or ``.save(path)``)."""
    from .maps import attention_maps

    sentences: list = []
    for text in texts:
        if len(model.tokenizer(text, verbose=False)["input_ids"]) > LONG_TEXT:  # stream it, store it pooled
            sentences.append(streamed_page_text(model, text))
        else:
            sentences.append((text, *attention_maps(model, text)))
    data = page_data(sentences, report, model.num_layers, model.num_heads)
    data.setdefault("model", model.name)
    return AttentionPage(data)


def view_page(model: HFModel, texts: Sequence[str], report: Report | None = None) -> str:
    """A page for a few texts of a real model (optionally with its corpus report), as HTML."""
    return attention_page(model, texts, report).html()


def write_page(page: str, path: str | Path) -> Path:
    return write_atomically(path, page)
