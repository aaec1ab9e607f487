"""The texts and text files a user gives, read and checked: every problem one line naming the text,
the file or the flag (:class:`InputError`).

Nothing here needs torch, so the command line answers a missing or unreadable file at once, before
the model code loads; :mod:`multihead.inputs` re-exports these for the analyses.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["InputError", "check_texts", "read_lines", "read_text", "readable_file"]


class InputError(ValueError):
    """A problem with what the user gave (a file, a flag's value): one line naming it."""


def check_texts(texts: Sequence[str]) -> list[str]:
    """The texts as a list; ValueError/TypeError naming the first empty or non-string one."""
    if isinstance(texts, str):
        texts = [texts]
    texts = list(texts)
    if not texts:
        raise ValueError("no text to analyze: give at least one non-empty text")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"text {i + 1} is a {type(t).__name__}, expected str")
        if not t.strip():
            raise ValueError(f"text {i + 1} is empty or only whitespace")
    return texts


def readable_file(path: str | Path, flag: str) -> Path:
    """``path`` as a Path if it is a file; :class:`InputError` naming ``flag`` otherwise."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{flag} {p} is a folder, expected a file")
    if p.exists() and not p.is_file():  # a socket, a FIFO, a device: not a file to read text from
        raise InputError(f"{flag} {p} is not a regular file, expected a text file")
    if not p.is_file():
        raise InputError(f"{flag} {p}: no such file")
    if not os.access(p, os.R_OK):
        raise InputError(f"cannot read {flag} {p}: permission denied")
    return p


def read_text(path: str | Path, flag: str) -> str:
    """The whole of a UTF-8 text file given as ``flag``."""
    p = readable_file(path, flag)
    try:
        raw = p.read_bytes()
    except OSError as err:
        raise InputError(f"cannot read {flag} {p}: {err.strerror or err}") from err
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{flag} {p} is not UTF-8 text (byte {err.start})") from err


def read_lines(path: str | Path, flag: str = "--file") -> list[str]:
    """The non-empty lines of a UTF-8 text file given as ``flag``."""
    lines = [line.strip() for line in read_text(path, flag).splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        raise InputError(f"{flag} {path} has no non-empty line")
    return lines
