"""``Report``: one record per (layer, head) with its metrics, label and flags.

JSON schema (``schema`` = "multihead.report/1")::

    {"schema": "multihead.report/1", "model": str, "causal": bool,
     "num_layers": L, "num_heads": H, "sentences": int, "tokens": int,
     "metrics": [metric names], "heads": [
        {"layer": 0-based, "head": 0-based, "label": str, "flags": [str],
         "metrics": {"entropy": float, "entropy_norm": float, ...}}, ...],
     "redundancy": {...}, "unknown_tokens": {...}, "induction": {...}, "coreference": {...},
     "syntax": {...}}

Metric keys: the 13 of :data:`~multihead.analysis.metrics.METRICS`; ``duplicate_token`` and
``induction`` for causal models; ``coreference`` and ``coreference_mass`` when the pronoun set
was scored. A metric that could not be measured is ``null``. ``unknown_tokens`` (tokenizers with an
unknown token): ``count`` of the ``total`` non-special tokens were ``token`` (e.g. "[UNK]"), ``share``.

Metric definitions: :mod:`multihead.analysis.metrics`; labels and flags:
:mod:`multihead.analysis.patterns`.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..files import atomic_path, write_atomically
from ..jsonable import json_matrix, json_number, json_value

SCHEMA = "multihead.report/1"
#: The probe sections a report may carry beside the per-head metrics.
SECTIONS = ("corpus", "unknown_tokens", "images", "long_context", "retrieval", "what_if", "induction", "coreference",
            "syntax", "ablation", "evidence", "typical")

__all__ = ["SCHEMA", "HeadRecord", "Report", "head_records", "label_codes"]

#: How the terminal map marks a tested label (after its code).
MARK_CONFIRMED, MARK_ATTENTION_ONLY = "✓", "~"

_SHORT = {"induction": "IND", "coreference": "COREF",
          "self": "SELF", "previous": "PREV", "next": "NEXT", "special-token": "SPEC", "local": "LOCL",
          "broad": "BRD", "mixed": "·", "aligned": "ALGN", "source-special": "SSPEC", "cls": "CLS"}


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
    #: pairs_js / pairs_cosine: most redundant pairs; clusters_js: groups of near-identical heads;
    #: groups_js: average-linkage groups cut where the silhouette is best (informative groups).
    redundancy: dict[str, Any] | None = None
    #: probe results beside the per-head metrics: "induction" (the probe's settings), "coreference"
    #: (examples, baseline_nearest), "syntax" (min_count, relations: count, baseline,
    #: baseline_offset, best head, (L, H) accuracy)
    sections: dict[str, Any] = field(default_factory=dict)
    #: which stack these heads form: "encoder", "decoder", "cross" or "vision"
    stack: str = ""
    #: the model's other stacks (an encoder-decoder model: "decoder" and "cross"), each a Report
    stacks: dict[str, Report] = field(default_factory=dict)

    def head(self, layer: int, head: int) -> HeadRecord:
        return self.heads[layer * self.num_heads + head]

    def to_dict(self) -> dict[str, Any]:
        names = list(self.heads[0].metrics) if self.heads else []
        data = {
            "schema": SCHEMA, "model": self.model, "causal": self.causal, "num_layers": self.num_layers,
            "num_heads": self.num_heads, "sentences": self.sentences, "tokens": self.tokens, "metrics": names,
            "stack": self.stack,
            "heads": [{"stack": self.stack, "layer": r.layer, "head": r.head, "label": r.label,
                       "flags": list(r.flags), "metrics": {k: json_number(v) for k, v in r.metrics.items()}}
                      for r in self.heads],
        }
        if self.redundancy is not None:
            red = self.redundancy
            data["redundancy"] = {
                "js_distance": json_matrix(red["js_distance"]),
                "cosine": json_matrix(red["cosine"]),
                **{key: [{"a": list(a), "b": list(b), "value": json_number(v)} for a, b, v in red[key]]
                   for key in ("pairs_js", "pairs_cosine")},
                "clusters_js": [[list(x) for x in group] for group in red["clusters_js"]],
                **({"groups_js": {**red["groups_js"], "groups": [[list(x) for x in group]
                                                                 for group in red["groups_js"]["groups"]]}}
                   if red.get("groups_js") else {}),
                "cluster_threshold": red["cluster_threshold"],
                "rows_js": red.get("rows_js"),
            }
        for name, section in self.sections.items():
            data[name] = json_value(section)
        if self.stacks:
            data["stacks"] = {name: {k: v for k, v in sub.to_dict().items() if k != "schema"}
                              for name, sub in self.stacks.items()}
        return data

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=1, ensure_ascii=False)
        if path is not None:
            write_atomically(path, text)
        return text

    @classmethod
    def from_json(cls, path: str | Path) -> Report:
        try:
            data = json.loads(Path(path).read_bytes().decode("utf-8"))
        except UnicodeDecodeError as err:
            raise ValueError(f"{path} is not a multihead report: not UTF-8 text (byte {err.start})") from err
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not a multihead report: not JSON ({err.msg}, line {err.lineno})") from err
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            data = data if isinstance(data, dict) else {}
            raise ValueError(f"{path} is not a multihead report (schema {data.get('schema')!r}, expected {SCHEMA!r})")
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        """The report of a dict as :meth:`to_dict` writes it."""
        heads = [HeadRecord(h["layer"], h["head"], h["label"], h["flags"],
                            {k: (math.nan if v is None else v) for k, v in h["metrics"].items()})
                 for h in data["heads"]]
        red = data.get("redundancy")
        if red is not None:
            for key in ("pairs_js", "pairs_cosine"):
                red[key] = [(tuple(p["a"]), tuple(p["b"]), p["value"]) for p in red[key]]
            red["clusters_js"] = [[tuple(x) for x in group] for group in red["clusters_js"]]
            if red.get("groups_js"):
                red["groups_js"]["groups"] = [[tuple(x) for x in group] for group in red["groups_js"]["groups"]]
        sections = {name: data[name] for name in SECTIONS if name in data}
        stacks = {name: cls.from_dict(sub) for name, sub in (data.get("stacks") or {}).items()}
        return cls(data["model"], data["causal"], data["num_layers"], data["num_heads"], data["sentences"],
                   data["tokens"], heads, red, sections, data.get("stack", ""), stacks)

    def to_csv(self, path: str | Path) -> None:
        names = list(dict.fromkeys(n for report in (self, *self.stacks.values()) for r in report.heads[:1]
                                   for n in r.metrics))
        with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["stack", "layer", "head", "label", "evidence", "flags", *names])
            for report in (self, *self.stacks.values()):
                marks = report.marks()
                for r in report.heads:
                    writer.writerow([report.stack, r.layer, r.head, r.label, marks.get((r.layer, r.head), ""),
                                     ";".join(r.flags),
                                     *(f"{r.metrics[n]:.6g}" if n in r.metrics else "" for n in names)])

    def label_map(self) -> str:
        """The layer x head grid of labels, for a terminal, with a legend of every abbreviation used
        (one grid per stack when the model has several)."""
        if not self.stacks:
            return self._grid()
        parts = [f"{report.stack} stack:\n{report._grid()}" for report in (self, *self.stacks.values())]
        return "\n\n".join(parts)

    def marks(self) -> dict[tuple[int, int], str]:
        """{(layer, head): "confirmed" | "attention-only"} for the heads whose label was tested
        (the ``evidence`` section; empty when the analysis ran no ablation)."""
        section = self.sections.get("evidence") or {}
        return {(e["layer"], e["head"]): e["mark"] for e in section.get("heads", [])}

    def _grid(self) -> str:
        codes = label_codes(r.label for r in self.heads)
        marks = self.marks()
        signs = {"confirmed": MARK_CONFIRMED, "attention-only": MARK_ATTENTION_ONLY}
        width = max([4, *(len(c) + (1 if marks else 0) for c in codes.values())])
        lines = ["layer | " + " ".join(f"h{h:<{width - 1}d}" for h in range(self.num_heads))]
        for layer in range(self.num_layers):
            cells = [codes[self.head(layer, h).label] + signs.get(marks.get((layer, h), ""), "")
                     for h in range(self.num_heads)]
            lines.append(f"{layer:5d} | " + " ".join(f"{c:<{width}s}" for c in cells))
        legend = [f"{code}={label}" for label, code in sorted(codes.items(), key=lambda kv: kv[1])
                  if code != label and code != label.removeprefix("syntactic:").lower()]
        if any(label.startswith("syntactic:") for label in codes):
            legend.append("lower case: syntactic:REL, the dependent attends to its governor; REL>: the governor "
                          "attends to its REL dependents")
        if marks:
            legend.append(f"{MARK_CONFIRMED} confirmed: removing the head weakens what its label names; "
                          f"{MARK_ATTENTION_ONLY} attention-only: it looks that way, but the behaviour does not "
                          "need it")
        return "\n".join([*lines, *(["(" + "; ".join(legend) + ")"] if legend else [])])

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
            write_atomically(path, page)
        return page

    def _repr_html_(self) -> str:  # Jupyter
        from .html import report_body

        return report_body(self)

    def flagged(self) -> list[HeadRecord]:
        return [r for r in self.heads if r.flags]

    def __str__(self) -> str:
        return self.label_map()


def head_records(means: dict[str, Any], label: Callable[[dict[str, float]], str],
                 flags: Callable[[dict[str, float]], list[str]] | None = None) -> list[HeadRecord]:
    """One record per (layer, head) of (L, H) metric tensors, labelled (and flagged) from its metrics
    (a metric that could not be measured for a head stays NaN: ``null`` in JSON)."""
    first = next(iter(means.values()))
    L, H = first.shape
    records = []
    for layer in range(L):
        for head in range(H):
            metrics = {name: float(v[layer, head]) for name, v in means.items()}
            records.append(HeadRecord(layer, head, label(metrics), flags(metrics) if flags else [], metrics))
    return records


def label_codes(labels: Iterable[str], width: int = 7) -> dict[str, str]:
    """A short, unique code per label for the terminal map: IND, PREV, ... for the pattern labels;
    the relation for ``syntactic:REL`` (its direction mark ``>`` always kept, long names cut and
    numbered where two would collide). The legend maps each code back to its label."""
    codes: dict[str, str] = {}
    used: set[str] = set()
    for label in sorted(set(labels)):
        if label.startswith("syntactic:"):
            rel = label.removeprefix("syntactic:").lower()
            arrow = ">" if rel.endswith(">") else ""
            rel = rel.removesuffix(">")
            code = rel[:width - len(arrow)] + arrow
            n = 1
            while code in used:  # two relations cut to the same prefix
                n += 1
                code = rel[:width - len(arrow) - len(str(n))] + str(n) + arrow
        else:
            code = _SHORT.get(label, label[:width].upper())
        used.add(code)
        codes[label] = code
    return codes


