"""The typed sections of a report: each probe's and each reducer's findings beside the per-head metrics.

Every section is a dataclass with its own JSON round trip (``to_dict`` / ``from_dict``), so a
renderer reads ``report.sections.evidence.heads[0].mark`` rather than a string key of a dict.
:class:`Sections` holds them, each optional; its JSON is one object keyed by section name.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..jsonable import json_matrix, json_number, json_value

__all__ = [
    "SECTION_TYPES",
    "Ablation",
    "Coreference",
    "Corpus",
    "Evidence",
    "HeadEvidence",
    "Images",
    "Induction",
    "LongContext",
    "Redundancy",
    "Relation",
    "Retrieval",
    "Section",
    "Sections",
    "Syntax",
    "Typical",
    "TypicalHead",
    "UnknownTokens",
    "WhatIf",
    "unit_of",
]

Cell = tuple[int, int]


def sampling_margin(accuracy: float, baseline: float, count: int) -> float:
    """How far an accuracy must beat a baseline on the same ``count`` instances to be beyond sampling
    noise: Z95 (1.96) standard errors of the difference of two proportions (unpaired: conservative)."""
    if count <= 0:
        return math.inf
    return 1.96 * math.sqrt((accuracy * (1 - accuracy) + baseline * (1 - baseline)) / count)


class Section:
    """A section's JSON round trip: its fields as they are (numbers rounded, NaN as null)."""

    name: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready; an optional field (default None) only when it is set."""
        return {f.name: json_value(getattr(self, f.name)) for f in dataclasses.fields(self)  # type: ignore[arg-type]
                if not (f.default is None and getattr(self, f.name) is None)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        missing = [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                   if f.name not in data and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise ValueError(f"section {cls.name!r} lacks {', '.join(missing)}")
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class Corpus(Section):
    """What identifies the analysed corpus: the number of texts and the SHA-256 of them as a JSON list."""

    name: ClassVar[str] = "corpus"
    texts: int
    sha256: str


@dataclass
class UnknownTokens(Section):
    """``count`` of the ``total`` non-special tokens were the tokenizer's ``token`` (e.g. "[UNK]")."""

    name: ClassVar[str] = "unknown_tokens"
    count: int
    total: int
    share: float
    token: str


@dataclass
class Images(Section):
    name: ClassVar[str] = "images"
    count: int
    patch_rows: int


@dataclass
class LongContext(Section):
    """Long inputs (:mod:`multihead.analysis.stats.longcontext`): the longest text's real tokens and
    the map budget above which a layer was streamed in query chunks."""

    name: ClassVar[str] = "long_context"
    longest_tokens: int
    budget_bytes: int | None = None
    chunk: int | None = None  # written by reports of schema 1 (the --document chunk)


@dataclass
class Retrieval(Section):
    """The needle probe (:mod:`multihead.analysis.probes.retrieval`): its settings and how many
    steps the model copied on."""

    name: ClassVar[str] = "retrieval"
    trials: int
    haystack: int
    depth: float
    seed: int
    copy_steps: int
    steps: int


@dataclass
class WhatIf(Section):
    """A causal LM's loss (nats per token) with its layers attending only through ``mask``."""

    name: ClassVar[str] = "what_if"
    mask: str
    tokens: int
    loss: float
    loss_all_layers: float
    delta_all_layers: float
    delta_per_layer: list[float]


@dataclass
class Induction(Section):
    """The repeated-random-tokens probe's settings (:mod:`multihead.analysis.probes.induction`)."""

    name: ClassVar[str] = "induction"
    count: int
    length: int
    seed: int


@dataclass
class Coreference(Section):
    name: ClassVar[str] = "coreference"
    examples: int
    skipped_unknown_tokens: int
    baseline_nearest: float


@dataclass
class Relation:
    """One relation key's syntax scores: how often it was seen, the best fixed offset's accuracy,
    every head's accuracy (L, H) and the best head."""

    count: int
    baseline: float
    baseline_offset: int
    accuracy: list[list[float | None]]
    best: dict[str, Any]

    def margin_needed(self) -> float:
        """How far the best head must beat the fixed offset to be beyond sampling noise."""
        return sampling_margin(float(self.best["accuracy"]), self.baseline, self.count)

    def beats(self) -> bool:
        """Does the best head beat the best fixed offset beyond the sampling interval?"""
        return float(self.best["accuracy"]) - self.baseline > self.margin_needed()


