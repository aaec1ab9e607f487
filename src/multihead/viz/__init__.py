"""Views of a real model's attention in one call: run the pass (:mod:`multihead.analysis.pipelines.views`)
and draw it (:mod:`multihead.render`) — the page for a few texts, the maps, rollout — plus the
static figures, which take tensors.

``mh.viz.attention_page(model, texts, report)`` is the page object (shown inline in Jupyter,
``.save(path)``); ``mh.viz.attention_maps(model, text)`` the (L, H, T, T) maps for the figures.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..analysis.pipelines.views import Rollout, attention_maps, rollout, text_views
from ..analysis.report import Report
from ..hf.model import HFModel
from ..render import (
    AttentionPage,
    cjk_font,
    head_heatmap,
    image_attention_grid,
    layer_grid,
    model_grid,
    page_data,
    rollout_grid,
    save,
    similarity_matrix,
)

__all__ = ["AttentionPage", "Rollout", "attention_maps", "attention_page", "cjk_font", "head_heatmap",
           "image_attention_grid", "layer_grid", "model_grid", "rollout", "rollout_grid", "save",
           "similarity_matrix", "view_page"]


def attention_page(model: HFModel, texts: Sequence[str], report: Report | None = None) -> AttentionPage:
    """The page object for a few texts of a real model (a text of more than 512 tokens is kept
    pooled; display it in Jupyter, or ``.save(path)``)."""
    data = page_data(text_views(model, texts), report, model.num_layers, model.num_heads)
    data.setdefault("model", model.name)
    # what these maps are of, beside a report's own run (its texts, its precision): the page says both
    data["shown"] = {"texts": len(data["sentences"]), "tokens": sum(len(s["tokens"]) for s in data["sentences"]),
                     "placement": model.placement}
    return AttentionPage(data)


def view_page(model: HFModel, texts: Sequence[str], report: Report | None = None) -> str:
    """A page for a few texts of a real model (optionally with its corpus report), as HTML."""
    return attention_page(model, texts, report).html()
