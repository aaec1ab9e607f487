"""Stopping a run: SIGINT (Ctrl-C), SIGTERM (a scheduler, ``kill``) and SIGHUP (the terminal or
the SSH session closed) end it the same way.

Each signal raises :class:`KeyboardInterrupt` in the main thread and sets :data:`interrupted`,
so staged results are never committed (:mod:`multihead.files`) — even when a library swallows
the KeyboardInterrupt on its way up — and the command ends with one line and the exit status a
shell gives that signal (:func:`stopped`). A signal the run was started with ignored stays
ignored: ``nohup multihead analyze …`` goes on when its terminal closes.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["STOPS", "end_rank", "interrupted", "stopped", "stopping_on_signals"]

#: What each stopping signal is called, and the exit status it gives (128 + its number, as a shell says).
STOPS = {signal.SIGINT: ("interrupted", 130), signal.SIGTERM: ("terminated (SIGTERM)", 143)}
if hasattr(signal, "SIGHUP"):  # POSIX (Windows has none)
    STOPS[signal.SIGHUP] = ("hung up (SIGHUP)", 129)

#: Set when the user asked to stop.
interrupted = threading.Event()
_stopped_by: list[int] = []


def _on_stop(signum: int, frame: object) -> None:
    # Remembered as well as raised: a library that swallows the KeyboardInterrupt (some do, while
    # importing) cannot make the run go on to write its results.
    _stopped_by.append(signum)
    interrupted.set()
    raise KeyboardInterrupt


@contextmanager
def stopping_on_signals() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP stop the block (main thread only; elsewhere the block runs as it
    is), each one not ignored when the block starts (``nohup``, a shell's background job); the
    previous handlers, and a clear :data:`interrupted`, afterwards."""
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.signal(sig, _on_stop) for sig in STOPS if signal.getsignal(sig) != signal.SIG_IGN}
    try:
        yield
    finally:
        interrupted.clear()
        _stopped_by.clear()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def stopped() -> tuple[str, int]:
    """The words for the signal that stopped the run, and its exit status (Ctrl-C when none was seen)."""
    return STOPS[_stopped_by[0] if _stopped_by else signal.SIGINT]


def end_rank(code: int) -> int:
    """Leave a ``torchrun`` rank with ``code`` without finalising the interpreter; return ``code``
    unchanged in a single process.

    Why: DTensor's sharding caches keep FSDP's process group alive until the interpreter is torn
    down, and a gloo worker thread may still be dropping its last all-gather (whose tensors belong
    to Python) at that moment; it cannot take the GIL of a finalising interpreter and the process
    dies in ``std::terminate`` (seen once in ~25 two-rank runs on a loaded CPU, traced with gdb).
    Everything a run writes is closed and renamed before the final barrier, so skipping the
    teardown loses nothing; stdout and stderr are flushed first.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return code
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`torchrun … | head`) or stream: the exit still comes
            pass
    os._exit(code)
