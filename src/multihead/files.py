"""Writing files so that nothing the user had is lost, whatever stops the write.

* One file: written beside its target and renamed over it (:func:`atomic_path`,
  :func:`write_atomically`), so an interrupted write leaves the earlier file whole.
* Several files that belong together (a report's JSON, CSV and page): :class:`StagedFiles`. Each
  is written beside its target; then, with SIGINT, SIGTERM and SIGHUP held back, a *commit manifest*
  (``.multihead-commit.json``: which staged file replaces which target) is written — the commit
  point — the renames are done and the manifest removed. A kill (even SIGKILL) before the commit
  point leaves every target as it was; after it, the next :func:`recover` of the folder (every
  writer and reader of our folders calls it) finishes the renames. Either way the folder ends all
  old or all new, and the temporary files of killed writers are removed.
* A folder the writer created and could not fill (a full disk) is removed again: no empty or
  partial folder is left behind.
* Scratch space inside a folder the user names (:func:`scratch_folder`: accelerate's offloaded
  weights) is a new folder of this process's own, removed with what it made: a user's files there
  are never written over.
* Output folders are checked before the long work (:func:`check_output_folder`): ours, new or
  empty — anything else only with ``force`` — and really writable (a probe file is written and
  removed: ``/proc`` or a read-only mount fail at the door, not after an hour of analysis).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .jsonable import read_json
from .stops import STOPS, interrupted

__all__ = ["MANIFEST", "OutputFolderError", "StagedFiles", "atomic_path", "check_output_folder", "check_writable",
           "file_system", "recover", "scratch_folder", "stale_scratch", "umask_mode", "write_atomically"]

#: The commit manifest of a folder whose staged files are being renamed over their targets.
MANIFEST = ".multihead-commit.json"
#: Fault injection for the tests of the commit: ``STEP:SIGNAL`` (e.g. ``2:SIGKILL``) makes the
#: committing process send itself SIGNAL at step STEP (1: every file staged; 2: the manifest
#: written; 3, 4, ...: after each rename; then: the manifest removed).
FAULT = "MULTIHEAD_FAULT_AT_COMMIT"
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.tmp$")


def _temp_for(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed over ``path`` when the block ends
    without an exception, removed otherwise (``path`` itself is then untouched)."""
    path = Path(path)
    tmp = _temp_for(path)
    try:
        yield tmp
        umask_mode(tmp)
        os.replace(tmp, path)
    except OSError as err:
        raise _named(err, path) from err
    finally:
        if tmp.exists():
            tmp.unlink()


def write_atomically(path: str | Path, content: str | bytes, *, newline: bool = True) -> Path:
    """Write ``content`` (text as UTF-8, with a final newline unless ``newline=False``) to ``path`` atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        _write(tmp, content, newline)
    return path


def _write(tmp: Path, content: str | bytes, newline: bool = True) -> None:
    data = content if isinstance(content, bytes) else \
        (content if not newline or content.endswith("\n") else content + "\n").encode("utf-8")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def umask_mode(tmp: Path) -> None:
    """Give a written file the mode a new file gets here (0666 less the umask): a library that wrote
    it (safetensors: 0600) leaves it readable to its owner alone, beside our other outputs' 0644."""
    try:
        os.chmod(tmp, 0o666 & ~_umask())
    except OSError:  # a file system without modes (some FUSE or network mounts): the file as written
        pass


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: The umask when this module was imported (one thread then): where /proc does not show the current one.
_IMPORT_UMASK = _read_umask()


def _umask() -> int:
    """The process's umask: read from /proc where Linux shows it (setting it to read it would let
    another thread's file be made under the wrong one), else the one at import."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _IMPORT_UMASK


def _named(err: OSError, path: Path) -> OSError:
    """``err`` with the path it is about (a failed write() names no file: "No space left on device")."""
    if err.filename is not None:
        return err
    return type(err)(err.errno, err.strerror or os.strerror(err.errno or 0), str(path))


class OutputFolderError(ValueError):
    """An output folder that cannot be written safely (not a folder, foreign content, not writable)."""


def check_output_folder(out: str | Path, *, schema: str, marker: str, force: bool = False,
                        also: tuple[str, ...] = ()) -> Path:
    """``out`` as a Path, after checking that writing results there loses nothing of the user's.

    Accepted: a folder that does not exist yet, an empty one, or one holding an earlier result of
    ours (its ``marker`` file, JSON with this ``schema`` or one of the earlier schemas ``also``);
    anything else only with ``force``. The folder (or the first existing one above it) must take a
    file: a probe is written and removed, and a folder made for it is removed again.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputFolderError(f"{out} exists and is not a folder")
    if out.is_dir():
        recover(out)
    if out.is_dir() and _has_content(out) and not force:
        if not _ours(out / marker, (schema, *also)):
            raise OutputFolderError(f"{out} is not empty and holds no earlier multihead {marker}; choose another "
                                    "folder or force writing into it (--force)")
    check_writable(out)
    return out


