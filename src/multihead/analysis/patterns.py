"""A label for every head, and flags for degenerate ones, from documented thresholds.

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

__all__ = ["COREFERENCE_RULE", "FLAG_RULES", "LABEL_RULES", "SYNTAX_RULE", "flags_for", "label_for"]

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
