"""Renderers: a report, a comparison, a patching run or a few texts' views as terminal text, static
HTML, the interactive page and figures. Renderers take data, never a model (:mod:`multihead.viz`
runs the pass for the views that need one)."""

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

__all__ = ["PAGE_DATA_VERSION", "AttentionPage", "analyze_text", "cjk_font", "compare_page", "comparison_text",
           "escape", "head_heatmap", "image_attention_grid", "layer_grid", "model_grid", "page_body", "page_bytes",
           "page_data", "page_html", "patching_page", "patching_table", "patching_text", "prune_text", "report_body",
           "report_html", "report_html_bytes", "report_page", "rollout_grid", "save", "similarity_matrix",
           "static_document", "what_if_text", "write_page"]