def _has_content(folder: Path) -> bool:
    return any(not _TEMP.match(p.name) and p.name != MANIFEST for p in folder.iterdir())


def _ours(marker: Path, schemas: tuple[str, ...]) -> bool:
    """Whether ``marker`` is a JSON object of one of ``schemas`` (read with a depth limit: a JSON
    bomb is not ours, and not a RecursionError either)."""
    if not marker.is_file():
        return False
    try:
        data = read_json(marker, "ours")
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("schema") in schemas


#: The kernel's own file systems: a folder there is not storage (and ``/dev``'s takes files in RAM, as root).
KERNEL_FILE_SYSTEMS = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs",
                                 "securityfs", "pstore", "bpf", "configfs", "fusectl", "mqueue", "hugetlbfs",
                                 "binfmt_misc", "efivarfs", "autofs"})


def file_system(path: str | Path) -> tuple[str, str] | None:
    """(mount point, file system type) of the mount holding ``path`` — or the first existing folder
    above it — from ``/proc/self/mounts``; None where the kernel does not say (not Linux)."""
    existing = _nearest_existing(path)
    try:
        lines = Path("/proc/self/mounts").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    best: tuple[str, str] | None = None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = str(existing) == point or str(existing).startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fields[2])
    return best


def _nearest_existing(path: str | Path) -> Path:
    """``path`` made absolute, or its nearest ancestor that exists (one we may not read counts as
    there: what writing into it does is the probe's to say)."""
    existing = Path(os.path.abspath(path))
    while existing != existing.parent:
        try:
            if existing.exists():
                break
        except OSError:  # an ancestor we may not search: exists() raises instead of answering
            break
        existing = existing.parent
    return existing


def check_writable(out: str | Path) -> None:
    """:class:`OutputFolderError` unless ``out`` is on storage (not the kernel's file systems) and
    takes a file: one is written and removed. Where ``out`` does not exist yet, its missing folders
    are made and removed again inside a probe folder of this call's own, beside them — never ``out``
    itself — so processes checking the same new folder at once (torchrun's ranks) cannot remove it
    under each other."""
    out = Path(out)
    mount = file_system(out)
    if mount is not None and mount[1] in KERNEL_FILE_SYSTEMS:
        raise OutputFolderError(f"{out} cannot be written: it is on {mount[0]}, the kernel's {mount[1]} file system, "
                                "not storage; choose a folder on a disk")
    target = Path(os.path.abspath(out))
    probe_root: Path | None = None
    try:
        existing = _nearest_existing(target)
        folder = existing
        if existing != target:  # the missing names, made under a unique folder of ours
            probe_root = Path(tempfile.mkdtemp(prefix=f".multihead-probe.{os.getpid()}.", dir=existing))
            folder = probe_root / target.relative_to(existing)
            folder.mkdir(parents=True)
        handle, probe = tempfile.mkstemp(prefix=".multihead-probe.", suffix=".tmp", dir=folder)
        try:
            os.write(handle, b"multihead")
        finally:
            os.close(handle)
            os.unlink(probe)
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise OutputFolderError(f"{out} cannot be written ({reason}): choose a folder on a writable file system"
                                ) from err
    finally:
        if probe_root is not None:
            shutil.rmtree(probe_root, ignore_errors=True)


def scratch_folder(parent: str | Path, prefix: str) -> tuple[Path, Callable[[], None]]:
    """A new, empty folder of this process's own inside ``parent`` (``parent`` and its missing
    ancestors made), and the call that removes it with everything in it and the ancestors it made
    that are empty then. What is written there can never meet a file the user keeps in ``parent``;
    the call is safe to make twice."""
    target = Path(parent).resolve()  # as the checks saw it: a link's own folder, not a textual "link/.."
    made: list[Path] = []  # deepest first
    missing = target
    while not missing.exists() and missing != missing.parent:
        made.append(missing)
        missing = missing.parent
    target.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=target))

    def remove() -> None:
        shutil.rmtree(scratch, ignore_errors=True)
        for folder in made:
            try:
                folder.rmdir()  # only if empty: another process may have put something there since
            except OSError:
                break

    return scratch, remove


def stale_scratch(parent: str | Path, prefix: str) -> list[Path]:
    """The folders :func:`scratch_folder` made in ``parent`` for processes of this machine that are gone
    (killed before they could remove them: SIGKILL, the kernel's OOM killer). Said, not removed: a
    folder on a shared disk may be another machine's process's of the same number."""
    try:
        found = list(Path(parent).glob(f"{prefix}*-*"))
    except OSError:
        return []
    stale = []
    for folder in found:
        pid = folder.name.removeprefix(prefix).split("-", 1)[0]
        if folder.is_dir() and pid.isascii() and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            stale.append(folder)
    return stale


