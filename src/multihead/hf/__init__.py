"""Everything that touches Hugging Face ``transformers``: local model folders, named attention sites,
the one routed attention call, capture and interventions at those sites, and adapters.

``transformers`` is imported lazily, so ``import multihead`` works without it; so is every name
here (imported on first use), so that a light module of the package (``paths``, ``placement``)
loads no torch: the command line checks a model's folder and placement before it does.
"""

from typing import TYPE_CHECKING

from ..lazy import lazy_names

__all__ = ["KNOWN_MODELS", "Attachment", "AttentionCapture", "AttentionChunk", "AttentionSite", "BertAttentionAdapter",
           "HFModel", "HeadGates", "ModelLike", "Placement", "PlacementError", "UnsupportedModelError", "as_module",
           "attach", "attention_from_bert", "find_sites", "load", "model_path", "replace_attention", "select",
           "site_names", "swap_bert_attention", "wrap"]

if TYPE_CHECKING:  # at run time the names come from __getattr__
    from .bert import BertAttentionAdapter, attention_from_bert, swap_bert_attention
    from .capture import AttentionCapture
    from .interventions import HeadGates, replace_attention
    from .load import load, wrap
    from .model import HFModel, ModelLike, as_module
    from .paths import KNOWN_MODELS, model_path
    from .placement import Placement, PlacementError
    from .route import Attachment, AttentionChunk, attach
    from .sites import AttentionSite, UnsupportedModelError, find_sites, select, site_names

_NAMES = {
    **dict.fromkeys(("BertAttentionAdapter", "attention_from_bert", "swap_bert_attention"), ".bert"),
    "AttentionCapture": ".capture",
    **dict.fromkeys(("HeadGates", "replace_attention"), ".interventions"),
    **dict.fromkeys(("load", "wrap"), ".load"),
    **dict.fromkeys(("HFModel", "ModelLike", "as_module"), ".model"),
    **dict.fromkeys(("KNOWN_MODELS", "model_path"), ".paths"),
    **dict.fromkeys(("Placement", "PlacementError"), ".placement"),
    **dict.fromkeys(("Attachment", "AttentionChunk", "attach"), ".route"),
    **dict.fromkeys(("AttentionSite", "UnsupportedModelError", "find_sites", "select", "site_names"), ".sites"),
}
__getattr__, __dir__ = lazy_names(__name__, _NAMES)
