"""Progress on stderr for long work: a bar where the amount of work is known, a line per step
otherwise. Quiet unless asked for (the CLI asks when stderr is a terminal and ``--quiet`` is not
given), so libraries, pipes and logs stay clean."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from tqdm.auto import tqdm

__all__ = ["bar", "enabled", "set_enabled", "step"]

T = TypeVar("T")

_state = {"on": False}


def set_enabled(on: bool) -> None:
    """Show progress (True) or stay quiet (False) from now on, for every step and bar."""
    _state["on"] = bool(on)


def enabled(progress: bool | None = None) -> bool:
    """``progress`` when given, else the global setting."""
    return _state["on"] if progress is None else bool(progress)


def bar(items: Iterable[T], *, desc: str, unit: str = "it", progress: bool | None = None,
        **options: Any) -> Iterable[T]:
    """``items``, with a tqdm bar on stderr while progress is shown (``options`` go to tqdm)."""
    return tqdm(items, desc=desc, unit=unit, disable=not enabled(progress), file=sys.stderr, leave=False,
                dynamic_ncols=True, **options)


@contextmanager
def step(what: str, *, progress: bool | None = None) -> Iterator[None]:
    """Say on stderr that ``what`` (e.g. "loading minilm") is under way, and how long it took."""
    if not enabled(progress):
        yield
        _stop_if_interrupted()
        return
    start = time.perf_counter()
    print(f"multihead: {what} …", file=sys.stderr, flush=True)
    yield
    _stop_if_interrupted()
    seconds = time.perf_counter() - start
    if seconds >= 1:
        print(f"multihead: {what}: done in {seconds:.1f} s", file=sys.stderr, flush=True)


def note(what: str, *, progress: bool | None = None) -> None:
    """Say ``what`` on stderr, one line, when progress is on."""
    if enabled(progress):
        print(f"multihead: {what}", file=sys.stderr, flush=True)


def _stop_if_interrupted() -> None:
    """Raise KeyboardInterrupt if the user interrupted during the step (even if a library swallowed it)."""
    from .stops import interrupted

    if interrupted.is_set():
        raise KeyboardInterrupt
