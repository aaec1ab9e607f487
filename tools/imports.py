"""The import graph of ``src/multihead``: modules, arrows, cycles, upward arrows and private names.

Counts every import — at module level and inside functions, and a package's lazy names (the
modules its ``_NAMES`` map imports on first use, :mod:`multihead.lazy`) — except those under
``if TYPE_CHECKING:`` (they never run). ``python tools/imports.py`` prints the summary;
``--arrows`` lists every arrow; exit status 1 when there is a cycle, an arrow that points up the
layers of docs/architecture.md, or an import of another module's private name.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "src" / "multihead"

#: The layers, lowest first: a module may import its own layer and the layers below it. A module's
#: layer is the longest prefix of its dotted name (below ``multihead``) listed here.
LAYERS: list[tuple[str, ...]] = [
    ("jsonable", "stops", "progress", "files", "data", "plotting", "compiled", "lazy", "texts", "collector"),
    ("masks",),
    ("attn",),
    ("models",),
    ("hf",),
    ("inputs",),
    ("heads",),
    ("train", "train_config"),
    ("analysis.sections",),
    ("analysis.rollout",),
    ("analysis.stats", "analysis.probes"),
    ("analysis.labels",),
    ("analysis.interventions",),
    ("analysis.report", "analysis.compare"),
    ("analysis.pipelines", "analysis"),
    ("render",),
    ("io",),
    ("viz",),
    ("experiments", "demo"),
    ("jobs",),
    ("cli", "__main__"),
]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer_of(name: str) -> int | None:
    best, found = -1, None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), index
    return found


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def imports_of(path: Path, modules: set[str]) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import of ours in ``path``."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[str, list[str], int]] = []

    def visit(node: ast.AST) -> None:
        if _type_checking(node):
            for child in getattr(node, "orelse", []):
                visit(child)
            return
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and (node.module == "multihead" or node.module.startswith("multihead.")):
                target = node.module.removeprefix("multihead").lstrip(".")
            else:
                target = None
            if target is not None:
                names = [a.name for a in node.names]
                plain = []
                for n in names:  # ``from . import masks``: the submodule itself
                    sub = f"{target}.{n}" if target else n
                    if sub in modules:
                        found.append((sub, [], node.lineno))
                    else:
                        plain.append(n)
                if plain and target in modules:
                    found.append((target, plain, node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("multihead."):
                    found.append((alias.name.removeprefix("multihead."), [], node.lineno))
        elif isinstance(node, ast.Assign) and path.name == "__init__.py" and any(
                isinstance(t, ast.Name) and t.id == "_NAMES" for t in node.targets):
            # a package's lazy names (multihead.lazy, PEP 562): name -> the module it is imported from
            # on first use, relative to the package ("" for a submodule of the same name: no arrow)
            for value in ast.walk(node.value):
                if isinstance(value, ast.Constant) and isinstance(value.value, str) and value.value.startswith("."):
                    level = len(value.value) - len(value.value.lstrip("."))
                    base = package.split(".") if package else []
                    base = base[:len(base) - (level - 1)] if level > 1 else base
                    target = ".".join([*base, *value.value.lstrip(".").split(".")])
                    if target in modules:
                        found.append((target, [], node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def graph() -> tuple[dict[str, set[str]], list[str], list[str]]:
    paths = sorted(ROOT.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    arrows: dict[str, set[str]] = {m: set() for m in modules}
    private: list[str] = []
    for path in paths:
        me = module_name(path)
        for target, names, line in imports_of(path, modules):
            if target == me or target == "":
                continue
            # a package's __init__ re-exports its own modules: no arrow to itself from inside
            if me.startswith(target + ".") and target in modules and _is_package(target):
                pass
            arrows[me].add(target)
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    private.append(f"{me}:{line} takes {n} from {target}")
    return arrows, sorted(modules), private


def _is_package(name: str) -> bool:
    return (ROOT / Path(*name.split(".")) / "__init__.py").exists() if name else True


def cycles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(arrows.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(arrows):
        if v not in index:
            strong(v)
    return out


def upward(arrows: dict[str, set[str]]) -> list[str]:
    bad = []
    for source, targets in sorted(arrows.items()):
        if source == "":  # the package itself, above every layer (its public names: multihead.lazy)
            continue
        ls = layer_of(source)
        for target in sorted(targets):
            lt = layer_of(target)
            if ls is None or lt is None:
                bad.append(f"{source} -> {target}: a module outside the layers")
            elif lt > ls and not (source.startswith(target + ".") or target.startswith(source + ".")):
                bad.append(f"{source} (layer {ls}) -> {target} (layer {lt})")
            elif lt > ls and target.startswith(source + "."):
                pass  # a package's __init__ gathering its own modules
    return bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrows", action="store_true", help="list every arrow")
    args = parser.parse_args()
    arrows, modules, private = graph()
    found = cycles(arrows)
    up = upward(arrows)
    count = sum(len(t) for t in arrows.values())
    if args.arrows:
        for source in sorted(arrows):
            for target in sorted(arrows[source]):
                print(f"{source} -> {target}")
    print(f"{len(modules)} modules, {count} arrows (every import, also inside functions; none under TYPE_CHECKING), "
          f"{len(found)} cycles, {len(up)} upward arrows, {len(private)} private imports")
    for group in found:
        print("cycle: " + " <-> ".join(group))
    for line in up:
        print("upward: " + line)
    for line in private:
        print("private: " + line)
    return 1 if found or up or private else 0


if __name__ == "__main__":
    sys.exit(main())
