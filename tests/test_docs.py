"""Every Python block of README.md and docs/*.md runs, as written, in the test suite.

The blocks of one file run in order in one namespace (a later block may use what an earlier one
defined), in a temporary working folder. A block that would take long may say so in an HTML
comment on the line before its fence, with replacements that make its input smaller:

    <!-- test: replace "16384" "2048" -->

The replacement must change the block (a stale one fails), and such files are marked slow only
when they also say ``<!-- test: slow -->``. Blocks of other languages (sh, text) are not run.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
MARK = re.compile(r"<!--\s*test:(.*?)-->")


def python_blocks(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, code, test directives) of each ```python block of ``path``."""
    text = path.read_text(encoding="utf-8")
    blocks = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        directives = [d.strip() for d in MARK.findall(before)]
        blocks.append((line, m.group(1), directives))
    return blocks


def _apply(code: str, directives: list[str], where: str) -> str:
    for d in directives:
        words = shlex.split(d)
        if words[:1] == ["replace"]:
            if len(words) != 3:
                raise ValueError(f"{where}: 'replace' takes two quoted strings; got {d!r}")
            if words[1] not in code:
                raise ValueError(f"{where}: the block no longer contains {words[1]!r}")
            code = code.replace(words[1], words[2])
        elif words != ["slow"]:
            raise ValueError(f"{where}: unknown test directive {d!r}")
    return code


def _cases():
    for path in FILES:
        blocks = python_blocks(path)
        if not blocks:
            continue
        slow = any("slow" in d for _, _, ds in blocks for d in ds)
        yield pytest.param(path, blocks, id=path.name, marks=[pytest.mark.slow] if slow else [])


def test_the_docs_have_python_blocks():
    assert sum(len(python_blocks(p)) for p in FILES) >= 10
    assert python_blocks(ROOT / "README.md"), "README.md shows the library in Python"


@pytest.mark.parametrize(("path", "blocks"), list(_cases()))
def test_every_python_block_runs(path, blocks, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs_{path.stem}"}
    for line, code, directives in blocks:
        where = f"{path.relative_to(ROOT)}:{line}"
        source = _apply(code, directives, where)
        try:
            exec(compile(source, where, "exec"), namespace)
        except Exception as err:
            raise AssertionError(f"the block at {where} failed: {type(err).__name__}: {err}") from err
