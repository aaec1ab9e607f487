"""A report folder: ``report.json``, ``report.csv`` and ``report.html``, written together.

What ``multihead analyze --out DIR`` does to its folder, callable from Python::

    folder = mh.analysis.check_report_folder("out")          # before the long run: refuses foreign folders
    report = mh.analyze(model, texts)
    mh.analysis.write_report_folder(report, folder, model=model, texts=texts)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..files import StagedFiles, check_output_folder
from ..hf.load import HFModel
from .report import SCHEMA, Report

__all__ = ["REPORT_FILES", "check_report_folder", "write_report_folder"]

REPORT_FILES = ("report.json", "report.csv", "report.html")
#: How many texts the interactive page shows (it holds their per-head maps).
PAGE_TEXTS = 4


def check_report_folder(out: str | Path, *, force: bool = False) -> Path:
    """``out`` as a Path if a report may be written there: new, empty, or an earlier report's folder
    (anything else only with ``force``). Raises :class:`~multihead.files.OutputFolderError`."""
    return check_output_folder(out, schema=SCHEMA, marker="report.json", force=force)


def write_report_folder(report: Report, out: str | Path, *, model: HFModel | None = None,
                        texts: Sequence[str] = (), force: bool = False) -> list[Path]:
    """Write the report's JSON, CSV and page into ``out``; all three replace earlier ones together.

    With ``model``, the page is the interactive one for a few of ``texts`` (the articles' example
    sentences first); without (or for an encoder-decoder model), the static page of the label
    map, tables and probes of every stack.
    """
    folder = check_report_folder(out, force=force)
    if model is not None and not model.is_encoder_decoder and model.processor is None:  # one stack of text
        from ..data import ARTICLE_SENTENCES
        from ..viz.page import view_page

        shown = [t for t in texts if t in ARTICLE_SENTENCES][:PAGE_TEXTS] or list(texts)[:PAGE_TEXTS - 1]
        page = view_page(model, shown, report)
    else:
        page = report.to_html()
    folder.mkdir(parents=True, exist_ok=True)
    with StagedFiles() as staged:
        staged.stage(folder / "report.json", report.to_json())
        report.to_csv(staged.stage(folder / "report.csv"))
        staged.stage(folder / "report.html", page.rstrip("\n"))
        return staged.commit()