@dataclass
class Syntax(Section):
    name: ClassVar[str] = "syntax"
    min_count: int
    relations: dict[str, Relation]
    #: texts spaCy's English pipeline was not given: not in Latin script (its tree would be junk)
    not_parsed: int = 0

    def to_dict(self) -> dict[str, Any]:
        out = {"min_count": self.min_count, "relations": {
            rel: {"count": r.count, "baseline": json_number(r.baseline), "baseline_offset": r.baseline_offset,
                  "accuracy": json_matrix(r.accuracy), "best": json_value(r.best)}
            for rel, r in self.relations.items()}}
        if self.not_parsed:
            out["not_parsed"] = self.not_parsed
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Syntax:
        return cls(data["min_count"], {rel: Relation(**r) for rel, r in data["relations"].items()},
                   int(data.get("not_parsed", 0)))


def unit_of(objective: str) -> str:
    """The unit an ablation objective's changes are in: "nats/token" (a loss) or "1 - cos"."""
    return "1 - cos" if objective.startswith("1 - cosine") else "nats/token"


@dataclass
class Ablation(Section):
    """Each head's effect on the model's own objective when it alone is removed
    (:mod:`multihead.analysis.interventions.ablation`); the per-head values are metrics."""

    name: ClassVar[str] = "ablation"
    objective: str
    intact: float
    texts: int
    tokens: int
    modes: list[str]
    #: why no head was ablated (the per-head metrics are then absent)
    skipped: str | None = None
    #: the unit of every effect: "nats/token" (a loss) or "1 - cos" (a pooled state's change);
    #: None in reports written before units were recorded
    unit: str | None = None
    #: "exact" (None: written before the choice) — each head removed and the objective rerun — or
    #: "attribution": a first-order estimate for every head (attribution patching), exact for ``exact``
    method: str | None = None
    exact: list[Cell] | None = None


@dataclass
class HeadEvidence:
    """The test of one head's label: its measured value against what confirms it."""

    layer: int
    head: int
    label: str
    value: float
    threshold: float
    mark: str  # "confirmed" | "attention-only"
    #: the unit of ``value`` and ``threshold`` ("nats/token", "relative drop", "1 - cos"; "" in older reports)
    unit: str = ""
    #: the random-head baseline: the same measurement with each of ``baseline_heads`` other heads
    #: removed instead, its mean and standard deviation (``threshold`` is its upper bound)
    baseline_heads: int = 0
    baseline_mean: float | None = None
    baseline_sd: float | None = None


def _evidence_record(e: HeadEvidence) -> dict[str, Any]:
    """One tested head as JSON: the fields of older reports always, the baseline's when recorded."""
    record = {k: json_value(v) for k, v in dataclasses.asdict(e).items()}
    if not e.unit:
        del record["unit"]
    if not e.baseline_heads:  # no baseline drawn (a mean or sd of 0 is a measurement, kept)
        for name in ("baseline_heads", "baseline_mean", "baseline_sd"):
            del record[name]
    return record


