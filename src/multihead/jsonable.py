"""Numbers for JSON: rounded, and NaN (a metric that could not be measured) as ``null``."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["json_matrix", "json_number", "json_value"]


def json_number(v: float | None, digits: int = 6, *, significant: bool = False) -> float | None:
    """``v`` rounded to ``digits`` decimals (or significant digits); None for None or NaN (JSON has no NaN)."""
    if v is None:
        return None
    v = float(v)
    if math.isnan(v):
        return None
    return float(f"{v:.{digits}g}") if significant else round(v, digits)


def json_matrix(m: Any, digits: int = 4, *, significant: bool = False) -> list[list[float | None]]:
    """A 2-D tensor or nested list as rows of :func:`json_number`."""
    rows = m.tolist() if hasattr(m, "tolist") else m
    return [[json_number(x, digits, significant=significant) for x in row] for row in rows]


def json_value(value: Any, digits: int = 6) -> Any:
    """Any nesting of dicts, lists, tensors and floats made JSON-ready (2-D tensors via :func:`json_matrix`)."""
    if hasattr(value, "tolist"):
        return json_matrix(value) if getattr(value, "dim", lambda: 0)() == 2 else json_value(value.tolist(), digits)
    if isinstance(value, dict):
        return {k: json_value(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v, digits) for v in value]
    if isinstance(value, float):
        return json_number(value, digits)
    return value