def recover(folder: str | Path) -> None:
    """Bring ``folder`` back to one state: finish a commit a kill interrupted after its commit point
    (its manifest names what replaces what), and remove the temporary files of writers that are no
    longer running."""
    folder = Path(folder)
    manifest = folder / MANIFEST
    if manifest.is_file():
        try:
            pairs = json.loads(manifest.read_text(encoding="utf-8"))["renames"]
        except (OSError, ValueError, KeyError, TypeError):
            pairs = []
        for tmp_name, target_name in pairs:
            tmp = folder / tmp_name
            if tmp.exists() and _TEMP.match(tmp_name):
                os.replace(tmp, folder / target_name)
        manifest.unlink(missing_ok=True)
    try:
        names = [p for p in folder.iterdir() if _TEMP.match(p.name)]
    except OSError:
        return
    for p in names:
        if not _alive(int(_TEMP.match(p.name)["pid"])) and p.is_file():
            p.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own leftovers from an earlier, failed write
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class StagedFiles:
    """Several files that replace their targets together or not at all (see the module).

    ``stage`` writes each beside its target; :meth:`commit` makes them the targets (unless
    :data:`interrupted` is set); leaving the ``with`` block by an exception, or without a commit,
    removes what was staged — and a folder :meth:`folder` made — and leaves every target as it was.
    """

    def __init__(self) -> None:
        self._staged: list[tuple[Path, Path]] = []
        self._made: list[Path] = []

    def folder(self, path: str | Path) -> Path:
        """``path`` as a folder to stage into: recovered if it exists, made (and removed again if
        nothing is committed) if not."""
        path = Path(path)
        if path.is_dir():
            recover(path)
            return path
        missing = [p for p in (*reversed(path.parents), path) if not p.exists()]
        try:
            for p in missing:
                p.mkdir()
                self._made.append(p)
        except OSError as err:
            raise _named(err, path) from err
        return path

    def stage(self, path: str | Path, content: str | bytes | None = None) -> Path:
        """Stage ``content`` for ``path``; without content, returns the temporary path to write yourself."""
        path = Path(path)
        tmp = _temp_for(path)
        self._staged.append((tmp, path))
        if content is not None:
            try:
                _write(tmp, content)
            except OSError as err:
                raise _named(err, path) from err
        return tmp

    def commit(self) -> list[Path]:
        """Make every staged file its target (see the module); returns the targets."""
        if interrupted.is_set():  # the user asked to stop, even if a library swallowed the KeyboardInterrupt
            raise KeyboardInterrupt
        if not self._staged:
            return []
        _fault(1)
        folders: dict[Path, list[tuple[Path, Path]]] = {}
        for tmp, path in self._staged:
            folders.setdefault(path.parent, []).append((tmp, path))
        with _signals_held():
            for folder, pairs in folders.items():
                manifest = folder / MANIFEST
                with atomic_path(manifest) as tmp_manifest:  # the commit point of this folder
                    _write(tmp_manifest, json.dumps({"renames": [[t.name, p.name] for t, p in pairs]}))
                _fault(2)
                for n, (tmp, path) in enumerate(pairs):
                    umask_mode(tmp)
                    os.replace(tmp, path)
                    _fault(3 + n)
                manifest.unlink()
            _fault(3 + len(self._staged))
        done = [path for _, path in self._staged]
        self._staged.clear()
        self._made.clear()
        return done

    def discard(self) -> None:
        for tmp, _ in self._staged:
            tmp.unlink(missing_ok=True)
        self._staged.clear()
        for folder in reversed(self._made):  # made for this write, and nothing was committed into it
            try:
                folder.rmdir()
            except OSError:
                pass
        self._made.clear()

    def __enter__(self) -> StagedFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()


@contextmanager
def _signals_held() -> Iterator[None]:
    """The stopping signals (SIGINT, SIGTERM, SIGHUP: :data:`~multihead.stops.STOPS`) held back
    while a commit renames: they take effect once it is complete, so an interrupt never stops it
    halfway. Python-level handlers, not a thread's signal mask: the
    kernel may deliver a process signal to any thread (torch's workers), while Python handlers
    always run in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    held = tuple(STOPS)
    previous = {sig: signal.signal(sig, lambda sig, _frame: pending.append(sig)) for sig in held}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(pending):  # each once, in the order they came
            signal.raise_signal(sig)


def _fault(step: int) -> None:
    """The test hook of :data:`FAULT`: send this process the signal named for ``step``."""
    spec = os.environ.get(FAULT)
    if not spec:
        return
    at, _, name = spec.partition(":")
    if at.isdigit() and int(at) == step:
        os.kill(os.getpid(), getattr(signal, name or "SIGKILL"))
