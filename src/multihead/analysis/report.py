"""``Report``: one record per (layer, head) with its metrics, label and flags, and typed sections.

JSON schema (``schema`` = "multihead.report/2")::

    {"schema": "multihead.report/2", "model": str, "causal": bool,
     "num_layers": L, "num_heads": H, "sentences": int, "tokens": int, "stack": str,
     "metrics": [metric names], "heads": [
        {"stack": str, "layer": 0-based, "head": 0-based, "label": str, "flags": [str],
         "metrics": {"entropy": float, "entropy_norm": float, ...}}, ...],
     "sections": {"corpus": {...}, "redundancy": {...}, "evidence": {...}, ...},
     "stacks": {"decoder": {...}, "cross": {...}}}

Each section is a typed dataclass of :mod:`multihead.analysis.sections`. Reports written by
schema 1 (sections at the top level beside ``heads``) are read as well.

Metric keys: the 13 of :data:`~multihead.analysis.stats.heads.METRICS`; ``duplicate_token`` and
``induction`` for causal models; ``coreference`` and ``coreference_mass`` when the pronoun set
was scored; the ablation effects; the long-context metrics of long inputs. A metric that could
not be measured is ``null``.

Metric definitions: :mod:`multihead.analysis.stats`; labels and flags: :mod:`multihead.analysis.labels`.
A report never renders itself: :mod:`multihead.render` draws it (terminal text, static HTML, the page).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..files import atomic_path, write_atomically
from ..jsonable import MAX_DEPTH, json_number, read_json
from .labels import MARK_WORDS, MARKS, describe, label_codes, label_value, traits_for
from .sections import SECTION_TYPES, Evidence, Redundancy, Sections

SCHEMA = "multihead.report/2"
#: Earlier schemas this version reads.
READS = ("multihead.report/1", SCHEMA)

__all__ = ["MAX_DEPTH", "READS", "SCHEMA", "HeadRecord", "Report", "head_records", "label_codes", "read_json"]


@dataclass
class HeadRecord:
    """One head: its label (with the ``value`` its rule read), secondary ``traits``, pattern
    ``flags``, whether it is ``degenerate`` (None: not tested by ablation), its metrics, their
    bootstrap ``intervals`` over texts ({metric: (low, high)}) and the label's ``stability``
    (share of resampled corpora giving the same label); see :mod:`multihead.analysis.labels`."""

    layer: int
    head: int
    label: str
    flags: list[str]
    metrics: dict[str, float]
    traits: list[str] = field(default_factory=list)
    value: float | None = None
    degenerate: bool | None = None
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    stability: float | None = None

    def describe(self) -> str:
        """The label with its defining value (``induction 0.88``) and traits (``, trait sink 0.91``)."""
        words = describe(self.label, self.metrics, self.value)
        for trait in self.traits:
            mass = self.metrics.get("cls", math.nan) + (self.metrics.get("sep", 0.0) if trait == "special" else 0.0)
            words += f"; trait {trait} {mass:.2f}"
        return words

    def to_dict(self, stack: str) -> dict[str, Any]:
        data: dict[str, Any] = {"stack": stack, "layer": self.layer, "head": self.head, "label": self.label,
                                "flags": list(self.flags),
                                "metrics": {k: json_number(v) for k, v in self.metrics.items()}}
        if self.traits:
            data["traits"] = list(self.traits)
        if self.value is not None:
            data["value"] = json_number(self.value)
        if self.degenerate is not None:
            data["degenerate"] = self.degenerate
        if self.intervals:
            data["intervals"] = {k: [json_number(lo), json_number(hi)] for k, (lo, hi) in self.intervals.items()}
        if self.stability is not None:
            data["stability"] = json_number(self.stability)
        return data


@dataclass(kw_only=True)
class Report:
    """What an analysis found: every head's record, the typed sections, the model's other stacks.

    ``views``: the page's data for a few texts (:class:`~multihead.analysis.stats.maps.TextView`),
    and ``head_views``: each head on its typical texts, kept for the renderers; never written to JSON."""

    model: str
    causal: bool
    num_layers: int
    num_heads: int
    sentences: int
    tokens: int
    heads: list[HeadRecord] = field(default_factory=list)
    sections: Sections = field(default_factory=Sections)
    #: which stack these heads form: "encoder", "decoder", "cross" or "vision"
    stack: str = ""
    #: the model's other stacks (an encoder-decoder model: "decoder" and "cross"), each a Report
    stacks: dict[str, Report] = field(default_factory=dict)
    #: where and in what precision the model ran, in words ("bfloat16 on cuda:0"); "" when not recorded
    placement: str = ""
    views: list[Any] = field(default_factory=list, repr=False, compare=False)
    #: single heads' maps on the corpus texts where each is most typical of its label
    #: ({(text index, layer, head): HeadView}, :mod:`multihead.analysis.stats.maps`), for the page; never JSON
    head_views: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    def head(self, layer: int, head: int) -> HeadRecord:
        return self.heads[layer * self.num_heads + head]

    @property
    def redundancy(self) -> Redundancy | None:
        return self.sections.redundancy

    @property
    def metric_names(self) -> list[str]:
        return list(self.heads[0].metrics) if self.heads else []

    def to_dict(self) -> dict[str, Any]:
        data = {
            "schema": SCHEMA, "model": self.model, "causal": self.causal, "num_layers": self.num_layers,
            "num_heads": self.num_heads, "sentences": self.sentences, "tokens": self.tokens,
            "metrics": self.metric_names, "stack": self.stack,
            "heads": [r.to_dict(self.stack) for r in self.heads],
            "sections": self.sections.to_dict(),
        }
        if self.placement:
            data["placement"] = self.placement
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
        """The report in ``path``; ValueError (one line, naming the file) for anything that is not one."""
        data = read_json(path, "a multihead report")
        if not isinstance(data, dict) or data.get("schema") not in READS:
            found = data.get("schema") if isinstance(data, dict) else None
            raise ValueError(f"{path} is not a multihead report (schema {found!r}, expected {SCHEMA!r})")
        try:
            return cls.from_dict(data)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
            what = f"lacks {err}" if isinstance(err, KeyError) else str(err)
            raise ValueError(f"{path} is not a complete multihead report: {what}") from err

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        """The report of a dict as :meth:`to_dict` writes it (schema 2) or schema 1 did."""
        if not isinstance(data.get("heads"), list):
            raise ValueError("its 'heads' is not a list" if "heads" in data else "it lacks 'heads'")
        heads = [_head(h, n) for n, h in enumerate(data["heads"])]
        if "sections" in data:
            sections = Sections.from_dict(data["sections"])
        else:  # schema 1: the sections beside the heads
            names = {t.name for t in SECTION_TYPES}
            sections = Sections.from_dict({k: v for k, v in data.items() if k in names and v is not None})
        stacks = {name: cls.from_dict(sub) for name, sub in (data.get("stacks") or {}).items()}
        report = cls(model=data["model"], causal=bool(data["causal"]), num_layers=int(data["num_layers"]),
                     num_heads=int(data["num_heads"]), sentences=int(data["sentences"]), tokens=int(data["tokens"]),
                     heads=heads, sections=sections, stack=data.get("stack", ""), stacks=stacks,
                     placement=str(data.get("placement") or ""))
        if len(heads) != report.num_layers * report.num_heads:
            raise ValueError(f"it lists {len(heads)} heads for {report.num_layers} x {report.num_heads}")
        return report

    def to_csv(self, path: str | Path) -> None:
        names = list(dict.fromkeys(n for report in (self, *self.stacks.values()) for r in report.heads[:1]
                                   for n in r.metrics))
        with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["stack", "layer", "head", "label", "label_value", "stability", "traits", "evidence",
                             "flags", "degenerate", *names])
            for report in (self, *self.stacks.values()):
                marks = report.marks()
                for r in report.heads:
                    writer.writerow([report.stack, r.layer, r.head, r.label,
                                     "" if r.value is None or math.isnan(r.value) else f"{r.value:.6g}",
                                     "" if r.stability is None else f"{r.stability:.3g}", ";".join(r.traits),
                                     marks.get((r.layer, r.head), ""), ";".join(r.flags),
                                     "" if r.degenerate is None else str(r.degenerate).lower(),
                                     *(f"{r.metrics[n]:.6g}" if n in r.metrics else "" for n in names)])

    def marks(self) -> dict[tuple[int, int], str]:
        """{(layer, head): "confirmed" | "attention-only"} for the heads whose label was tested
        (the ``evidence`` section; empty when the analysis ran no ablation)."""
        evidence: Evidence | None = self.sections.evidence
        return evidence.marks() if evidence is not None else {}

    def label_map(self) -> str:
        """The layer x head grid of labels as text, with a legend of every code used (one grid per
        stack when the model has several)."""
        if not self.stacks:
            return self._grid()
        parts = [f"{report.stack} stack:\n{report._grid()}" for report in (self, *self.stacks.values())]
        return "\n\n".join(parts)

    def _grid(self) -> str:
        codes = label_codes(r.label for r in self.heads)
        marks = self.marks()
        width = max([4, *(len(c) + (1 if marks else 0) for c in codes.values())])
        lines = ["layer | " + " ".join(f"h{h:<{width - 1}d}" for h in range(self.num_heads))]
        for layer in range(self.num_layers):
            cells = [codes[self.head(layer, h).label] + MARKS.get(marks.get((layer, h), ""), "")
                     for h in range(self.num_heads)]
            lines.append(f"{layer:5d} | " + " ".join(f"{c:<{width}s}" for c in cells))
        legend = [f"{code}={label}" for label, code in sorted(codes.items(), key=lambda kv: kv[1])
                  if code != label and code != label.removeprefix("syntactic:").lower()]
        if any(label.startswith("syntactic:") for label in codes):
            legend.append("lower case: syntactic:REL, the dependent attends to its governor; REL>: the governor "
                          "attends to its REL dependents")
        if marks:
            legend.append("; ".join(f"{MARKS[m]} {MARK_WORDS[m]}" for m in MARKS))
        return "\n".join([*lines, *(["(" + "; ".join(legend) + ")"] if legend else [])])

    def flagged(self) -> list[HeadRecord]:
        """The degenerate heads: a pattern flag, and removing them changes nothing."""
        return [r for r in self.heads if r.degenerate]

    def untested(self) -> list[HeadRecord]:
        """Heads whose attention looks input-independent (a pattern flag) but whose removal was not
        measured: not called degenerate (a head that matters never is)."""
        return [r for r in self.heads if r.flags and r.degenerate is None]

    def __str__(self) -> str:
        return self.label_map()


def _head(h: Any, n: int) -> HeadRecord:
    """One head of a report's JSON, every field checked: ValueError naming the field."""
    if not isinstance(h, dict):
        raise ValueError(f"heads[{n}] is a {type(h).__name__}, expected an object")
    for key, kind in (("layer", int), ("head", int), ("label", str), ("flags", list), ("metrics", dict)):
        if key not in h:
            raise ValueError(f"heads[{n}] lacks {key!r}")
        if not isinstance(h[key], kind) or isinstance(h[key], bool):
            raise ValueError(f"heads[{n}].{key} is {h[key]!r}, expected {kind.__name__}")
    metrics = {}
    for name, value in h["metrics"].items():
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
            raise ValueError(f"heads[{n}].metrics.{name} is {value!r}, expected a number or null")
        metrics[name] = math.nan if value is None else float(value)
    intervals = {}
    for name, pair in (h.get("intervals") or {}).items():
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError(f"heads[{n}].intervals.{name} is {pair!r}, expected [low, high]")
        intervals[name] = tuple(math.nan if x is None else float(x) for x in pair)
    degenerate = h.get("degenerate")
    if degenerate is not None and not isinstance(degenerate, bool):
        raise ValueError(f"heads[{n}].degenerate is {degenerate!r}, expected true, false or absent")

    def number(key: str) -> float | None:
        value = h.get(key)
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
            raise ValueError(f"heads[{n}].{key} is {value!r}, expected a number")
        return None if value is None else float(value)

    return HeadRecord(h["layer"], h["head"], h["label"], [str(f) for f in h["flags"]], metrics,
                      traits=[str(t) for t in h.get("traits") or []], value=number("value"), degenerate=degenerate,
                      intervals=intervals, stability=number("stability"))


def head_records(means: dict[str, Any], label: Callable[[dict[str, float]], str],
                 flags: Callable[..., list[str]] | None = None, *, causal: bool = False) -> list[HeadRecord]:
    """One record per (layer, head) of (L, H) metric tensors, labelled (and flagged: ``flags(metrics,
    label)``) from its metrics, with the label's value and traits (a metric that could not be measured
    for a head stays NaN: ``null`` in JSON). ``causal``: the stack is a causal decoder's."""
    first = next(iter(means.values()))
    L, H = first.shape
    records = []
    for layer in range(L):
        for head in range(H):
            metrics = {name: float(v[layer, head]) for name, v in means.items()}
            name = label(metrics)
            records.append(HeadRecord(layer, head, name, flags(metrics, name) if flags else [], metrics,
                                      traits=traits_for(name, metrics, causal=causal) if flags else [],
                                      value=label_value(name, metrics) if flags else None))
    return records
