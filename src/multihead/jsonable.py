"""JSON in and out: numbers rounded, NaN (a metric that could not be measured) as ``null``; files
read with a depth limit, so a JSON bomb is one line, never a RecursionError."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path
from typing import Any

__all__ = ["MAX_DEPTH", "json_depth", "json_matrix", "json_number", "json_value", "read_json"]

#: The deepest nesting a file of ours may have (a report nests 6 levels; deeper is not ours).
MAX_DEPTH = 32


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


def read_json(path: str | Path, what: str) -> Any:
    """The JSON value in ``path``; ValueError (one line naming the file) when it is not UTF-8 JSON
    or nests deeper than :data:`MAX_DEPTH` (a JSON bomb stays one line, never a RecursionError)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror or err}") from err
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not {what}: not UTF-8 text (byte {err.start})") from err
    if not text.strip():
        raise ValueError(f"{path} is not {what}: the file is empty")
    if json_depth(text) > MAX_DEPTH:
        raise ValueError(f"{path} is not {what}: its JSON nests deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not {what}: not JSON ({err.msg}, line {err.lineno})") from err
    except RecursionError as err:  # pragma: no cover - the depth check comes first
        raise ValueError(f"{path} is not {what}: its JSON nests too deep") from err


def json_depth(text: str) -> int:
    """The deepest bracket nesting of a JSON text (brackets inside strings do not count)."""
    brackets = _BRACKETS.sub("", _STRINGS.sub("", text))
    return max(itertools.accumulate(1 if ch in "[{" else -1 for ch in brackets), default=0)


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[^\[\]{}]")
