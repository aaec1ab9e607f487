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
                        texts: Sequence = (), force: bool = False) -> list[Path]:
    """Write the report's JSON, CSV and page into ``out``; all three replace earlier ones together.

    With ``model``, the page is the interactive one for a few of ``texts`` (the articles' example
    sentences first); without (or for an encoder-decoder model), the static page of the label
    map, tables and probes of every stack. A vision model's ``texts`` are images: the static page
    then also shows every head's attention over the first of them.
    """
    folder = check_report_folder(out, force=force)
    if model is not None and texts and not model.is_encoder_decoder and model.processor is None:  # one text stack
        from ..data import ARTICLE_SENTENCES
        from ..viz.page import view_page

        shown = [t for t in texts if t in ARTICLE_SENTENCES][:PAGE_TEXTS] or list(texts)[:PAGE_TEXTS - 1]
        page = view_page(model, shown, report)
    elif model is not None and model.processor is not None and len(texts):
        page = _vision_page(report, model, texts[0])
    else:
        page = report.to_html()
    folder.mkdir(parents=True, exist_ok=True)
    with StagedFiles() as staged:
        staged.stage(folder / "report.json", report.to_json())
        report.to_csv(staged.stage(folder / "report.csv"))
        staged.stage(folder / "report.html", page.rstrip("\n"))
        return staged.commit()


def _vision_page(report: Report, model: HFModel, image) -> str:
    from ..plotting import figure_png
    from ..viz.figures import image_attention_grid
    from .html import report_page
    from .vision import image_maps

    figure = image_attention_grid(image, image_maps(model, image), report)
    return report_page(report, [("where [CLS] looks in each head, over the first image", figure_png(figure, dpi=100))])
