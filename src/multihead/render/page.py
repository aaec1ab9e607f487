"""The interactive attention page: one self-contained HTML file (or a notebook cell).

Views: model (L x H thumbnails titled with labels; a click opens the head), head (lines from each
token to what it attends to, heads toggled by colour), matrix (one head's heatmap, the value
under the pointer, PNG/SVG export), rollout (attention rollout and flow of the text through the
layers, :mod:`multihead.analysis.rollout`), the sortable head table with every metric of a
:class:`~multihead.Report`, and the head x head similarity with its clusters. Several sentences
in one page, chosen from a list.

A renderer: it takes data — the views of :class:`~multihead.analysis.stats.maps.TextView` and a
:class:`~multihead.Report` — never a model (:mod:`multihead.viz` runs the pass and calls it).

Size: each attention row keeps its ``k`` largest weights (k = 32, or 16 for large models and
long inputs), quantised to a byte — the views draw nothing finer; a long text's pooled maps and
rows are gzip-compressed (the page inflates them with the browser's ``DecompressionStream``).
The data is versioned (:data:`PAGE_DATA_VERSION`). All strings are data (JSON in
a non-executable script tag, ``<``, ``>`` and ``&`` escaped) and are put on the page with
``textContent``; the page loads nothing from the network (a Content-Security-Policy says so).
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import os
import uuid
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import torch
from torch import Tensor

from .. import __version__
from ..analysis.labels import LONG_RANGE_HEAD, RETRIEVAL_HEAD, SINK_HEAD, WINDOW_KEPT, colour_of, label_codes, legend
from ..analysis.report import Report
from ..analysis.stats.maps import LONG_TEXT, TOP_K_BYTES, Pooled, TextView, stored_bytes
from ..files import write_atomically
from ..jsonable import json_number, json_value
from ..progress import counted
from .glyphs import embedded_font_css
from .js import page_script

__all__ = ["PAGE_DATA_VERSION", "AttentionPage", "page_body", "page_bytes", "page_data", "page_html", "stored_heads",
           "write_page"]

#: The version of the page's data (page.js reads it; a page of another version says so).
PAGE_DATA_VERSION = 2

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
    return base64.b64encode(_key_bytes(index, T)).decode(), base64.b64encode(q.numpy().tobytes()).decode(), k


def _key_bytes(index: Tensor, tokens: int) -> bytes:
    """Stored keys (any shape) as the page reads them: little-endian uint16, or uint32 for a text of
    more than 65,536 tokens (the entry then says ``key_bytes: 4``; uint16 would wrap its keys)."""
    return index.to(torch.int64).numpy().astype("<u2" if stored_bytes(tokens) == 3 else "<u4").tobytes()


def _key_width(tokens: int) -> dict:
    """The entry field that tells the page its keys are uint32 (none for uint16: older pages' form)."""
    return {} if stored_bytes(tokens) == 3 else {"key_bytes": 4}


#: The first keys a page's choice of stored heads leaves aside (attention sinks: their column shows
#: in the pooled blocks whole).
SINK_KEYS = 4


def stored_heads(index: Tensor, values: Tensor, budget: int = TOP_K_BYTES) -> list[int] | None:
    """Which heads' rows a long text's page stores, of ``index`` and ``values`` (L, H, T, k) its
    rows' k largest weights (their keys, and the weights as bytes): None — every head — while they
    fit ``budget`` bytes (``stored_bytes`` a weight), else the flat indices (l·H + h, ascending) of
    as many heads as fit, at least one: those whose stored weights off the first 4 keys carry the
    largest share of their attention first — a sharp head's rows say what its pooled blocks cannot,
    a diffuse head's top weights say little, and a sink's column the blocks show whole."""
    L, H, T, k = values.shape
    row = T * k * stored_bytes(T)  # one head's rows
    if L * H * row <= budget:
        return None
    fit = max(1, budget // row)
    off_sinks = values.to(torch.float32) * (index >= SINK_KEYS)  # (L, H, T, k)
    share = off_sinks.sum(-1).mean(-1).flatten()  # (L·H,) a row's mean stored weight off the sinks
    return share.argsort(descending=True, stable=True)[:fit].sort().values.tolist()  # ties: the earlier head


def _bytes(values: Tensor) -> str:
    """Values in [0, 1] as base64 bytes (0..255)."""
    return base64.b64encode((values.clamp(0, 1) * 255).round().to(torch.uint8).numpy().tobytes()).decode()


def _pack(raw: bytes) -> str:
    """gzip, then base64: the page inflates it with DecompressionStream("gzip")."""
    return base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode()


def _cores() -> int:
    """The cores this process may run on (its affinity, where the system says; else every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS and Windows: no affinity to read
        return os.cpu_count() or 1


def _pooled_entry(view: TextView, pooled: Pooled, threads: Executor) -> dict:
    """A long text's pooled attention as the page reads it: each row's k largest weights and the
    block-pooled mass and max, quantised to a byte (the pooled maps on a square-root scale, so
    faint long-range mass stays visible), gzip-compressed."""
    mass, largest = pooled.mass, pooled.largest
    scale = mass.flatten(2).amax(-1).clamp_min(1e-12)  # (L, H) each head's largest block mass
    mass_q = (mass / scale[..., None, None]).sqrt().mul(255).round().to(torch.uint8)
    largest_q = largest.clamp(0, 1).sqrt().mul(255).round().to(torch.uint8)
    T = len(view.tokens)
    index, values = pooled.index, pooled.values  # (L, H, T, k) each
    heads = stored_heads(index, values, TOP_K_BYTES)
    chosen = {}
    if heads is not None:  # the rows of the heads that fit the page's budget, in flat order
        index, values = index.flatten(0, 1)[heads], values.flatten(0, 1)[heads]  # (n, T, k) each
        chosen = {"heads": heads}
    # the four arrays compressed side by side on ``threads`` (zlib lets go of the GIL)
    packed = [threads.submit(_pack, raw) for raw in (_key_bytes(index, T), values.contiguous().numpy().tobytes(),
                                                     mass_q.numpy().tobytes(), largest_q.numpy().tobytes())]
    index_b64, values_b64, mass_b64, max_b64 = (f.result() for f in packed)
    return {"text": view.text, "tokens": view.tokens, "k": pooled.k, "gzip": True, **_key_width(T), **chosen,
            **_purpose(view), "index": index_b64, "values": values_b64,
            "pooled": {"block": pooled.block, "cells": pooled.cells, "mass": mass_b64, "max": max_b64,
                       "mass_scale": [round(float(s), 6) for s in scale.flatten()]}}


def _purpose(view: TextView) -> dict:
    """The entry field naming what an input that defines a label is there for (a probe's, a head's
    typical text; the page lists it so) — none for a corpus text."""
    return {"purpose": str(view.extra["purpose"])} if view.extra.get("purpose") else {}


def _dense_entry(view: TextView, top_k: int | None) -> dict:
    maps = view.maps
    L, H, T = maps.shape[0], maps.shape[1], maps.shape[-1]
    # a view may ask for fewer (a probe's input: a peak or two per row, ``extra["top_k"]``)
    k = top_k or view.extra.get("top_k") or (16 if L * H * T > 20_000 else 32)
    idx, val, k = _sparse_rows(maps, k)
    entry = {"text": view.text, "tokens": list(view.tokens), "k": k, **_key_width(T), "index": idx, "values": val,
             **_purpose(view)}
    rollout, flow = view.rollout_and_flow()
    if rollout is not None:
        entry["rollout"] = _bytes(rollout)  # (L, T, T)
    if flow is not None:
        entry["flow"] = _bytes(flow)  # (T, T)
    return entry


def page_data(views: Sequence[TextView | tuple], report: Report | None = None, num_layers: int | None = None,
              num_heads: int | None = None, *, top_k: int | None = None) -> dict:
    """The page's data: the texts' views (:class:`TextView`, or ``(text, tokens, maps (L, H, T, T))``)
    and an optional report (labels, metrics, similarity, the overview's sections)."""
    if not views:
        raise ValueError("a page needs at least one sentence")
    views = [v if isinstance(v, TextView) else TextView(v[0], list(v[1]), maps=v[2]) for v in views]
    shapes = {tuple((v.maps if v.maps is not None else v.pooled.mass).shape[:2]) for v in views}
    L, H = shapes.pop() if len(shapes) == 1 else (num_layers, num_heads)
    if shapes or L is None:
        raise ValueError("every text's maps must have the same (L, H)")
    if report is not None and (report.num_layers, report.num_heads) != (L, H):
        raise ValueError(f"the report is for {report.num_layers} x {report.num_heads} heads; the maps are {L} x {H}")
    rows = []
    # a long text's four arrays gzip-compressed on threads side by side (zlib lets go of the GIL), a
    # text at a time (its raw bytes only, not every text's, alive at once): a 1,223-token document's
    # page with its probe's view, 1.8 -> 1.1 s on two cores (AMD EPYC, AVX2), the same bytes
    with ThreadPoolExecutor(max_workers=max(1, min(4, _cores()))) as threads:
        for view in views:
            if view.pooled is not None:
                rows.append(_pooled_entry(view, view.pooled, threads))
                continue
            maps = view.maps
            if maps.dim() != 4 or maps.shape[:2] != (L, H) or maps.shape[2] != maps.shape[3] != len(view.tokens):
                raise ValueError(f"maps must be (L, H, T, T) with T = {len(view.tokens)} tokens; got "
                                 f"{tuple(maps.shape)}")
            rows.append(_dense_entry(view, top_k))
    data: dict = {"version": PAGE_DATA_VERSION, "num_layers": L, "num_heads": H, "sentences": rows,
                  "metric_names": [], "heads": [], "long_text": LONG_TEXT, **legend()}
    if report is not None:
        data.update(_report_data(report))
    return data


def _report_data(report: Report) -> dict:
    data: dict = {"model": report.model, "labels": [r.label for r in report.heads],
                  "codes": label_codes(r.label for r in report.heads),
                  # each label's colour as the static report draws it (A+B: its first component's)
                  "label_colours": {label: colour_of(label) for label in sorted({r.label for r in report.heads})}}
    marks = report.marks()
    if marks:  # labels tested by ablation (multihead.analysis.interventions.evidence)
        data["evidence"] = [marks.get((r.layer, r.head)) for r in report.heads]
    data["metric_names"] = report.metric_names
    data["heads"] = [{"layer": r.layer, "head": r.head, "label": r.label, "flags": list(r.flags),
                      "traits": list(r.traits),
                      "describe": r.describe(), "stability": json_number(r.stability, 3),
                      "degenerate": r.degenerate,
                      "intervals": {k: [json_number(lo, 4), json_number(hi, 4)] for k, (lo, hi) in r.intervals.items()},
                      "metrics": {k: json_number(v, 4) for k, v in r.metrics.items()}} for r in report.heads]
    red = report.redundancy
    if red is not None and red.js_distance is not None:
        js = torch.as_tensor(red.js_distance, dtype=torch.float64).nan_to_num(1.0).clamp(0, 1)
        data["similarity"] = (js * 255).round().to(torch.uint8).flatten().tolist()
        data["clusters"] = [list(map(list, g)) for g in red.clusters_js]
        if red.groups_js:
            data["groups"] = {**red.groups_js, "groups": [list(map(list, g)) for g in red.groups_js["groups"]]}
        data["pairs"] = [[list(a), list(b), json_number(v, 4)] for a, b, v in red.pairs_js]
        data["pairs_rows"] = red.rows_js  # the query rows the JS averages rest on (None: not kept)
    data["overview"] = _overview(report)
    if report.head_views:  # each head on the corpus texts where it is most typical of its label
        data["typical_tokens"] = {str(v.text): list(v.tokens) for v in report.head_views.values()}
        data["head_texts"] = {}
        for (text, layer, head), view in sorted(report.head_views.items()):
            data["head_texts"].setdefault(str(layer * report.num_heads + head), []).append(
                {"text": text, "k": int(view.index.shape[-1]),
                 **_key_width(len(view.tokens)),
                 "index": base64.b64encode(_key_bytes(view.index, len(view.tokens))).decode(),
                 "values": base64.b64encode(view.values.numpy().tobytes()).decode()})
    return data


def _overview(report: Report) -> dict:
    """What the overview tab shows beside the label map: the run and the probes' summaries (the
    per-head matrices stay out: the table has every head's metrics)."""
    out: dict = {"model": report.model, "causal": report.causal, "sentences": report.sentences,
                 "placement": report.placement,
                 "tokens": report.tokens, "written": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                 "version": __version__, "flags": [[r.layer, r.head, list(r.flags)] for r in report.flagged()],
                 "untested": [[r.layer, r.head, list(r.flags)] for r in report.untested()]}
    out.update(legend())
    sections = report.sections
    if sections.syntax is not None:
        out["syntax"] = {"min_count": sections.syntax.min_count, "relations": {
            rel: {"count": d.count, "baseline": json_number(d.baseline), "baseline_offset": d.baseline_offset,
                  "best": json_value(d.best), "margin_needed": json_number(d.margin_needed()), "beats": d.beats()}
            for rel, d in sections.syntax.relations.items()}, "not_parsed": sections.syntax.not_parsed}
    for key in ("coreference", "induction", "ablation", "evidence", "long_context", "retrieval", "what_if", "corpus",
                "typical"):
        section = getattr(sections, key)
        if section is not None:
            out[key] = section.to_dict()
    if "long_context" in out:  # the text report's thresholds, for the page's counts and lists of its heads
        out["long_context"].update(sink_head=SINK_HEAD, window_kept=WINDOW_KEPT, long_range_head=LONG_RANGE_HEAD,
                                   retrieval_head=RETRIEVAL_HEAD)
    return out


def _json_for_script(value: object) -> str:
    """JSON that cannot end the script element it sits in — ASCII only (other characters as
    ``\\uXXXX``): a long document's page data is tens of MB of base64, and one CJK character in a
    text would make Python hold all of it at 2 bytes a character (4 for an emoji), in each copy."""
    text = json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page_body(data: dict) -> str:
    """The page as a fragment: a container with its own id, its data and its script."""
    return "".join(_body_pieces(data))


def _shown(data: dict) -> str:
    """The line saying what the page's maps are of — "maps of 1 text, 14 tokens; bfloat16 on cpu" — and,
    where a report's labels sit beside them, that those are the report's (its own texts and precision)."""
    shown = data.get("shown")
    if not shown:
        return ""
    line = (f"maps of {counted(shown['texts'], 'text')}, {counted(shown['tokens'], 'token')}"
            + (f"; {shown['placement']}" if shown.get("placement") else ""))
    if data.get("overview"):
        line += "; labels, probes and the overview from the report (its own texts and run)"
    return f'<p class="mh-meta mh-shown">{html.escape(line)}</p>'


def _body_pieces(data: dict) -> tuple[str, str, str]:
    """:func:`page_body` in three pieces: the markup before the data, the data (ASCII JSON: most of
    the page), the markup after it — joined only as bytes when the page is written (:func:`page_bytes`)."""
    root = f"mh-{uuid.uuid4().hex[:12]}"
    script = page_script(root)
    title = html.escape(str(data.get("model", "attention")))
    glyphs = embedded_font_css(t for s in data["sentences"] for t in (s["text"], *s["tokens"]))
    return (f'<div class="mh-page" id="{root}"><style>{glyphs}{_CSS}</style>'
            f"<h2>{title}: {data['num_layers']} layers × {data['num_heads']} heads</h2>" + _shown(data) +
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
            f'<script type="application/json" id="{root}-data">',
            _json_for_script(data),
            f"</script><script>{script}</script></div>")


def page_html(data: dict) -> str:
    """A whole HTML document: everything inline, and a policy that forbids any network load."""
    return "".join(_html_pieces(data))


def page_bytes(data: dict) -> bytes:
    """:func:`page_html` as UTF-8, encoded piece by piece: the page is never one str (a long
    document's: 32 MB of data, held at 2 bytes a character once joined with the script's "—" and "→")."""
    return b"".join([piece.encode("utf-8") for piece in _html_pieces(data)])


def _html_pieces(data: dict) -> tuple[str, ...]:
    csp = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; font-src data:"
    title = html.escape(str(data.get("model", "attention")))
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
            f"<title>multihead: {title}</title></head><body>", *_body_pieces(data), "</body></html>\n")


class AttentionPage:
    """The page's data, shown inline in Jupyter (each display is its own independent instance)."""

    def __init__(self, data: dict) -> None:
        self.data = data

    def _repr_html_(self) -> str:
        return page_body(self.data)

    def html(self) -> str:
        return page_html(self.data)

    def save(self, path: str | Path) -> Path:
        return write_page(page_bytes(self.data), path)


def write_page(page: str | bytes, path: str | Path) -> Path:
    """Write a page (:func:`page_html`, or :func:`page_bytes` for a long document's) atomically."""
    return write_atomically(path, page)
