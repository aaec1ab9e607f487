"""The transformers versions multihead runs with, checked where a model of theirs comes in."""

from __future__ import annotations

import re

__all__ = ["OLDEST_TRANSFORMERS", "require_transformers"]

#: The oldest transformers the whole suite has passed with (2026-12-04: 5.17, a GPU machine's, and
#: 5.25, the project's). Older ones miss what the routing registers with — 4.48 has no
#: ``AttentionInterface``, 4.52 no ``masking_utils`` — or name their modules otherwise: with 4.57.6,
#: 38 of 123 tests of five loading, routing and streaming files failed or erred (BERT's attention
#: not found to swap, among others).
OLDEST_TRANSFORMERS = (5, 17)


def require_transformers() -> None:
    """Raise ImportError, one line, when the installed transformers is older than
    :data:`OLDEST_TRANSFORMERS` (it would fail later, and less plainly)."""
    import transformers

    found = transformers.__version__
    if _release(found) < OLDEST_TRANSFORMERS:
        oldest = ".".join(map(str, OLDEST_TRANSFORMERS))
        raise ImportError(f"multihead needs transformers >= {oldest} (the oldest its tests pass with); this "
                          f"environment has {found}: pip install -U 'transformers>={oldest}'")


def _release(version: str) -> tuple[int, ...]:
    """(major, minor) of a version string such as '5.17.0' or '5.18.0.dev0'."""
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])
