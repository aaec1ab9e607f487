"""Writing files so that nothing the user had is lost: every file is written beside its target and
renamed over it, so an interrupted write leaves the earlier file whole; output folders are checked
before anything is written into them."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["OutputFolderError", "StagedFiles", "atomic_path", "check_output_folder", "interrupted",
           "write_atomically"]


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed over ``path`` when the block ends
    without an exception, removed otherwise (``path`` itself is then untouched)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_atomically(path: str | Path, content: str | bytes, *, newline: bool = True) -> Path:
    """Write ``content`` (text as UTF-8, with a final newline unless ``newline=False``) to ``path`` atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        if isinstance(content, bytes):
            tmp.write_bytes(content)
        else:
            if newline and not content.endswith("\n"):
                content += "\n"
            tmp.write_text(content, encoding="utf-8")
    return path


class OutputFolderError(ValueError):
    """An output folder that cannot be written safely (not a folder, foreign content, not writable)."""


def check_output_folder(out: str | Path, *, schema: str, marker: str, force: bool = False,
                        also: tuple[str, ...] = ()) -> Path:
    """``out`` as a Path, after checking that writing results there loses nothing of the user's.

    Accepted: a folder that does not exist yet, an empty one, or one holding an earlier result of
    ours (its ``marker`` file, JSON with this ``schema`` or one of the earlier schemas ``also``);
    anything else only with ``force``.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputFolderError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        try:
            ours = json.loads((out / marker).read_text(encoding="utf-8")).get("schema") in (schema, *also)
        except (OSError, ValueError, AttributeError):
            ours = False
        if not ours:
            raise OutputFolderError(f"{out} is not empty and holds no earlier multihead {marker}; choose another "
                                    "folder or force writing into it (--force)")
    probe = out if out.is_dir() else next((p for p in out.parents if p.exists()), None)
    if probe is None or not os.access(probe, os.W_OK):
        raise OutputFolderError(f"{out} is not writable")
    return out


#: Set (by the CLI's interrupt handler) when the user asked to stop: staged files are then never
#: committed, even if a library swallowed the KeyboardInterrupt on its way up.
interrupted = threading.Event()


class StagedFiles:
    """Several files that replace their targets together or not at all.

    ``stage`` writes each beside its target; :meth:`commit` renames them all over their targets
    (unless :data:`interrupted` is set); leaving the ``with`` block by an exception, or without a
    commit, removes what was staged and leaves every target as it was.
    """

    def __init__(self) -> None:
        self._staged: list[tuple[Path, Path]] = []

    def stage(self, path: str | Path, content: str | bytes | None = None) -> Path:
        """Stage ``content`` for ``path``; without content, returns the temporary path to write yourself."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        self._staged.append((tmp, path))
        if isinstance(content, bytes):
            tmp.write_bytes(content)
        elif content is not None:
            tmp.write_text(content if content.endswith("\n") else content + "\n", encoding="utf-8")
        return tmp

    def commit(self) -> list[Path]:
        if interrupted.is_set():
            raise KeyboardInterrupt
        done = []
        for tmp, path in self._staged:
            os.replace(tmp, path)
            done.append(path)
        self._staged.clear()
        return done

    def discard(self) -> None:
        for tmp, _ in self._staged:
            tmp.unlink(missing_ok=True)
        self._staged.clear()

    def __enter__(self) -> StagedFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()
