"""``Report``: one record per (layer, head) with its metrics, label and flags.

JSON schema (``schema`` = "multihead.report/1")::

    {"schema": "multihead.report/1", "model": str, "causal": bool,
     "num_layers": L, "num_heads": H, "sentences": int, "tokens": int,
     "metrics": [metric names], "heads": [
        {"layer": 0-based, "head": 0-based, "label": str, "flags": [str],
         "metrics": {"entropy": float, "entropy_norm": float, ...}}, ...],
     "redundancy": {...}, "induction": {...}, "coreference": {...}, "syntax": {...}}

Metric keys: the 13 of :data:`~multihead.analysis.metrics.METRICS`; ``duplicate_token`` and
``induction`` for causal models; ``coreference`` and ``coreference_mass`` when the pronoun set
was scored. A metric that could not be measured is ``null``.

Metric definitions: :mod:`multihead.analysis.metrics`; labels and flags:
:mod:`multihead.analysis.patterns`.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "multihead.report/1"

__all__ = ["SCHEMA", "HeadRecord", "Report"]

_SHORT = {"induction": "IND", "coreference": "COREF",
          "self": "SELF", "previous": "PREV", "next": "NEXT", "special-token": "SPEC", "local": "LOCL",
          "broad": "BRD", "mixed": "·"}


@dataclass
class HeadRecord:
    layer: int
    head: int
    label: str
    flags: list[str]
    metrics: dict[str, float]


@dataclass
class Report:
    model: str
    causal: bool
    num_layers: int
    num_heads: int
    sentences: int
    tokens: int
    heads: list[HeadRecord] = field(default_factory=list)
    #: js_distance / cosine: (N, N) tensors over N = L·H heads (head n is layer n // H, head n % H);
    #: pairs_js / pairs_cosine: most redundant pairs; clusters_js: groups of near-identical heads.
    redundancy: dict[str, Any] | None = None
    #: probe results beside the per-head metrics: "induction" (the probe's settings), "coreference"
    #: (examples, baseline_nearest), "syntax" (min_count, relations: count, baseline,
    #: baseline_offset, best head, (L, H) accuracy)
    sections: dict[str, Any] = field(default_factory=dict)

    def head(self, layer: int, head: int) -> HeadRecord:
        return self.heads[layer * self.num_heads + head]

    def to_dict(self) -> dict[str, Any]:
        names = list(self.heads[0].metrics) if self.heads else []
        data = {
            "schema": SCHEMA, "model": self.model, "causal": self.causal, "num_layers": self.num_layers,
            "num_heads": self.num_heads, "sentences": self.sentences, "tokens": self.tokens, "metrics": names,
            "heads": [{"layer": r.layer, "head": r.head, "label": r.label, "flags": list(r.flags),
                       "metrics": {k: _finite(v) for k, v in r.metrics.items()}} for r in self.heads],
        }
        if self.redundancy is not None:
            red = self.redundancy
            data["redundancy"] = {
                "js_distance": _matrix(red["js_distance"]),
                "cosine": _matrix(red["cosine"]),
                "pairs_js": [{"a": list(a), "b": list(b), "value": _finite(v)} for a, b, v in red["pairs_js"]],
                "pairs_cosine": [{"a": list(a), "b": list(b), "value": _finite(v)} for a, b, v in red["pairs_cosine"]],
                "clusters_js": [[list(x) for x in group] for group in red["clusters_js"]],
                "cluster_threshold": red["cluster_threshold"],
                "rows_js": red.get("rows_js"),
            }
        for name, section in self.sections.items():
            data[name] = _plain(section)
        return data

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=1, ensure_ascii=False)
        if path is not None:
            Path(path).write_text(text + "\n", encoding="utf-8")
        return text

    @classmethod
    def from_json(cls, path: str | Path) -> Report:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if data.get("schema") != SCHEMA:
            raise ValueError(f"{path} is not a multihead report (schema {data.get('schema')!r}, expected {SCHEMA!r})")
        heads = [HeadRecord(h["layer"], h["head"], h["label"], h["flags"],
                            {k: (math.nan if v is None else v) for k, v in h["metrics"].items()})
                 for h in data["heads"]]
        red = data.get("redundancy")
        if red is not None:
            for key in ("pairs_js", "pairs_cosine"):
                red[key] = [(tuple(p["a"]), tuple(p["b"]), p["value"]) for p in red[key]]
            red["clusters_js"] = [[tuple(x) for x in group] for group in red["clusters_js"]]
        sections = {name: data[name] for name in ("induction", "coreference", "syntax") if name in data}
        return cls(data["model"], data["causal"], data["num_layers"], data["num_heads"], data["sentences"],
                   data["tokens"], heads, red, sections)

    def to_csv(self, path: str | Path) -> None:
        names = list(self.heads[0].metrics) if self.heads else []
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["layer", "head", "label", "flags", *names])
            for r in self.heads:
                writer.writerow([r.layer, r.head, r.label, ";".join(r.flags),
                                 *(f"{r.metrics[n]:.6g}" for n in names)])

    def label_map(self) -> str:
        """The layer x head grid of labels, for a terminal."""
        lines = ["layer | " + " ".join(f"h{h:<4d}" for h in range(self.num_heads))]
        for layer in range(self.num_layers):
            cells = [_short(self.head(layer, h).label) for h in range(self.num_heads)]
            lines.append(f"{layer:5d} | " + " ".join(f"{c:<5s}" for c in cells))
        legend = ", ".join(f"{v}={k}" for k, v in _SHORT.items()) + ", lower case=syntactic:<relation>"
        return "\n".join([*lines, f"({legend})"])

    def to_html(self, path: str | Path | None = None, *, model: Any = None, texts: Any = None) -> str:
        """One self-contained HTML page (nothing loaded from the network, every string escaped).

        With ``model`` (an :class:`~multihead.hf.HFModel`) and ``texts``: the interactive page
        (model, head, matrix, table and similarity views) for those texts with this report;
        otherwise a static page of the label map, the head table and the probes.
        """
        if model is not None:
            from ..viz.page import view_page

            page = view_page(model, list(texts or []), self)
        else:
            from .html import report_page

            page = report_page(self)
        if path is not None:
            Path(path).write_text(page, encoding="utf-8")
        return page

    def _repr_html_(self) -> str:  # Jupyter
        from .html import report_body

        return report_body(self)

    def flagged(self) -> list[HeadRecord]:
        return [r for r in self.heads if r.flags]

    def __str__(self) -> str:
        return self.label_map()


def _short(label: str) -> str:
    if label.startswith("syntactic:"):
        return label.removeprefix("syntactic:")[:5].lower()
    return _SHORT.get(label, label[:5])


def _plain(value: Any) -> Any:
    """JSON-ready: tensors become nested lists, floats are rounded, NaN becomes null."""
    if hasattr(value, "tolist"):
        return _matrix(value) if getattr(value, "dim", lambda: 0)() == 2 else value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return _finite(value)
    return value


def _matrix(m: Any) -> list[list[float | None]]:
    rows = m.tolist() if hasattr(m, "tolist") else m
    return [[_finite(math.nan if x is None else float(x), 4) for x in row] for row in rows]


def _finite(v: float, digits: int = 6) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v), digits)
