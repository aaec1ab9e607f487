"""The layers of docs/architecture.md hold: imports only point down, no cycle (counting imports
inside functions too), no module takes another's private names — counted by tools/imports.py."""

import importlib.util
import sys
from pathlib import Path

TOOL = Path(__file__).parent.parent / "tools" / "imports.py"


def _tool():
    spec = importlib.util.spec_from_file_location("imports_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules["imports_tool"] = module
    spec.loader.exec_module(module)
    return module


def test_the_import_graph_has_no_cycle_no_upward_arrow_and_no_private_import():
    tool = _tool()
    arrows, modules, private = tool.graph()
    assert len(modules) > 60 and sum(map(len, arrows.values())) > 200  # it sees the whole package
    assert tool.cycles(arrows) == []
    assert tool.upward(arrows) == []
    assert private == []


def test_the_counter_finds_what_it_must_refuse(tmp_path, monkeypatch):
    """A cycle hidden inside a function, an upward arrow and a private import are each found."""
    tool = _tool()
    package = tmp_path / "multihead"
    (package / "analysis").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "masks.py").write_text("def f():\n    from .render import page  # hidden upward import\n")
    (package / "render.py").write_text("from .masks import f\nfrom .analysis.report import _private\n"
                                       "page = 1\n")
    (package / "analysis" / "__init__.py").write_text("")
    (package / "analysis" / "report.py").write_text("_private = 1\n")
    monkeypatch.setattr(tool, "ROOT", package)
    arrows, _, private = tool.graph()
    assert tool.cycles(arrows) == [["masks", "render"]]
    assert any(line.startswith("masks (layer 1) -> render") for line in tool.upward(arrows))
    assert private == ["render:2 takes _private from analysis.report"]