@dataclass
class Evidence(Section):
    """Labels tested by intervention (:mod:`multihead.analysis.interventions.evidence`)."""

    name: ClassVar[str] = "evidence"
    tests: dict[str, str]
    syntax_texts: int
    probe: dict[str, Any]
    heads: list[HeadEvidence]

    def to_dict(self) -> dict[str, Any]:
        return {"tests": dict(self.tests), "syntax_texts": self.syntax_texts, "probe": json_value(self.probe),
                "heads": [_evidence_record(e) for e in self.heads]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Evidence:
        return cls(data["tests"], data["syntax_texts"], data["probe"], [HeadEvidence(**e) for e in data["heads"]])

    def marks(self) -> dict[Cell, str]:
        return {(e.layer, e.head): e.mark for e in self.heads}


@dataclass
class TypicalHead:
    layer: int
    head: int
    measure: str
    texts: list[list[float]]  # [text index, value, count], best first


@dataclass
class Typical(Section):
    """Each head's most typical corpus texts on its label's measure (:mod:`multihead.analysis.stats.typical`)."""

    name: ClassVar[str] = "typical"
    top: int
    min_tokens: int
    measures: dict[str, str]
    heads: list[TypicalHead]
    texts: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {"top": self.top, "min_tokens": self.min_tokens, "measures": dict(self.measures),
                "heads": [{"layer": h.layer, "head": h.head, "measure": h.measure, "texts": h.texts}
                          for h in self.heads], "texts": dict(self.texts)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Typical:
        return cls(data["top"], data["min_tokens"], data["measures"], [TypicalHead(**h) for h in data["heads"]],
                   data["texts"])


@dataclass
class Redundancy(Section):
    """Which heads do the same thing (:mod:`multihead.analysis.stats.redundancy`): (N, N) matrices
    over N = L·H heads (head n is layer n // H, head n % H), the most redundant pairs, clusters and
    the Ward groups."""

    name: ClassVar[str] = "redundancy"
    js_distance: Any  # (N, N) tensor or nested list
    cosine: Any
    pairs_js: list[tuple[Cell, Cell, float]]
    pairs_cosine: list[tuple[Cell, Cell, float]]
    clusters_js: list[list[Cell]]
    cluster_threshold: float
    groups_js: dict[str, Any] | None = None
    rows_js: int | None = None  # the query rows the JS distances average over
    rows_cosine: int | None = None  # ... and the cosines

    def to_dict(self) -> dict[str, Any]:
        out = {"js_distance": json_matrix(self.js_distance), "cosine": json_matrix(self.cosine),
               **{key: [{"a": list(a), "b": list(b), "value": json_number(v)} for a, b, v in getattr(self, key)]
                  for key in ("pairs_js", "pairs_cosine")},
               "clusters_js": [[list(x) for x in group] for group in self.clusters_js]}
        if self.groups_js:
            out["groups_js"] = {**self.groups_js, "groups": [[list(x) for x in g] for g in self.groups_js["groups"]]}
        out["cluster_threshold"] = self.cluster_threshold
        out["rows_js"] = self.rows_js
        if self.rows_cosine is not None:  # (a report from before it was kept has none: written back as it was)
            out["rows_cosine"] = self.rows_cosine
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Redundancy:
        groups = data.get("groups_js")
        return cls(data["js_distance"], data["cosine"],
                   *[[(tuple(p["a"]), tuple(p["b"]), p["value"]) for p in data[key]]
                     for key in ("pairs_js", "pairs_cosine")],
                   [[tuple(x) for x in group] for group in data["clusters_js"]], data["cluster_threshold"],
                   {**groups, "groups": [[tuple(x) for x in g] for g in groups["groups"]]} if groups else None,
                   data.get("rows_js"), data.get("rows_cosine"))

    def cosine_of(self, a: Cell, b: Cell, num_heads: int) -> float:
        return float(self.cosine[a[0] * num_heads + a[1]][b[0] * num_heads + b[1]])


#: every section type, in the order reports list them
SECTION_TYPES: tuple[type[Section], ...] = (Corpus, UnknownTokens, Images, LongContext, Retrieval, WhatIf, Induction,
                                            Coreference, Syntax, Ablation, Evidence, Typical, Redundancy)


@dataclass
class Sections:
    """A report's sections, each optional (None: not measured)."""

    corpus: Corpus | None = None
    unknown_tokens: UnknownTokens | None = None
    images: Images | None = None
    long_context: LongContext | None = None
    retrieval: Retrieval | None = None
    what_if: WhatIf | None = None
    induction: Induction | None = None
    coreference: Coreference | None = None
    syntax: Syntax | None = None
    ablation: Ablation | None = None
    evidence: Evidence | None = None
    typical: Typical | None = None
    redundancy: Redundancy | None = None
    #: sections of a newer multihead this one does not know, kept as they are
    other: dict[str, Any] = field(default_factory=dict)

    def present(self) -> list[Section]:
        return [s for s in (getattr(self, t.name) for t in SECTION_TYPES) if s is not None]

    def to_dict(self) -> dict[str, Any]:
        return {**{s.name: s.to_dict() for s in self.present()}, **self.other}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sections:
        known = {t.name: t for t in SECTION_TYPES}
        found: dict[str, Any] = {}
        other: dict[str, Any] = {}
        for name, value in data.items():
            if name in known:
                if not isinstance(value, dict):
                    raise ValueError(f"section {name!r} is a {type(value).__name__}, expected an object")
                try:
                    found[name] = known[name].from_dict(value)
                except (KeyError, TypeError) as err:
                    raise ValueError(f"section {name!r} is malformed ({err})") from err
            else:
                other[name] = value
        return cls(**found, other=other)
