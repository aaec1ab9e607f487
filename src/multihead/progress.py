"""Progress on stderr for long work: on a terminal a bar where the amount of work is known (with
its time left), a line per step otherwise; in a pipe or a log, lines only — one when a step starts,
one when it ends, and for counted work a line at most every :data:`EVERY` seconds with the time
left. Quiet unless asked for (the CLI asks unless ``--quiet`` is given), so libraries stay clean.

Off a terminal the lines of a run's first :data:`HOLD` seconds are held back and written once it
passes them — at that moment, not with the next line, which for a long pass may be many minutes
away: a command that fails at once on bad input says so in its one error line, a quick command
writes nothing but its output, and a log (a batch job's) shows a long run's plan and steps as
they happen. A warning (:func:`warn`: advice that may change what the user does, such as a dtype slower
than float32 on this CPU) is never held back: it is written at once, after the lines held before it."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from tqdm.auto import tqdm

__all__ = ["EVERY", "HOLD", "bar", "counted", "enabled", "note", "set_enabled", "step", "warn"]

T = TypeVar("T")

#: Off a terminal: seconds between two lines of counted work, and seconds of a run held back.
EVERY, HOLD = 30.0, 10.0

_state: dict[str, Any] = {"on": False, "terminal": True, "since": 0.0, "held": [], "release": None}
#: the held lines are written by the main thread or by the timer that releases them, never both at once
_lock = threading.Lock()


def set_enabled(on: bool, *, terminal: bool | None = None) -> None:
    """Show progress (True) or stay quiet (False) from now on, for every step and bar.
    ``terminal``: stderr is a terminal (bars) or not (lines, the first :data:`HOLD` seconds held
    back); default: ask stderr."""
    with _lock:
        if _state["release"] is not None:
            _state["release"].cancel()
        _state.update(on=bool(on), terminal=sys.stderr.isatty() if terminal is None else bool(terminal),
                      since=time.perf_counter(), held=[], release=None)


def _say(line: str, *, hold: bool = True) -> None:
    """Write one progress line (held back during a run's first seconds off a terminal, where ``hold``)."""
    with _lock:
        waited = time.perf_counter() - _state["since"]
        if hold and not _state["terminal"] and waited < HOLD:
            _state["held"].append(line)
            if _state["release"] is None:  # written when HOLD passes, whether or not another line comes
                _state["release"] = threading.Timer(HOLD - waited, _release)
                _state["release"].daemon = True  # a run that ends first exits with its lines held
                _state["release"].start()
            return
        _write_held()
        _print_err(line)


def _release() -> None:
    with _lock:
        _write_held()


def _write_held() -> None:
    for earlier in _state["held"]:
        _print_err(earlier)
    _state["held"] = []


def _print_err(line: str) -> None:
    """One line on stderr; none where stderr is gone (its terminal closed: EIO, before the SIGHUP
    that stops the run is handled) — a progress line lost never stops the run."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def enabled(progress: bool | None = None) -> bool:
    """``progress`` when given, else the global setting."""
    return _state["on"] if progress is None else bool(progress)


def bar(items: Iterable[T], *, desc: str, unit: str = "it", progress: bool | None = None,
        **options: Any) -> Iterable[T]:
    """``items``, with a tqdm bar on stderr while progress is shown on a terminal (``options`` go to
    tqdm), lines with the time left off one."""
    weights = options.pop("weights", None)
    if enabled(progress) and not _state["terminal"]:
        return _lines(items, desc, unit, options.get("total"), options.get("initial", 0), weights)
    return tqdm(items, desc=desc, unit=unit, disable=not enabled(progress), file=sys.stderr, leave=False,
                dynamic_ncols=True, **options)


def _lines(items: Iterable[T], desc: str, unit: str, total: int | None, initial: int = 0,
           weights: list[float] | None = None) -> Iterator[T]:
    """``items``, saying how far along they are in a line every :data:`EVERY` seconds, and when done;
    ``initial``: how many of ``total`` were done before (a resumed run's steps); ``weights``: each
    item's share of the work, where they differ (batches shortest first: a count's estimate of the
    time left was half the time the longer last ones took)."""
    if total is None:
        total = len(items) if hasattr(items, "__len__") else None  # type: ignore[arg-type]
    start = last = time.perf_counter()
    of = f" of {total}" if total else ""
    noun = "item" if unit == "it" else unit
    _say(f"multihead: {desc}: {counted(total, noun) if total else 'some ' + _plural(noun)} …")
    done = initial
    for item in items:
        yield item
        done += 1
        now = time.perf_counter()
        if now - last >= EVERY and (total is None or done < total):
            if weights is not None and len(weights) == total and sum(weights[initial:done]) > 0:
                rate = (now - start) / sum(weights[initial:done])  # seconds a unit of work
                remaining = sum(weights[done:])
            else:
                rate, remaining = (now - start) / (done - initial), (total or 0) - done  # seconds an item
            left = f", about {_duration(rate * remaining)} left" if total else ""
            _say(f"multihead: {desc}: {done}{of} {_plural(unit)} in {_duration(now - start)}{left}")
            last = now
    _say(f"multihead: {desc}: done in {_duration(time.perf_counter() - start)}")


@contextmanager
def step(what: str, *, progress: bool | None = None) -> Iterator[None]:
    """Say on stderr that ``what`` (e.g. "loading minilm") is under way, and how long it took."""
    if not enabled(progress):
        yield
        _stop_if_interrupted()
        return
    start = time.perf_counter()
    _say(f"multihead: {what} …")
    yield
    _stop_if_interrupted()
    seconds = time.perf_counter() - start
    if seconds >= 1:
        _say(f"multihead: {what}: done in {seconds:.1f} s")


def note(what: str, *, progress: bool | None = None) -> None:
    """Say ``what`` on stderr, one line, when progress is on."""
    if enabled(progress):
        _say(f"multihead: {what}")


def warn(what: str, *, progress: bool | None = None) -> None:
    """Say ``what`` on stderr, one line, when progress is on — at once, also off a terminal in a run's
    first seconds (advice a quick run's pipe or log must not lose), after the lines held before it."""
    if enabled(progress):
        _say(f"multihead: {what}", hold=False)


def _stop_if_interrupted() -> None:
    """Raise KeyboardInterrupt if the user interrupted during the step (even if a library swallowed it)."""
    from .stops import interrupted

    if interrupted.is_set():
        raise KeyboardInterrupt


def _plural(unit: str) -> str:
    return {"batch": "batches", "patch": "patches", "it": "items"}.get(unit, unit + "s")


def counted(n: int, noun: str) -> str:
    """``n`` and the noun in its number: ``counted(1, "text")`` is "1 text", ``counted(3, "batch")``
    "3 batches", ``counted(5170, "token")`` "5,170 tokens" (thousands grouped, as the report's other
    counts are)."""
    return f"{n:,} {noun if n == 1 else _plural(noun)}"
