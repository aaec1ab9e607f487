"""A report's one HTML page, whatever the model: the interactive page for text models whose views
were kept, the static page (with each head's attention over the first image) for vision models,
the static page of every stack otherwise."""

from __future__ import annotations

from ..analysis.report import Report
from ..plotting import figure_png
from .figures import image_attention_grid
from .html import report_page
from .page import page_bytes, page_data

__all__ = ["report_html", "report_html_bytes"]


def report_html(report: Report) -> str:
    """The page ``report.html`` of a report folder holds (self-contained; nothing from the network)."""
    return report_html_bytes(report).decode("utf-8")


def report_html_bytes(report: Report) -> bytes:
    """:func:`report_html` as the file's UTF-8 bytes, one final newline — how a report folder
    writes it: a long document's interactive page is encoded piece by piece (:func:`~.page.page_bytes`)."""
    views = report.views
    if report.sections.images is not None and views and views[0].maps is not None:
        image = views[0].extra.get("image")
        if image is not None:
            figure = image_attention_grid(image, views[0].maps, report)
            return _lines(report_page(report, [("where [CLS] looks in each head, over the first image",
                                                figure_png(figure, dpi=100))]))
    if views and not report.stacks:
        data = page_data(views, report)
        data.setdefault("model", report.model)
        return page_bytes(data)  # ends in one newline
    return _lines(report_page(report))


def _lines(page: str) -> bytes:
    return (page.rstrip("\n") + "\n").encode("utf-8")
