"""A package's public names imported on first use (PEP 562), so that importing the package — or a
light module inside it — loads nothing heavy: the command line answers a bad argument before torch
loads, and ``import multihead`` stays light."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``names`` maps each public name to the module
    that defines it, relative to the package ("" when the name is a submodule itself); any other
    submodule is imported when asked for by name, as an eager ``__init__`` would have made it an
    attribute. A name, once found, is kept in the package (later lookups skip ``__getattr__``).

    A public name that is also a submodule's (``analysis.compare``, the function, beside the module
    ``analysis/compare.py``) stays the name: the import system's binding of the module to the
    package, as it loads it, is let go (an eager ``__init__`` rebound it by its ``from`` import)."""
    module = sys.modules[package]

    class Package(types.ModuleType):
        def __setattr__(self, name: str, value: Any) -> None:
            if names.get(name) and isinstance(value, types.ModuleType) and value.__name__ == f"{package}.{name}":
                return
            super().__setattr__(name, value)

    module.__class__ = Package

    def getattr_(name: str) -> Any:
        where = names.get(name)
        if where is None:
            if name.startswith("__") or not name.isidentifier() or not _submodule(f"{package}.{name}"):
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            where = ""
        value = importlib.import_module(f".{name}" if where == "" else where, package)
        if where:
            value = getattr(value, name)
        setattr(module, name, value)
        return value

    def dir_() -> list[str]:
        return sorted(set(vars(module)) | set(names))

    return getattr_, dir_


def _submodule(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
