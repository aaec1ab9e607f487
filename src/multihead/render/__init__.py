"""Renderers: a report, a comparison, a patching run or a few texts' views as terminal text, static
HTML, the interactive page and figures. Renderers take data, never a model (:mod:`multihead.viz`
runs the pass for the views that need one)."""

from typing import TYPE_CHECKING

from ..lazy import lazy_names

__all__ = ["PAGE_DATA_VERSION", "AttentionPage", "analyze_text", "cjk_font", "compare_page", "comparison_text",
           "escape", "head_heatmap", "image_attention_grid", "layer_grid", "model_grid", "page_body", "page_bytes",
           "page_data", "page_html", "patching_page", "patching_table", "patching_text", "prune_text", "report_body",
           "report_html", "report_html_bytes", "report_page", "rollout_grid", "save", "similarity_matrix",
           "static_document", "what_if_text", "write_page"]

if TYPE_CHECKING:  # at run time the names come from __getattr__, each module imported on first use
    from .compare import compare_page
    from .document import report_html, report_html_bytes
    from .figures import (
        cjk_font,
        head_heatmap,
        image_attention_grid,
        layer_grid,
        model_grid,
        rollout_grid,
        save,
        similarity_matrix,
    )
    from .html import escape, report_body, report_page, static_document
    from .page import PAGE_DATA_VERSION, AttentionPage, page_body, page_bytes, page_data, page_html, write_page
    from .patching import patching_page
    from .text import analyze_text, comparison_text, patching_table, patching_text, prune_text, what_if_text

#: Public name -> its module: a command that renders text does not load matplotlib
_NAMES = {
    "compare_page": ".compare",
    **dict.fromkeys(("report_html", "report_html_bytes"), ".document"),
    **dict.fromkeys(("cjk_font", "head_heatmap", "image_attention_grid", "layer_grid", "model_grid", "rollout_grid",
                     "save", "similarity_matrix"), ".figures"),
    **dict.fromkeys(("escape", "report_body", "report_page", "static_document"), ".html"),
    **dict.fromkeys(("PAGE_DATA_VERSION", "AttentionPage", "page_body", "page_bytes", "page_data", "page_html",
                     "write_page"), ".page"),
    "patching_page": ".patching",
    **dict.fromkeys(("analyze_text", "comparison_text", "patching_table", "patching_text", "prune_text",
                     "what_if_text"), ".text"),
}
__getattr__, __dir__ = lazy_names(__name__, _NAMES)
