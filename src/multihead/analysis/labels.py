"""Labels, flags, thresholds, marks and their words — defined once, read by every renderer.

A label for every head, and flags for degenerate ones, from documented thresholds; the labels
of cross-attention and vision heads; the marks of tested labels (✓ / ~); the short code of each
label for maps; its colour; the words of the legend; the long-context thresholds.

Labels are tried in this order; the first whose rule holds wins:

| label | rule (token-weighted means, see :mod:`.metrics`; probes in :mod:`.induction`, |
|  | :mod:`.syntax`, :mod:`.coreference`) |
|---|---|
| ``induction`` | ``induction >= 0.3`` (causal models; the repeated-random-tokens probe) |
| ``self`` | ``self >= 0.5`` |
| ``previous`` | ``previous_token >= 0.5`` |
| ``next`` | ``next_token >= 0.5`` |
| ``syntactic:<rel>`` | for some relation seen ≥ 30 times: accuracy ≥ 0.5 and ≥ its fixed-offset |
|  | baseline + 0.15 (the relation with the largest margin is named) |
| ``coreference`` | ``coreference >= 0.7`` and ≥ the nearest-mention baseline + 0.15 |
| ``special-token`` | ``cls + sep >= 0.6`` |
| ``broad`` | ``entropy_norm >= 0.85`` (close to uniform over the visible keys) |
| ``local`` | ``local >= 0.7`` (after ``broad``: on short sentences a uniform head is local too) |
| ``mixed`` | none of the above |

Syntax comes before special-token on purpose: Clark et al. found heads that put most of their
weight on [SEP] yet, whenever they look at a word, look at its syntactic governor.

Flags (several may hold): ``self-only`` (``self >= 0.9``), ``uniform`` (``entropy_norm >= 0.95``),
``stuck-on-sep`` (``sep >= 0.8``), ``stuck-on-first`` (``cls >= 0.9``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["COREFERENCE_RULE", "CROSS_RULES", "FLAG_RULES", "LABEL_COLOURS", "LABEL_RULES", "MARKS", "MARK_WORDS",
           "PATCH_RULES", "SINK_HEAD", "SYNTAX_RULE", "WINDOW_KEPT", "colour_of", "cross_label", "flags_for",
           "label_codes", "label_for", "legend", "patch_label"]

#: (label, metric or sum of metrics, threshold) — the simple rules, in order.
LABEL_RULES: tuple[tuple[str, str, float], ...] = (
    ("induction", "induction", 0.3),
    ("self", "self", 0.5),
    ("previous", "previous_token", 0.5),
    ("next", "next_token", 0.5),
    # syntactic:<rel> and coreference are tried here (they need a baseline)
    ("special-token", "cls+sep", 0.6),
    ("broad", "entropy_norm", 0.85),
    ("local", "local", 0.7),
)
_BEFORE_PROBES = 4  # rules tried before syntax and coreference

#: min relation count, min accuracy, min margin over the fixed-offset baseline
SYNTAX_RULE = (30, 0.5, 0.15)
#: min accuracy, min margin over the nearest-mention baseline
COREFERENCE_RULE = (0.7, 0.15)

FLAG_RULES: tuple[tuple[str, str, float], ...] = (
    ("self-only", "self", 0.9),
    ("uniform", "entropy_norm", 0.95),
    ("stuck-on-sep", "sep", 0.8),
    ("stuck-on-first", "cls", 0.9),
)


def _value(metrics: dict[str, float], key: str) -> float:
    total = sum(metrics.get(k, math.nan) for k in key.split("+"))
    return -math.inf if math.isnan(total) else total


def label_for(metrics: dict[str, float], *, syntax: dict[str, tuple[float, float, int]] | None = None,
              coreference_baseline: float | None = None) -> str:
    """The head's pattern label (see the table above).

    ``syntax`` maps relation -> (this head's accuracy, baseline accuracy, count);
    ``coreference_baseline`` is the nearest-mention accuracy on the same examples.
    """
    for label, key, threshold in LABEL_RULES[:_BEFORE_PROBES]:
        if _value(metrics, key) >= threshold:
            return label
    if syntax:
        min_count, min_acc, margin = SYNTAX_RULE
        best = max(((acc - base, rel) for rel, (acc, base, n) in syntax.items()
                    if n >= min_count and acc >= min_acc and acc - base >= margin), default=None)
        if best is not None:
            return f"syntactic:{best[1]}"
    if coreference_baseline is not None:
        min_acc, margin = COREFERENCE_RULE
        acc = _value(metrics, "coreference")
        if acc >= min_acc and acc >= coreference_baseline + margin:
            return "coreference"
    for label, key, threshold in LABEL_RULES[_BEFORE_PROBES:]:
        if _value(metrics, key) >= threshold:
            return label
    return "mixed"


def flags_for(metrics: dict[str, float]) -> list[str]:
    """Degenerate-head flags that hold for these metrics."""
    return [flag for flag, key, threshold in FLAG_RULES if _value(metrics, key) >= threshold]


# --------------------------------------------------------------------------- other stacks

#: Cross-attention labels, first match: (label, metric, threshold) (:mod:`multihead.analysis.stats.cross`).
CROSS_RULES: tuple[tuple[str, str, float], ...] = (
    ("source-special", "source_special", 0.5),
    ("aligned", "aligned", 0.5),
    ("broad", "entropy_norm", 0.8),
)
#: Vision-head labels, first match (:mod:`multihead.analysis.stats.patches`).
PATCH_RULES: tuple[tuple[str, str, float], ...] = (
    ("cls", "cls", 0.5),
    ("self", "self", 0.5),
    ("local", "local_3x3", 0.5),
    ("broad", "entropy_norm", 0.8),
)


def _first_rule(metrics: dict[str, float], rules: tuple[tuple[str, str, float], ...]) -> str:
    for label, key, threshold in rules:
        value = metrics.get(key, math.nan)
        if not math.isnan(value) and value >= threshold:
            return label
    return "mixed"


def cross_label(metrics: dict[str, float]) -> str:
    """The label of a cross-attention head (:data:`CROSS_RULES`, else ``mixed``)."""
    return _first_rule(metrics, CROSS_RULES)


def patch_label(metrics: dict[str, float]) -> str:
    """The label of a vision head (:data:`PATCH_RULES`, else ``mixed``)."""
    return _first_rule(metrics, PATCH_RULES)


# --------------------------------------------------------------------------- long context

#: A head is an attention sink when at least this share of its attention is on the first token.
SINK_HEAD = 0.5
#: A window of ±256 with 4 sinks "keeps" a head when the two together hold at least this share.
WINDOW_KEPT = 0.95


# --------------------------------------------------------------------------- marks, codes, colours, words

#: How a tested label is marked after its code (the ``evidence`` section's ``mark``).
MARKS = {"confirmed": "✓", "attention-only": "~"}
#: What each mark means.
MARK_WORDS = {"confirmed": "confirmed: removing the head weakens what its label names",
              "attention-only": "attention-only: it looks that way, but the behaviour does not need it"}

_SHORT = {"induction": "IND", "coreference": "COREF",
          "self": "SELF", "previous": "PREV", "next": "NEXT", "special-token": "SPEC", "local": "LOCL",
          "broad": "BRD", "mixed": "·", "aligned": "ALGN", "source-special": "SSPEC", "cls": "CLS"}

#: background colour of each label (syntactic labels share one)
LABEL_COLOURS = {
    "induction": "#f4a582", "coreference": "#b2abd2", "self": "#fddbc7", "previous": "#92c5de",
    "next": "#d1e5f0", "special-token": "#e0e0e0", "broad": "#fff7bc", "local": "#c7e9c0",
    "mixed": "#ffffff", "syntactic": "#a6dba0",
}

#: What each label says a head does, in words (the legends of the page and the static report).
LABEL_WORDS = {"induction": "attends to the token after an earlier copy of the current one (induction probe)",
               "self": "attends to its own position", "previous": "attends to the previous token",
               "next": "attends to the next token", "special-token": "attends to [CLS]/[SEP] (or BOS/EOS)",
               "broad": "spreads its attention widely (normalised entropy)", "local": "attends within ±2 tokens"}


def colour_of(label: str) -> str:
    return LABEL_COLOURS.get(label.split(":")[0], "#ffffff")


def label_codes(labels: Iterable[str], width: int = 7) -> dict[str, str]:
    """A short, unique code per label for maps: IND, PREV, ... for the pattern labels; the relation
    for ``syntactic:REL`` (its direction mark ``>`` always kept, long names cut and numbered where
    two would collide). The legend maps each code back to its label."""
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


def legend() -> dict[str, dict[str, str]]:
    """Each label's and flag's rule in words, from the rules themselves, and the labels' colours."""
    words = {label: f"{LABEL_WORDS.get(label, label)}: {key} ≥ {threshold}" for label, key, threshold in LABEL_RULES}
    n, acc, margin = SYNTAX_RULE
    words["syntactic:REL"] = (f"the dependent attends to its governor for relation REL (REL>: the governor to "
                              f"its dependents): seen ≥ {n} times, accuracy ≥ {acc} and ≥ the best fixed offset "
                              f"+ {margin}")
    words["coreference"] = (f"a pronoun attends to its antecedent: accuracy ≥ {COREFERENCE_RULE[0]} and ≥ the "
                            f"nearest-mention baseline + {COREFERENCE_RULE[1]}")
    words["mixed"] = "none of the rules above holds"
    flags = {flag: f"{key} ≥ {threshold}" for flag, key, threshold in FLAG_RULES}
    return {"legend": words, "flag_legend": flags, "colours": dict(LABEL_COLOURS), "marks": dict(MARKS),
            "mark_words": dict(MARK_WORDS)}
