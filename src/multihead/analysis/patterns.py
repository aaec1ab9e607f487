"""A label for every head, and flags for degenerate ones, from documented thresholds.

Labels are tried in this order; the first whose rule holds wins:

| label | rule (token-weighted means, see :mod:`.metrics`) |
|---|---|
| ``self`` | ``self >= 0.5`` |
| ``previous`` | ``previous_token >= 0.5`` |
| ``next`` | ``next_token >= 0.5`` |
| ``special-token`` | ``cls + sep >= 0.6`` |
| ``broad`` | ``entropy_norm >= 0.85`` (close to uniform over the visible keys) |
| ``local`` | ``local >= 0.7`` (after ``broad``: on short sentences a uniform head is local too) |
| ``mixed`` | none of the above |

Flags (several may hold): ``self-only`` (``self >= 0.9``), ``uniform`` (``entropy_norm >= 0.95``),
``stuck-on-sep`` (``sep >= 0.8``), ``stuck-on-first`` (``cls >= 0.9``).
"""

from __future__ import annotations

import math

__all__ = ["FLAG_RULES", "LABEL_RULES", "flags_for", "label_for"]

LABEL_RULES: tuple[tuple[str, str, float], ...] = (
    ("self", "self", 0.5),
    ("previous", "previous_token", 0.5),
    ("next", "next_token", 0.5),
    ("special-token", "cls+sep", 0.6),
    ("broad", "entropy_norm", 0.85),
    ("local", "local", 0.7),
)

FLAG_RULES: tuple[tuple[str, str, float], ...] = (
    ("self-only", "self", 0.9),
    ("uniform", "entropy_norm", 0.95),
    ("stuck-on-sep", "sep", 0.8),
    ("stuck-on-first", "cls", 0.9),
)


def _value(metrics: dict[str, float], key: str) -> float:
    total = sum(metrics.get(k, math.nan) for k in key.split("+"))
    return -math.inf if math.isnan(total) else total


def label_for(metrics: dict[str, float]) -> str:
    """The head's pattern label (see the table above)."""
    for label, key, threshold in LABEL_RULES:
        if _value(metrics, key) >= threshold:
            return label
    return "mixed"


def flags_for(metrics: dict[str, float]) -> list[str]:
    """Degenerate-head flags that hold for these metrics."""
    return [flag for flag, key, threshold in FLAG_RULES if _value(metrics, key) >= threshold]
