"""Python's garbage collector around heavy work: the objects alive before it kept out of its scans."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["old_objects_frozen"]

#: bodies of :func:`old_objects_frozen` running now, the outermost of which froze the heap
_nested = 0


@contextmanager
def old_objects_frozen() -> Iterator[None]:
    """For the body, Python's garbage collections scan only the objects it makes: those alive
    before it — a model's modules, the imports of torch, transformers and spaCy, some 450,000
    objects — wait in the permanent generation (``gc.freeze``) until the outermost such body ends.
    A body inside another freezes what is alive at its start too (a model loaded since, a parser).

    Every full collection walks every tracked object: 0.24 s each over those (AMD EPYC), set off
    whenever the body's own allocations tip the collector's counts — an eighth of a bfloat16
    SmolLM2 analysis of 1k tokens when it happens; a SmolLM2 document's ``multihead analyze`` spent
    1.3 s of 25 in them. A process that froze objects itself keeps its own arrangement: nothing is
    frozen or let go here."""
    global _nested
    if _nested:  # inside one of ours: what is alive now joins what it froze, let go when it ends
        gc.freeze()
        yield
        return
    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    _nested += 1
    try:
        yield
    finally:
        _nested -= 1
        gc.unfreeze()  # back into the oldest generation: collected as before, once garbage
