"""The page's JavaScript, as files of their own: pure modules (decoding, colours, labels, zoom
arithmetic, the similarity's order) that Node's test runner tests, and ``page.js``, the views. All
are ES modules, linted with ESLint. :func:`page_script` joins them into the one inline script a page
carries: each module's ``import`` lines dropped and ``export`` words removed, in dependency order,
inside one closure per page instance."""

from __future__ import annotations

import re
from importlib.resources import files

__all__ = ["MODULES", "page_script"]

#: The page's modules, in the order the script defines them (each imports only those before it).
MODULES = ("scales.js", "decode.js", "labels.js", "zoom.js", "layout.js", "dom.js", "canvas.js", "view-head.js",
           "view-model.js", "view-matrix.js", "view-detail.js", "view-rollout.js", "view-similarity.js",
           "view-table.js", "view-overview.js", "exports.js", "page.js")

_IMPORT = re.compile(r'^import \{[^}]*\} from "\./([a-z-]+\.js)";\n', re.MULTILINE)
_EXPORT = re.compile(r"^export ", re.MULTILINE)


def module_text(name: str) -> str:
    """One module as the page carries it: its imports checked and dropped, its exports plain names."""
    text = files("multihead.render.js").joinpath(name).read_text(encoding="utf-8")
    before = MODULES[:MODULES.index(name)]
    for imported in _IMPORT.findall(text):
        if imported not in before:
            raise ValueError(f"render/js/{name} imports {imported}, which the page script does not define before it")
    if re.search(r"^import ", _IMPORT.sub("", text), re.MULTILINE):
        raise ValueError(f"render/js/{name} has an import the page script cannot join (one line, named imports only)")
    return _EXPORT.sub("", _IMPORT.sub("", text))


def page_script(root: str) -> str:
    """The page's script for the container with id ``root``: every module in one closure."""
    body = "\n".join(module_text(name) for name in MODULES)
    return '(function () {\n"use strict";\n' + body.replace("__ROOT_ID__", root) + "\n})();"
