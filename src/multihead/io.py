"""Result folders, written so that nothing the user had is lost.

* a report folder: ``report.json``, ``report.csv`` and ``report.html``, written together;
* a patching folder: ``patching.json`` and ``patching.html``;
* a comparison folder: ``compare.json`` and ``compare.html``.

Each folder is checked before the long work (:func:`check_report_folder`: new, empty, or an earlier
result of the same kind; anything else only with ``force``) and its files replace the earlier ones
together, whatever stops the write — a full disk, Ctrl-C, SIGTERM, even SIGKILL: the folder is
then all old or, once the next writer or reader has recovered it, all new
(:class:`~multihead.files.StagedFiles`). Callable from Python::

    folder = mh.io.check_report_folder("out")          # before the long run: refuses foreign folders
    report = mh.analyze(model, texts)
    mh.io.write_report_folder(report, folder)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from .analysis.compare import SCHEMA as COMPARE_SCHEMA
from .analysis.compare import Comparison
from .analysis.report import SCHEMA, Report
from .files import StagedFiles, check_output_folder
from .render.compare import compare_page

if TYPE_CHECKING:
    from .analysis.interventions.patching import Patching

__all__ = ["REPORT_FILES", "check_compare_folder", "check_patching_folder", "check_report_folder",
           "write_compare_folder", "write_patching_folder", "write_report_folder"]

REPORT_FILES = ("report.json", "report.csv", "report.html")


def check_report_folder(out: str | Path, *, force: bool = False) -> Path:
    """``out`` as a Path if a report may be written there: new, empty, or an earlier report's folder
    (anything else only with ``force``). Raises :class:`~multihead.files.OutputFolderError`."""
    return check_output_folder(out, schema=SCHEMA, marker="report.json", force=force,
                               also=("multihead.report/1",))


def write_report_folder(report: Report, out: str | Path, *, force: bool = False) -> list[Path]:
    """Write the report's JSON, CSV and page into ``out``; all three replace earlier ones together.

    The page is the interactive one when the analysis kept views of a few texts
    (``report.views``), else the static page of the label map, tables and probes of every stack (a
    vision model's with every head's attention over its first image)."""
    from .render.document import report_html_bytes  # the page's figures: torch and matplotlib, when written

    folder = check_report_folder(out, force=force)
    page = report_html_bytes(report)
    with StagedFiles() as staged:
        staged.folder(folder)
        staged.stage(folder / "report.json", report.to_json())
        report.to_csv(staged.stage(folder / "report.csv"))
        staged.stage(folder / "report.html", page)
        return staged.commit()


def check_patching_folder(out: str | Path, *, force: bool = False) -> Path:
    # patching's module loads torch: asked here, when patching is what runs (the other folders are
    # checked without it)
    from .analysis.interventions.patching import SCHEMA as PATCHING_SCHEMA

    return check_output_folder(out, schema=PATCHING_SCHEMA, marker="patching.json", force=force)


def write_patching_folder(result: Patching, out: str | Path, *, model: str, force: bool = False,
                          placement: str | None = None) -> list[Path]:
    """Write ``patching.json`` and ``patching.html`` into ``out`` together (an earlier patching
    folder is replaced; any other non-empty folder only with ``force``); ``placement``: where and in
    what precision the model ran ("bfloat16 on cpu + disk (device map)"), recorded as a report's is."""
    from .render.patching import patching_page  # its figures: matplotlib, when written

    folder = check_patching_folder(out, force=force)
    with StagedFiles() as staged:
        staged.folder(folder)
        where = {"placement": placement} if placement else {}
        staged.stage(folder / "patching.json", json.dumps({**result.to_dict(), "model": model, **where}, indent=1))
        staged.stage(folder / "patching.html", patching_page(result, model).rstrip("\n"))
        return staged.commit()


def check_compare_folder(out: str | Path, *, force: bool = False) -> Path:
    return check_output_folder(out, schema=COMPARE_SCHEMA, marker="compare.json", force=force)


def write_compare_folder(comparison: Comparison, out: str | Path, *, force: bool = False) -> list[Path]:
    """Write ``compare.json`` and ``compare.html`` into ``out`` together."""
    folder = check_compare_folder(out, force=force)
    with StagedFiles() as staged:
        staged.folder(folder)
        staged.stage(folder / "compare.json", json.dumps(comparison.to_dict(), indent=1, ensure_ascii=False))
        staged.stage(folder / "compare.html", compare_page(comparison).rstrip("\n"))
        return staged.commit()
