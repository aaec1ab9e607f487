"""Views of attention: static figures (matplotlib) of heads, layers, the model and head similarity."""

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
from .maps import attention_maps
from .page import AttentionPage, attention_page
from .rollout import rollout

__all__ = ["AttentionPage", "attention_maps", "attention_page", "cjk_font", "head_heatmap", "image_attention_grid",
           "layer_grid", "model_grid", "rollout", "rollout_grid",
           "save", "similarity_matrix"]
