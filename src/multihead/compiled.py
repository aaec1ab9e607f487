"""C sources of ours compiled for this CPU at first use, cached, and loaded through ctypes.

Two layers use it: the attention kernel's compiled softmax (``attn/softmax.c``) and the
analysis's row readers (``analysis/stats/native.c``). Each is compiled with the machine's C
compiler (``$CC``, else ``gcc``) and ``-march=native`` into the user's cache
(``$XDG_CACHE_HOME/multihead/native``), keyed by the source, the flags, the compiler and the CPU's
features — a home directory shared by machines of different CPUs builds one library per CPU —
built aside and renamed into place whole, so a process reading the cache never sees half a file.
ctypes lets go of the GIL for the call. ``MULTIHEAD_NATIVE=0`` turns every compiled path off (the
eager PyTorch code, which the tests hold them to, runs everywhere then).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["ENV", "build", "compiler", "enabled"]

#: ``MULTIHEAD_NATIVE=0`` keeps every compiled path off (the eager reference everywhere).
ENV = "MULTIHEAD_NATIVE"


def enabled() -> bool:
    """Whether compiled paths may be used at all (:data:`ENV` is not ``0``)."""
    return os.environ.get(ENV, "1") != "0"


def compiler() -> str | None:
    """The C compiler's path (``$CC``, else ``gcc``), or None where there is none."""
    return shutil.which(os.environ.get("CC") or "gcc")


def build(source: Path, name: str, flags: tuple[str, ...], link: tuple[str, ...]) -> ctypes.CDLL | None:
    """``source`` compiled with ``flags`` (``-c`` among them), linked with ``link``, cached as
    ``name-<key>.so``, and loaded — or None: no compiler, a failed build or a failed load."""
    cc = compiler()
    if cc is None or not source.is_file():
        return None
    key = hashlib.sha256(b"\0".join([source.read_bytes(), " ".join(flags + link).encode(), cc.encode(),
                                     _cpu_features().encode()])).hexdigest()[:20]
    path = _cache() / f"{name}-{key}.so"
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=path.parent) as tmp:  # built aside, renamed into place whole
                built, objects = Path(tmp) / path.name, Path(tmp) / f"{name}.o"
                subprocess.run([cc, *flags, "-o", str(objects), str(source)], check=True, capture_output=True,
                               timeout=120)
                subprocess.run([cc, *link, "-o", str(built), str(objects), "-lm"], check=True, capture_output=True,
                               timeout=120)
                os.replace(built, path)
        except (OSError, subprocess.SubprocessError):
            return None
    try:
        return ctypes.CDLL(str(path))
    except OSError:  # e.g. an OpenMP runtime that lacks a symbol version the compiler asked for
        return None


def _cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "multihead" / "native"


def _cpu_features() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.machine()
