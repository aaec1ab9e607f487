"""Two reports side by side: base vs fine-tuned, dense vs pruned, checkpoint vs checkpoint.

``mh.compare(a, b)`` pairs every head of report A with one of report B and says what changed:

* **matching** — models of the same shape (layers x heads) are matched by index; otherwise by
  the similarity of their attention on the same corpus: each head is described by its profile of
  attention metrics (every metric both reports measured, except the ablation effects, each
  standardised over the heads of both models), and heads are paired to minimise the total
  Euclidean distance between profiles (the Hungarian algorithm, :func:`assignment`). Heads of the
  larger model left without a partner are listed as unmatched.
* **labels gained and lost** — pairs whose label differs (``previous`` → ``mixed``), and flags
  that appeared or went;
* **metric deltas** — B minus A for every metric of every pair, sorted by size in units of that
  metric's spread over A's heads (so an entropy change and a share change rank together);
* **heads that died or appeared** — with ablation effects in both reports: a head is *dead* when
  its ``zero_ablation`` effect is at most :data:`DEAD_SHARE` of the largest effect of its report
  (removing it changes nearly nothing), and *alive* when it is more than :data:`ALIVE_SHARE`;
  died = alive in A, dead in B; appeared = the reverse. Between the two it is neither: a head
  whose effect sits at the floor crosses it on rounding alone (SmolLM2 in float32 against
  float16: 17 heads "died" or "appeared" on one floor, 2 with the band). Each is named as its
  pair, ``A ~ B``. Of a report whose effects are first-order estimates but for the heads measured
  exactly (:func:`measured_heads`), only those: ablation changes, deaths and appearances are read
  between heads measured in both.

Only what compares is compared (:meth:`Comparison.excluded` says what was left out and why):

* reports whose ablation effects are in different units (one model's objective is a loss in
  nats/token, the other's 1 − cos of a pooled state) compare them only normalised — each head's
  effect as a share of its report's largest (``zero_ablation_share``, ``mean_ablation_share``);
* an encoder against a causal decoder leaves out the metrics whose meaning differs between them:
  ``next_token`` (always 0 under a causal mask), ``sep`` (separators vs end-of-sequence tokens that
  a decoder's texts rarely hold) and ``cls`` ([CLS] vs the first word, a decoder's sink).

Reports of different corpora describe different things: they are refused (each report records
its corpus: the number of texts and a SHA-256 of them) unless ``different_corpora=True``, and then
the comparison carries a warning that the CLI and the page show.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..progress import counted
from .report import Report
from .sections import unit_of

__all__ = ["ALIVE_SHARE", "CAUSAL_MEANING", "DEAD_SHARE", "SCHEMA", "Comparison", "assignment", "cell_name", "compare",
           "dead_heads", "excluded_metrics", "measured_heads", "pair_name", "same_parts"]

SCHEMA = "multihead.compare/1"
#: A head whose zero-ablation effect is at most this share of its report's largest is dead.
DEAD_SHARE = 0.01
#: ... and alive above this share: a head died or appeared only when it crossed the whole band.
ALIVE_SHARE = 0.02
#: Metrics that are not attention statistics (they measure the model's objective) stay out of profiles.
_NOT_ATTENTION = ("zero_ablation", "mean_ablation", "zero_ablation_share", "mean_ablation_share")
#: Metrics whose meaning differs between an encoder and a causal decoder, and why.
CAUSAL_MEANING = {"next_token": "always 0 under a causal mask",
                  "sep": "an encoder's [SEP] against end-of-sequence tokens a decoder's texts rarely hold",
                  "cls": "an encoder's [CLS] against a decoder's first word (its attention sink)"}

Cell = tuple[int, int]


@dataclass
class Comparison:
    """The heads of ``a`` paired with those of ``b`` and what changed between them."""

    a: Report
    b: Report
    a_name: str
    b_name: str
    #: "index" or "attention profile (Hungarian)"
    matching: str
    #: (head of A, head of B, profile distance — None when matched by index)
    pairs: list[tuple[Cell, Cell, float | None]]
    unmatched_a: list[Cell] = field(default_factory=list)
    unmatched_b: list[Cell] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def excluded(self) -> dict[str, str]:
        """{metric: why it is not compared} (see the module)."""
        return excluded_metrics(self.a, self.b)

    def _compared(self, report: Report, *, measured_only: bool = True) -> dict[Cell, dict[str, float]]:
        """Every head's metrics as compared: its ablation effects also as shares of its report's
        largest when the two reports' effects are in different units. ``measured_only``: a head whose
        effects are estimates (:func:`measured_heads`) without them — estimates still set the scales
        (the largest effect, a metric's spread), as every head's effect does."""
        out = {(r.layer, r.head): dict(r.metrics) for r in report.heads}
        if _units_differ(self.a, self.b):
            for name in ("zero_ablation", "mean_ablation"):
                largest = max((abs(v) for m in out.values() if math.isfinite(v := m.get(name, math.nan))), default=0.0)
                for metrics in out.values():
                    if name in metrics:
                        metrics[f"{name}_share"] = metrics[name] / largest if largest > 0 else math.nan
        measured = measured_heads(report)
        if measured_only and measured is not None:  # an estimate is not compared as if it were an effect
            for cell, metrics in out.items():
                if cell not in measured:
                    for name in ("zero_ablation", "mean_ablation", "zero_ablation_share", "mean_ablation_share"):
                        metrics.pop(name, None)
        return out

    def placements(self) -> tuple[str, str]:
        """Where A's and B's models ran (``Report.placement``, e.g. ``bfloat16 on cpu``) when the two
        differ — a bfloat16 run against a float32 one reads its metric changes as rounding — else ("", "")."""
        if self.a.placement == self.b.placement:
            return "", ""
        return self.a.placement, self.b.placement

    def label_changes(self) -> list[tuple[Cell, Cell, str, str]]:
        """(head of A, head of B, label in A, label in B) for every pair whose label differs in its parts —
        not in their order alone (:meth:`reordered`)."""
        return [(ca, cb, la, lb) for ca, cb, la, lb in self._labels() if not same_parts(la, lb)]

    def reordered(self) -> list[tuple[Cell, Cell, str, str]]:
        """The pairs whose labels have the same parts in another order (``self+sink`` → ``sink+self``: a
        combined label lists its parts by strength, and two parts of near-equal strength swap places on
        rounding — SmolLM2's L5.H2, self 0.457 against sink 0.455, in bfloat16 against float32)."""
        return [(ca, cb, la, lb) for ca, cb, la, lb in self._labels() if la != lb and same_parts(la, lb)]

    def _labels(self) -> list[tuple[Cell, Cell, str, str]]:
        return [(ca, cb, self.a.head(*ca).label, self.b.head(*cb).label) for ca, cb, _ in self.pairs]

    def flag_changes(self) -> list[tuple[Cell, Cell, list[str], list[str]]]:
        """(head of A, head of B, flags gained, flags lost) where the flags differ."""
        out = []
        for ca, cb, _ in self.pairs:
            fa, fb = set(self.a.head(*ca).flags), set(self.b.head(*cb).flags)
            if fa != fb:
                out.append((ca, cb, sorted(fb - fa), sorted(fa - fb)))
        return out

    def metric_deltas(self, limit: int | None = None) -> list[dict]:
        """Every (pair, metric) change, B − A, largest first in units of the metric's spread over A's
        heads: [{"a": cell, "b": cell, "metric", "before", "after", "delta", "spread_units"}]."""
        skip = self.excluded()
        names = [n for n in _common_metrics(self.a, self.b) if n not in skip]
        if _units_differ(self.a, self.b):
            names += [f"{n}_share" for n in ("zero_ablation", "mean_ablation") if n in skip]
        compared, compared_b = self._compared(self.a), self._compared(self.b)
        every = self._compared(self.a, measured_only=False)  # each metric's spread over all of A's heads
        spread = {n: _spread([m.get(n, math.nan) for m in every.values()]) for n in names}
        out = []
        for ca, cb, _ in self.pairs:
            ma, mb = compared[ca], compared_b[cb]
            for n in names:
                before, after = ma.get(n, math.nan), mb.get(n, math.nan)
                if math.isnan(before) or math.isnan(after):
                    continue
                delta = after - before
                out.append({"a": ca, "b": cb, "metric": n, "before": before, "after": after, "delta": delta,
                            "spread_units": delta / spread[n] if spread[n] > 0 else (0.0 if delta == 0 else math.inf)})
        out.sort(key=lambda d: -abs(d["spread_units"]))
        return out[:limit] if limit is not None else out

    def died(self) -> list[tuple[Cell, Cell]]:
        """Pairs alive in A and dead in B (by zero-ablation effect; empty without it in both; only
        heads whose effects were measured, not estimated, in both: :func:`measured_heads`; alive only
        where the report's interval of the effect, when it has one, leaves out zero)."""
        dead_b, not_alive_a = dead_heads(self.b), _not_alive(self.a)
        if not_alive_a is None or dead_b is None:
            return []
        return [(ca, cb) for ca, cb, _ in self._measured_pairs() if cb in dead_b and ca not in not_alive_a]

    def appeared(self) -> list[tuple[Cell, Cell]]:
        """Pairs dead in A and alive in B."""
        dead_a, not_alive_b = dead_heads(self.a), _not_alive(self.b)
        if dead_a is None or not_alive_b is None:
            return []
        return [(ca, cb) for ca, cb, _ in self._measured_pairs() if ca in dead_a and cb not in not_alive_b]

    def _measured_pairs(self) -> list[tuple[Cell, Cell, float | None]]:
        in_a, in_b = measured_heads(self.a), measured_heads(self.b)
        return [(ca, cb, d) for ca, cb, d in self.pairs
                if (in_a is None or ca in in_a) and (in_b is None or cb in in_b)]

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "a": {"name": self.a_name, "model": self.a.model, "shape": self._shape(self.a),
                                        "placement": self.a.placement},
                "b": {"name": self.b_name, "model": self.b.model, "shape": self._shape(self.b),
                      "placement": self.b.placement},
                "matching": self.matching, "warnings": self.warnings,
                "pairs": [{"a": list(ca), "b": list(cb), "distance": None if d is None else round(d, 6)}
                          for ca, cb, d in self.pairs],
                "unmatched_a": [list(c) for c in self.unmatched_a], "unmatched_b": [list(c) for c in self.unmatched_b],
                "excluded": self.excluded(),
                "label_changes": [{"a": list(ca), "b": list(cb), "before": la, "after": lb}
                                  for ca, cb, la, lb in self.label_changes()],
                "labels_reordered": [{"a": list(ca), "b": list(cb), "before": la, "after": lb}
                                     for ca, cb, la, lb in self.reordered()],
                "flag_changes": [{"a": list(ca), "b": list(cb), "gained": g, "lost": lost}
                                 for ca, cb, g, lost in self.flag_changes()],
                "died": [{"a": list(ca), "b": list(cb)} for ca, cb in self.died()],
                "appeared": [{"a": list(ca), "b": list(cb)} for ca, cb in self.appeared()],
                "metric_deltas": [{**d, "a": list(d["a"]), "b": list(d["b"]),
                                   **{k: _finite(d[k]) for k in ("before", "after", "delta", "spread_units")}}
                                  for d in self.metric_deltas(200)]}

    @staticmethod
    def _shape(report: Report) -> list[int]:
        return [report.num_layers, report.num_heads]


def compare(a: Report | str | Path, b: Report | str | Path, *, different_corpora: bool = False,
            matching: str = "auto") -> Comparison:
    """Compare two reports (or report.json paths / report folders); see the module.

    ``matching``: "auto" (by index when the shapes agree, else by attention profile), "index" or
    "profile". Raises ValueError when the reports describe different corpora (unless
    ``different_corpora``) or cannot be matched as asked."""
    (ra, na), (rb, nb) = _report(a, "A"), _report(b, "B")
    warnings = []
    problem = _corpus_problem(ra, rb)
    if problem:
        if not different_corpora:
            raise ValueError(f"the reports describe different corpora ({problem}); their heads cannot be compared "
                             "on the same texts — analyze both on the same texts, or compare anyway "
                             "(--different-corpora / different_corpora=True)")
        warnings.append(f"different corpora ({problem}): differences mix the models and the texts")
    if ra.placement and rb.placement and ra.placement.split(" on ")[0] != rb.placement.split(" on ")[0]:
        # a dtype apart: every metric moves by its rounding (SmolLM2 bfloat16 against float32: entropy up to 0.024)
        warnings.append(f"different precisions ({ra.placement} against {rb.placement}): differences include the "
                        "lower one's rounding")
    for name, report in ((na, ra), (nb, rb)):  # a model analysed with head gates acting (its placement says which)
        gated = re.search(r"\d+ heads? gated \([^)]*\)", report.placement or "")
        if gated:
            warnings.append(f"{name} was analysed with {gated.group()}: those heads were turned down in its run")
    others = sorted(set(ra.stacks) | set(rb.stacks))
    if others:  # an encoder-decoder's decoder and cross stacks: not compared yet, and said so
        warnings.append(f"only the {ra.stack} stacks are compared: the reports' {' and '.join(others)} stacks are "
                        "left out")
    for name, report in ((na, ra), (nb, rb)):
        measured = measured_heads(report)
        if measured is not None:
            warnings.append(f"{name}'s ablation effects are first-order estimates (attribution patching) but for "
                            f"{counted(len(measured), 'head')} measured exactly: ablation changes, deaths and "
                            "appearances are read only between heads measured in both")
    same_shape = (ra.num_layers, ra.num_heads) == (rb.num_layers, rb.num_heads)
    if matching not in ("auto", "index", "profile"):
        raise ValueError(f"matching must be 'auto', 'index' or 'profile'; got {matching!r}")
    if matching == "index" and not same_shape:
        raise ValueError(f"matching by index needs the same shape; A is {ra.num_layers} x {ra.num_heads}, "
                         f"B is {rb.num_layers} x {rb.num_heads}")
    cells_a = [(r.layer, r.head) for r in ra.heads]
    cells_b = [(r.layer, r.head) for r in rb.heads]
    if matching == "index" or (matching == "auto" and same_shape):
        return Comparison(ra, rb, na, nb, "index", [(c, c, None) for c in cells_a], warnings=warnings)
    names = [n for n in _common_metrics(ra, rb) if n not in _NOT_ATTENTION and n not in excluded_metrics(ra, rb)]
    if not names:
        raise ValueError("the reports share no attention metric to match heads by")
    pa, pb = _profiles(ra, names), _profiles(rb, names)  # (Na, M), (Nb, M)
    both = np.concatenate([pa, pb])
    centre, scale = np.nanmean(both, 0), np.nanstd(both, 0)
    scale[~(scale > 0)] = 1.0
    za, zb = np.nan_to_num((pa - centre) / scale), np.nan_to_num((pb - centre) / scale)
    cost = np.sqrt(((za[:, None, :] - zb[None, :, :]) ** 2).sum(-1))  # (Na, Nb)
    cols = assignment(cost)
    pairs = [(cells_a[i], cells_b[j], float(cost[i, j])) for i, j in enumerate(cols) if j >= 0]
    matched_b = {cb for _, cb, _ in pairs}
    matched_a = {ca for ca, _, _ in pairs}
    warnings.append(f"different shapes: heads matched by the similarity of their attention profiles over "
                    f"{len(names)} metrics (Hungarian algorithm), not by position")
    return Comparison(ra, rb, na, nb, "attention profile (Hungarian)", pairs,
                      [c for c in cells_a if c not in matched_a], [c for c in cells_b if c not in matched_b],
                      warnings)


def assignment(cost: np.ndarray) -> np.ndarray:
    """The rows' columns of a minimum-cost matching of a rectangular cost matrix (Na, Nb): an
    array (Na,) of column indices, -1 for rows left unmatched when Na > Nb. The Hungarian
    algorithm with potentials (shortest augmenting paths), O(n²·m), vectorised over columns."""
    cost = np.asarray(cost, dtype=np.float64)
    if cost.ndim != 2 or not np.isfinite(cost).all():
        raise ValueError(f"cost must be a finite 2-D matrix; got shape {cost.shape}")
    if cost.shape[0] > cost.shape[1]:
        cols_t = assignment(cost.T)  # (Nb,) rows of the transpose = columns
        out = np.full(cost.shape[0], -1)
        out[cols_t] = np.arange(cost.shape[1])
        return out
    n, m = cost.shape
    u, v = np.zeros(n + 1), np.zeros(m + 1)
    owner = np.zeros(m + 1, dtype=np.int64)  # owner[j]: the row (1-based) matched to column j, 0: none
    way = np.zeros(m + 1, dtype=np.int64)
    for i in range(1, n + 1):
        owner[0] = i
        j0 = 0
        minv = np.full(m + 1, np.inf)
        used = np.zeros(m + 1, dtype=bool)
        while True:  # grow a shortest augmenting path from row i
            used[j0] = True
            i0 = owner[j0]
            reduced = cost[i0 - 1] - u[i0] - v[1:]  # (m,)
            free = ~used[1:]
            better = free & (reduced < minv[1:])
            minv[1:][better] = reduced[better]
            way[1:][better] = j0
            candidates = np.where(free, minv[1:], np.inf)
            j1 = int(np.argmin(candidates)) + 1
            delta = candidates[j1 - 1]
            u[owner[used]] += delta
            v[used] -= delta
            minv[1:][free] -= delta
            j0 = j1
            if owner[j0] == 0:
                break
        while j0:  # flip the path
            j1 = way[j0]
            owner[j0] = owner[j1]
            j0 = j1
    out = np.full(n, -1)
    for j in range(1, m + 1):
        if owner[j]:
            out[owner[j] - 1] = j - 1
    return out


def _report(value: Report | str | Path, which: str) -> tuple[Report, str]:
    if isinstance(value, Report):
        return value, value.model
    path = Path(value)
    if path.is_dir():
        path = path / "report.json"
    if not path.is_file():
        raise ValueError(f"report {which}: {path} does not exist (give a report.json or the folder holding one)")
    return Report.from_json(path), str(value)


def _corpus_problem(a: Report, b: Report) -> str | None:
    ca, cb = a.sections.corpus, b.sections.corpus
    if ca and cb:
        if ca.sha256 != cb.sha256:
            return f"A read {ca.texts} texts, B {cb.texts} texts, with different contents"
        return None
    if a.sentences != b.sentences:
        return f"A read {a.sentences} texts, B {b.sentences}"
    return None


def _unit(report: Report) -> str | None:
    section = report.sections.ablation
    if section is None or section.skipped:
        return None
    return section.unit or unit_of(section.objective)  # reports written before units were recorded


def _units_differ(a: Report, b: Report) -> bool:
    ua, ub = _unit(a), _unit(b)
    return ua is not None and ub is not None and ua != ub


def excluded_metrics(a: Report, b: Report) -> dict[str, str]:
    """{metric: why} for the metrics of both reports that do not compare (see the module)."""
    out = {}
    if _units_differ(a, b):
        why = (f"ablation effects in different units ({_unit(a)} in A, {_unit(b)} in B): compared as shares of "
               f"each report's largest effect")
        out.update({name: why for name in ("zero_ablation", "mean_ablation")})
    if a.causal != b.causal:
        out.update({name: f"means different things in an encoder and a causal decoder: {why}"
                    for name, why in CAUSAL_MEANING.items()})
    return out


def _common_metrics(a: Report, b: Report) -> list[str]:
    first_a = a.heads[0].metrics if a.heads else {}
    first_b = set(b.heads[0].metrics) if b.heads else set()
    return [n for n in first_a if n in first_b]


def _profiles(report: Report, names: list[str]) -> np.ndarray:
    return np.array([[r.metrics.get(n, math.nan) for n in names] for r in report.heads], dtype=np.float64)


def _spread(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.std(finite)) if len(finite) > 1 else 0.0


def measured_heads(report: Report) -> set[Cell] | None:
    """The heads whose ablation effects were measured (each removed, the objective rerun) where the
    report's others are first-order estimates (attribution patching), else None: every effect is one."""
    section = report.sections.ablation
    if section is None or section.method != "attribution":
        return None
    return {tuple(cell) for cell in section.exact or []}


def dead_heads(report: Report, share: float = DEAD_SHARE) -> set[Cell] | None:
    """The heads whose zero-ablation effect is at most ``share`` of the report's largest (None without
    ablation effects); with :data:`ALIVE_SHARE`, the heads that are not alive. Of a report whose effects
    are mostly estimates, its measured heads alone (:func:`measured_heads`)."""
    measured = measured_heads(report)
    effects = {(r.layer, r.head): r.metrics.get("zero_ablation", math.nan) for r in report.heads}
    finite = [abs(v) for v in effects.values() if not math.isnan(v)]
    if not finite or measured == set():
        return None
    floor = share * max(finite)  # the largest of every head's effect, estimates too: one scale in both reports
    return {cell for cell, v in effects.items()
            if not math.isnan(v) and abs(v) <= floor and (measured is None or cell in measured)}


def _not_alive(report: Report) -> set[Cell] | None:
    """The heads that are not alive: an effect at most :data:`ALIVE_SHARE` of the report's largest, or
    one whose bootstrap interval over texts holds zero (the sign of its effect is not known: SmolLM2's
    L23.H1, −0.0075 in [−0.019, +0.003], "died" against a bfloat16 run of the same texts)."""
    low = dead_heads(report, ALIVE_SHARE)
    if low is None:
        return None
    spans = {(r.layer, r.head): r.intervals.get("zero_ablation") for r in report.heads}
    unsure = {cell for cell, span in spans.items() if span is not None and span[0] <= 0 <= span[1]}
    return low | unsure


def same_parts(a: str, b: str) -> bool:
    """Whether two labels are made of the same parts (``self+sink``, ``sink+self``)."""
    return sorted(a.split("+")) == sorted(b.split("+"))


def cell_name(cell: Cell) -> str:
    return f"L{cell[0]}.H{cell[1]}"


def pair_name(a: Cell, b: Cell) -> str:
    """A matched pair as people read it: ``L3.H2`` (the same head) or ``L3.H2 ~ L5.H1``."""
    return cell_name(a) if a == b else f"{cell_name(a)} ~ {cell_name(b)}"


def _finite(value: float) -> float | None:
    return None if not math.isfinite(value) else round(float(value), 6)
